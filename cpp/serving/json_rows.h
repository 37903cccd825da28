// Float rows as JSON arrays' text, for the server's responses.
#pragma once

#include <cstdint>
#include <string>

namespace ftbert::serving {

// Appends "[x0,x1,...]": each value the shortest text that reads back as the same float32
// (std::to_chars), -0.0 with its sign. InputError for NaN or infinity (JSON has no form for them).
void append_json_row(const float* row, int64_t n, std::string& out);  // row: [n]

}  // namespace ftbert::serving
