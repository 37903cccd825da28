// The CUTLASS GEMM configurations gemm_variants.cu compares (cpp/cuda/gemm/gemm_sm90.cuh builds
// them). Each (configuration, epilogue) is one translation unit, gemm_variant.cu compiled with
// -DFTBERT_VARIANT=<index> -DFTBERT_EPILOGUE=<0 plain | 1 bias + erf-GELU | 2 erf-GELU alone |
// 3 bias + ReLU, the last two for the configurations epilogue_built names>, so they build in
// parallel; gemm_variants.cu holds the reference, the cuBLAS / cuBLASLt peers and the timing.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace ftbert::bench {

// X(index, name, tile M, tile N, cluster M, cluster N, schedule, epilogue tile M, N): schedule is
// Coop (two consumer warpgroups share a tile) or Pingpong (each consumer warpgroup owns a tile;
// one's epilogue runs while the other's MMAs do); an epilogue tile of 0 x 0 is CUTLASS's choice
// (64 x 32 for ping-pong, 128 x 32 for cooperative, 16-bit outputs), which the epilogue stores
// one at a time through shared memory. Ws: one consumer warpgroup, not persistent (the engine's
// 64 x 64 tiles for few rows); a 48-column tile needs the 64 x 16 epilogue tile.
#define FTBERT_GEMM_VARIANTS(X)                                       \
  X(0, "coop 128x256 c2x1", 128, 256, 2, 1, Coop, 0, 0)               \
  X(1, "coop 256x128 c1x2", 256, 128, 1, 2, Coop, 0, 0)               \
  X(2, "coop 256x128 c2x1", 256, 128, 2, 1, Coop, 0, 0)               \
  X(3, "coop 128x128 c2x1", 128, 128, 2, 1, Coop, 0, 0)               \
  X(4, "pingpong 128x128 c2x1", 128, 128, 2, 1, Pingpong, 0, 0)       \
  X(5, "pingpong 128x128 c1x2", 128, 128, 1, 2, Pingpong, 0, 0)       \
  X(6, "pingpong 64x256 c2x1", 64, 256, 2, 1, Pingpong, 0, 0)         \
  X(7, "pingpong 128x128 c1x2 epi 64x64", 128, 128, 1, 2, Pingpong, 64, 64) \
  X(8, "pingpong 128x128 c1x2 epi 64x128", 128, 128, 1, 2, Pingpong, 64, 128) \
  X(9, "ws 64x64 c1x1", 64, 64, 1, 1, Ws, 0, 0)                       \
  X(10, "ws 64x64 c2x1", 64, 64, 2, 1, Ws, 0, 0)                      \
  X(11, "ws 64x48 c1x1 epi 64x16", 64, 48, 1, 1, Ws, 64, 16)         \
  X(12, "ws 64x48 c2x1 epi 64x16", 64, 48, 2, 1, Ws, 64, 16)         \
  X(13, "ws 64x32 c2x1", 64, 32, 2, 1, Ws, 0, 0)

constexpr int kGemmVariants = 14;

// The configurations also built with epilogues 2 (erf-GELU without the bias: what the bias
// costs) and 3 (bias + ReLU: what the activation's arithmetic costs, against an activation of
// one instruction).
constexpr bool epilogue_built(int variant) { return variant == 0 || variant == 4 || variant == 5; }

// c [m, n] = epilogue(a [m, k] · w [k, n] (+ bias [n])), row-major; false when the configuration
// cannot take the shape. Defined in gemm_variant.cu for each (kVariant, kEpilogue).
template <int kVariant, int kEpilogue>
bool run_variant(int m, int n, int k, const __half* a, const __half* w, const __half* bias,
                 __half* c, int sm_count, cudaStream_t stream);

}  // namespace ftbert::bench
