// Host-side conversion between float32 and the 16-bit storage types (round to nearest even), used
// when weights are uploaded in the compute dtype and by the op-level test binding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ftbert/dtype.h"

namespace ftbert {

uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t b);

// dst[i] = src[i] converted from `src_dt` to `dst_dt` (any pair of the three dtypes).
void convert_host(const void* src, DType src_dt, void* dst, DType dst_dt, size_t n);

}  // namespace ftbert
