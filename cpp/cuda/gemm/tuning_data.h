// The data the GEMM tuner times and checks candidates on (weight_gemm.cu), shared by the 16-bit
// and the FP8 (fp8_gemm.cu) measurements.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ftbert/dtype.h"

namespace ftbert::cuda {

// Batch-invariant shapes' candidates are checked against the reference on this many rows at
// least: two orders of fp32 sums round to different 16-bit outputs in only about one output in
// 10^4, which a few rows would miss.
constexpr int kInvariantCheckedRows = 4096;

#ifdef __CUDACC__
// A value uniform in [-1, 1), a hash of index i and the seed: the tuner's data, in any dtype.
__device__ __forceinline__ float hashed_uniform(size_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}
#endif

// p [n] (float16 or bfloat16) = uniform values in [-scale, scale), a hash of the index and seed:
// a model's magnitudes (LayerNorm outputs ~1, weights ~0.05), since a GEMM's power draw and so
// its clock under the power cap depend on the bits it multiplies.
void fill_uniform(DType dt, void* p, size_t n, uint32_t seed, float scale, cudaStream_t stream);

// Adds to *differing the number of 16-bit elements in which a [n] and b [n] differ.
void count_differing_bits(const void* a, const void* b, size_t n, int* differing,
                          cudaStream_t stream);

}  // namespace ftbert::cuda
