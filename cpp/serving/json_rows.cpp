#include "serving/json_rows.h"

#include <charconv>
#include <cmath>

#include "ftbert/check.h"

namespace ftbert::serving {

void append_json_row(const float* row, int64_t n, std::string& out) {
  char number[32];
  out.push_back('[');
  for (int64_t j = 0; j < n; ++j) {
    const float x = row[j];
    if (!std::isfinite(x)) throw InputError("Out of range float values are not JSON compliant");
    if (j > 0) out.push_back(',');
    if (x == 0.0f && std::signbit(x)) {
      out += "-0.0";  // "-0" reads back as the integer 0 (Python's json): the sign would be lost
      continue;
    }
    out.append(number, std::to_chars(number, number + sizeof number, x).ptr);
  }
  out.push_back(']');
}

}  // namespace ftbert::serving
