// float32 <-> float16 / bfloat16 on the host, bit-exact with the usual round-to-nearest-even.
#include "ftbert/host_convert.h"

#include <cstring>
#include <vector>

namespace ftbert {

namespace {
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

uint16_t float_to_half_bits(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): scale into place, round by the FPU
    const float scaled = float_of(abs) * 16777216.0f;  // 2^24: one unit = one half subnormal ulp
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // normal: rebias exponent 127 -> 15, round the 13 dropped mantissa bits to nearest even
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t dropped = abs & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (man << 13));
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float bf16_bits_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

void convert_host(const void* src, DType src_dt, void* dst, DType dst_dt, size_t n) {
  if (src_dt == dst_dt) {
    std::memcpy(dst, src, n * dtype_size(src_dt));
    return;
  }
  // Through float32: exact for the 16-bit sources, one rounding for the 16-bit destinations.
  std::vector<float> tmp;
  const float* f32 = nullptr;
  if (src_dt == DType::kFloat32) {
    f32 = static_cast<const float*>(src);
  } else {
    tmp.resize(n);
    const auto* s = static_cast<const uint16_t*>(src);
    for (size_t i = 0; i < n; ++i)
      tmp[i] = src_dt == DType::kFloat16 ? half_bits_to_float(s[i]) : bf16_bits_to_float(s[i]);
    f32 = tmp.data();
  }
  if (dst_dt == DType::kFloat32) {
    std::memcpy(dst, f32, n * 4);
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i)
    d[i] = dst_dt == DType::kFloat16 ? float_to_half_bits(f32[i]) : float_to_bf16_bits(f32[i]);
}

}  // namespace ftbert
