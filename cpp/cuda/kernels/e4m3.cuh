// A weight GEMM's input rows in e4m3 (quantization "fp8", gemm/fp8_gemm.cu): each row scaled so
// that its largest magnitude becomes 448 (e4m3's largest finite value), t = top / 448 kept as the
// row's float32 scale. One definition for the pass that quantizes a row on its own
// (invoke_quantize_rows_e4m3) and the LayerNorms that write the codes beside their output, so
// that both give the same bits.
#pragma once

#include <cuda_fp8.h>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {

constexpr float kE4m3Max = 448.0f;

// What multiplies a row whose largest magnitude is `top` (a zero row: 1, its codes zeros).
__device__ __forceinline__ float e4m3_row_multiplier(float top) {
  return top > 0.0f ? kE4m3Max / top : 1.0f;
}
// ... and the row's scale, by which the GEMM multiplies its products back.
__device__ __forceinline__ float e4m3_row_scale(float top) {
  return top > 0.0f ? top / kE4m3Max : 1.0f;
}

// The largest |x| of VEC stored values, folded into `top`.
template <typename T, int VEC>
__device__ __forceinline__ void e4m3_fold_top(const Vec<T, VEC>& v, float& top) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) top = fmaxf(top, fabsf(to_float(v.v[i])));
}

// VEC (even) stored values as e4m3 codes at `out` (VEC bytes, aligned to them).
template <typename T, int VEC>
__device__ __forceinline__ void e4m3_store(const Vec<T, VEC>& v, float multiplier,
                                           unsigned char* out) {
  static_assert(VEC % 2 == 0, "codes are converted in pairs");
  Vec<__nv_fp8x2_storage_t, VEC / 2> packed;
#pragma unroll
  for (int i = 0; i < VEC / 2; ++i) {
    const float2 pair = make_float2(to_float(v.v[2 * i]) * multiplier,
                                    to_float(v.v[2 * i + 1]) * multiplier);
    packed.v[i] = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
  }
  store_vec<VEC / 2>(reinterpret_cast<__nv_fp8x2_storage_t*>(out), packed);
}

}  // namespace ftbert::cuda
