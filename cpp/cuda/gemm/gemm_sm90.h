// The FFN-in GEMM with its bias and erf-GELU in the epilogue, for Hopper (sm_90a), and the same
// GEMM plain for few rows (gemm_sm90_tiled below):
// c = gelu(a · w + bias) as one kernel, CUTLASS's TMA warp-specialized GEMM with the bias and the
// activation applied to the fp32 accumulators before the single rounding to T. cuBLASLt has bias
// epilogues, but its GELU is the tanh approximation (4.8e-4 from erf-GELU), and BERT-family
// checkpoints say erf. Built only when the CUDA architectures include 90 and the CUTLASS headers
// are found (FTBERT_GEMM_SM90).
#pragma once

#include <cuda_runtime.h>

namespace ftbert::cuda {

// The kernel's tiling (gemm_sm90.cuh): 64 x 64 tiles for few rows, 128 x 256 in clusters of 2
// for many (the fixed rule below); 128 x 128 ping-pong tiles, one of the candidates the measured
// choice times (gemm_tuner.h).
enum class GemmTiles { k64x64, k128x256, k128x128Pingpong };

// Where the fused kernel runs. Kernel times on an H100, BERT-base FFN-in (3072 x 768, float16,
// us, profiler), fused against cuBLAS + add_bias_activation:
//   rows                128   256   512  1024  2048  4096  16384
//   fused, 64 x 64      4.4   8.0
//   fused, 128 x 256                14.1  14.6  26.7  39.0  144.7
//   cuBLAS + op         6.2   7.5   9.8  14.8  25.7  47.2  182.8
// so 64 x 64 tiles up to 128 rows, 128 x 256 from 4,096, and the two kernels in between.
constexpr int kGemmSmallTileMaxRows = 128;
constexpr int kGemmLargeTileMinRows = 4096;

// c [m, n] (row stride n) = gelu_erf(a [m, k] (row stride k) · w [k, n] (row stride n) + bias [n]),
// in one tiling. T is __half or __nv_bfloat16; one translation unit per (T, kTiles). Returns
// false, enqueuing nothing, when the kernel cannot take the shape (TMA needs 16-byte aligned
// rows: k and n multiples of 8, and aligned pointers).
// `sm_count` is the device's multiprocessor count (the persistent kernel sizes its grid to it).
template <typename T, GemmTiles kTiles>
bool gemm_bias_gelu_sm90_tiled(int m, int n, int k, const T* a, const T* w, const T* bias, T* c,
                               int sm_count, cudaStream_t stream);

// c [m, n] = a [m, k] · w [k, n], nothing else: the same kernel without the epilogue's bias and
// activation, built in 64 x 64 tiles only, for the weight GEMMs without a bias (BERT's QKV) of up
// to kGemmPlainMaxRows rows. Launched programmatically like ftbert's own kernels, it is scheduled
// while the LayerNorm before it finishes, and lets the attention after it be scheduled early,
// which cuBLAS's kernels do not. That pays up to kGemmPlainMaxRows rows and loses beyond, hence
// the bound (docs/performance.md, "Kernel choices";
// benchmarks/results/gemm-variants-rows128-h100.txt).
template <typename T, GemmTiles kTiles>
bool gemm_sm90_tiled(int m, int n, int k, const T* a, const T* w, T* c, int sm_count,
                     cudaStream_t stream);
constexpr int kGemmPlainMaxRows = 128;

// Whether the plain kernel runs a weight GEMM of this shape without a bias (TMA needs 16-byte
// rows: k and n multiples of 8; the pointers are checked when it runs).
inline bool gemm_sm90_plain_pays(int m, int n, int k) {
  return m >= 1 && m <= kGemmPlainMaxRows && n % 8 == 0 && k % 8 == 0;
}

// Whether the fused kernel is the faster way for m rows (else cuBLAS + add_bias_activation).
inline bool gemm_bias_gelu_sm90_pays(int m) {
  return (m >= 1 && m <= kGemmSmallTileMaxRows) || m >= kGemmLargeTileMinRows;
}

// c = gelu_erf(a · w + bias) as above, in the tiling that suits m; false, enqueuing nothing,
// also where the fused kernel does not pay.
template <typename T>
bool gemm_bias_gelu_sm90(int m, int n, int k, const T* a, const T* w, const T* bias, T* c,
                         int sm_count, cudaStream_t stream) {
  if (!gemm_bias_gelu_sm90_pays(m)) return false;
  if (m <= kGemmSmallTileMaxRows) {
    return gemm_bias_gelu_sm90_tiled<T, GemmTiles::k64x64>(m, n, k, a, w, bias, c, sm_count,
                                                           stream);
  }
  return gemm_bias_gelu_sm90_tiled<T, GemmTiles::k128x256>(m, n, k, a, w, bias, c, sm_count,
                                                           stream);
}

}  // namespace ftbert::cuda
