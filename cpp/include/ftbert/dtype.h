// Element types the engine computes in, and their sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ftbert {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline size_t dtype_size(DType dt) { return dt == DType::kFloat32 ? 4 : 2; }

inline const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

}  // namespace ftbert
