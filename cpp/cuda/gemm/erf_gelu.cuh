// erf-GELU, x Φ(x), in as few FP32 instructions as its accuracy allows: the activation of the
// Hopper FFN-in GEMM's epilogue (gemm_sm90.cuh), in a header of its own so that the kernel
// harnesses run the very same function (benchmarks/kernels/wgmma_overlap.cu).
#pragma once

#include <cuda_runtime.h>

namespace ftbert::cuda {

// Why so few: at BERT-base's FFN-in the epilogue's arithmetic is what the activation costs, and
// the other warpgroup's MMAs do not hide it: each FP32 FMA issued beside wgmma costs the tensor
// cores about a cycle, while integer, MUFU, HFMA2 and min/max instructions cost them nothing
// (benchmarks/kernels/wgmma_overlap.cu). So what pays here is fewer FMAs (docs/performance.md,
// "Kernel choices").
// With a = |x|: GELU(x) = max(x, 0) - a Φ(-a), and Φ(-a) = 2^P(a), P a degree-7 polynomial
// fitted to log2 Φ(-a) on [0, 6] whose leading coefficient is negative, so it keeps falling past
// the fit (P(8) = -50.52 against -50.51; P(16) = -235, which ex2 flushes to 0) down to -inf:
// 7 FMAs, one ex2, a max and one FMA (a's |.| is an operand modifier). Relative error below 5e-6
// wherever |GELU(x)| > 1e-6 (an fp32 simulation over [-12, 12]), so the negative tail keeps its
// relative precision as the CPU's does. Non-finite in, non-finite out: NaN and ±inf give NaN
// (a Φ(-a) is NaN there), which the output's non-finite check sees.
__device__ __forceinline__ float erf_gelu(float x) {
  const float a = fabsf(x);
  float p = -1.8348245021115872e-06f;
  p = fmaf(p, a, 6.159854819998145e-05f);
  p = fmaf(p, a, -0.0009305267594754696f);
  p = fmaf(p, a, 0.008507898077368736f);
  p = fmaf(p, a, -0.053960081189870834f);
  p = fmaf(p, a, -0.4584643840789795f);
  p = fmaf(p, a, -1.1512510776519775f);
  p = fmaf(p, a, -0.9999952912330627f);
  float phi_neg;  // Φ(-a); ex2.approx: relative error ~2^-22
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(phi_neg) : "f"(p));
  const float relu = fmaxf(x, 0.0f);
  return fmaf(-a, phi_neg, relu);
}

}  // namespace ftbert::cuda
