// The CUTLASS GEMM configurations gemm_variants.cu compares (cpp/cuda/gemm/gemm_sm90.cuh builds
// them). Each (configuration, epilogue) is one translation unit, gemm_variant.cu compiled with
// -DFTBERT_VARIANT=<index> -DFTBERT_EPILOGUE=<0 plain | 1 bias + erf-GELU | 2 erf-GELU alone,
// for the configurations gelu_alone_built names>, so they build in
// parallel; gemm_variants.cu holds the reference, the cuBLAS / cuBLASLt peers and the timing.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace ftbert::bench {

// X(index, name, tile M, tile N, cluster M, cluster N, schedule): schedule is Coop (two consumer
// warpgroups share a tile) or Pingpong (each consumer warpgroup owns a tile; one's epilogue runs
// while the other's MMAs do).
#define FTBERT_GEMM_VARIANTS(X)                          \
  X(0, "coop 128x256 c2x1", 128, 256, 2, 1, Coop)        \
  X(1, "coop 256x128 c1x2", 256, 128, 1, 2, Coop)        \
  X(2, "coop 256x128 c2x1", 256, 128, 2, 1, Coop)        \
  X(3, "coop 128x128 c2x1", 128, 128, 2, 1, Coop)        \
  X(4, "pingpong 128x128 c2x1", 128, 128, 2, 1, Pingpong) \
  X(5, "pingpong 128x128 c1x2", 128, 128, 1, 2, Pingpong) \
  X(6, "pingpong 64x256 c2x1", 64, 256, 2, 1, Pingpong)

constexpr int kGemmVariants = 7;

// The configurations also built with epilogue 2 (erf-GELU without the bias, to see what the
// bias costs).
constexpr bool gelu_alone_built(int variant) { return variant == 0 || variant == 4 || variant == 5; }

// c [m, n] = epilogue(a [m, k] · w [k, n] (+ bias [n])), row-major; false when the configuration
// cannot take the shape. Defined in gemm_variant.cu for each (kVariant, kEpilogue).
template <int kVariant, int kEpilogue>
bool run_variant(int m, int n, int k, const __half* a, const __half* w, const __half* bias,
                 __half* c, int sm_count, cudaStream_t stream);

}  // namespace ftbert::bench
