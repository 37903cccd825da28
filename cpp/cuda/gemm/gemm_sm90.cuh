// The CUTLASS kernels behind gemm_sm90.h. Each (dtype, tiling) instantiation takes ~90 s of nvcc,
// so each gets a translation unit of its own (generated from gemm_sm90_instance.cu.in by CMake)
// and they build in parallel.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <cstdint>
#include <type_traits>

#include "cuda/gemm/gemm_sm90.h"

namespace ftbert::cuda::sm90_gemm {

using namespace cute;

// erf-GELU, x Φ(x), as the epilogue's activation. CUTLASS's GELU calls erff, about 25 instructions
// a value; in a cooperative kernel the epilogue does not overlap the MMAs, and at K = 768 (BERT-base
// FFN-in) it made the kernel ~35% slower than the same kernel without it (44 vs 33 us at 4,096 x
// 3072 on an H100). Here Φ(-|x|) = 2^P(|x|), P a degree-8 polynomial fitted to log2 Φ(-|x|) on
// [0, 8]: 8 FMAs and one ex2. Relative error of the result below 1e-5 for |x| <= 8 (the negative
// tail keeps its relative precision, as the CPU's does); beyond -8, Φ(-8) ~ 6e-16 stands in for Φ.
template <class V>
struct ErfGelu;

template <>
struct ErfGelu<float> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_DEVICE float operator()(float x) const {
    const float a = fminf(fabsf(x), 8.0f);
    float p = 7.428467796444238e-08f;
    p = fmaf(p, a, -3.6553572044795146e-06f);
    p = fmaf(p, a, 7.957453635754064e-05f);
    p = fmaf(p, a, -0.0010219792602583766f);
    p = fmaf(p, a, 0.008762177079916f);
    p = fmaf(p, a, -0.05433736369013786f);
    p = fmaf(p, a, -0.45819565653800964f);
    p = fmaf(p, a, -1.1513217687606812f);
    p = fmaf(p, a, -0.9999923706054688f);
    float phi_neg;  // Φ(-|x|); ex2.approx: relative error ~2^-22, and P >= -51 stays normal
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(phi_neg) : "f"(p));
    return x * (x >= 0.0f ? 1.0f - phi_neg : phi_neg);
  }
};

// The epilogue applies its activation to fragments.
template <int N>
struct ErfGelu<cutlass::Array<float, N>> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v) const {
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = ErfGelu<float>{}(v[i]);
    return out;
  }
};

// The tilings (gemm_sm90.h says which runs when), as CUTLASS's tile, cluster, schedules and the
// epilogue's subtile (the piece of the tile it stores at a time).
template <class Tile, class Cluster, class Mainloop, class Epilogue,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct TilingOf {
  using TileShape = Tile;
  using ClusterShape = Cluster;
  using MainloopSchedule = Mainloop;
  using EpilogueSchedule = Epilogue;
  using EpilogueTile = EpiTile;
};
template <GemmTiles kTiles>
struct Tiling;
// 128 x 256 tiles in clusters of 2 along M, two consumer warpgroups sharing each tile.
template <>
struct Tiling<GemmTiles::k128x256>
    : TilingOf<Shape<_128, _256, _64>, Shape<_2, _1, _1>,
               cutlass::gemm::KernelTmaWarpSpecializedCooperative,
               cutlass::epilogue::TmaWarpSpecializedCooperative> {};
// 128 x 128 tiles in clusters of 2 along N, each consumer warpgroup owning a tile: one's
// epilogue (the GELU) runs while the other's MMAs do.
template <>
struct Tiling<GemmTiles::k128x128Pingpong>
    : TilingOf<Shape<_128, _128, _64>, Shape<_1, _2, _1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized> {};
// 64 x 64 tiles, one consumer warpgroup: with few rows, enough tiles to fill the GPU.
template <>
struct Tiling<GemmTiles::k64x64>
    : TilingOf<Shape<_64, _64, _64>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecialized,
               cutlass::epilogue::TmaWarpSpecialized> {};

// What the epilogue computes from the fp32 accumulators before the single rounding to T.
enum class Epilogue {
  kPlain,     // acc
  kBiasGelu,  // gelu_erf(acc + bias[col])
};

template <typename T, Epilogue kEpilogue>
struct FusionOf {
  using type = cutlass::epilogue::fusion::LinearCombination<T, float, T, float>;
};
template <typename T>
struct FusionOf<T, Epilogue::kBiasGelu> {
  using type = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<ErfGelu, T, float, T, T, float>;
};

// Row-major A [m, k], W [k, n] (CUTLASS's B, n-major), D [m, n]; fp32 accumulation; no C operand
// (beta = 0). Tiles: a TilingOf; Fusion: CUTLASS's epilogue fusion, with a bias_ptr argument
// when kHasBias.
template <typename T, class Tiles, class Fusion_, bool kHasBias_>
struct GemmWith {
  using Row = cutlass::layout::RowMajor;
  static constexpr int kAlign = 8;  // elements per 16 bytes
  static constexpr bool kHasBias = kHasBias_;
  using Fusion = Fusion_;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Tiles::TileShape,
      typename Tiles::ClusterShape, typename Tiles::EpilogueTile, float, float,
      void, Row, kAlign, T, Row, kAlign, typename Tiles::EpilogueSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, Row, kAlign, T, Row, kAlign, float,
      typename Tiles::TileShape, typename Tiles::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Tiles::MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <typename T, class Tiles, Epilogue kEpilogue>
using GemmOf = GemmWith<T, Tiles, typename FusionOf<T, kEpilogue>::type,
                        kEpilogue == Epilogue::kBiasGelu>;

// The FFN-in GEMM of gemm_sm90.h: GELU(acc + bias[col]) in fp32, rounded once to T.
template <typename T, GemmTiles kTiles>
using BiasGelu = GemmOf<T, Tiling<kTiles>, Epilogue::kBiasGelu>;

// Enqueues one GEMM of kind G (a GemmOf) with bias [n] (nullptr for kPlain); false, enqueuing
// nothing, if G cannot take the shape.
template <class G, typename Ours>
bool run(int m, int n, int k, const Ours* a, const Ours* w, const Ours* bias, Ours* c,
         int sm_count, cudaStream_t stream) {
  using Adapter = typename G::Gemm;
  using Kernel = typename Adapter::GemmKernel;
  using T = typename Kernel::ElementA;  // cutlass::half_t / bfloat16_t: same bits as Ours
  static_assert(sizeof(T) == sizeof(Ours));
  const typename Kernel::StrideA stride_a = make_stride(int64_t{k}, Int<1>{}, int64_t{0});
  const typename Kernel::StrideB stride_b = make_stride(Int<1>{}, int64_t{n}, int64_t{0});
  const typename Kernel::StrideD stride_d = make_stride(int64_t{n}, Int<1>{}, int64_t{0});
  typename Adapter::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {reinterpret_cast<const T*>(a), stride_a, reinterpret_cast<const T*>(w), stride_b},
      {{}, nullptr, stride_d, reinterpret_cast<T*>(c), stride_d}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  if constexpr (G::kHasBias) args.epilogue.thread.bias_ptr = reinterpret_cast<const T*>(bias);
  args.hw_info.sm_count = sm_count;
  Adapter gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  // The persistent data-parallel schedulers need no workspace; a nonzero size would mean a
  // different scheduler than the one chosen here.
  if (Adapter::get_workspace_size(args) != 0) return false;
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return false;
  return gemm.run(stream) == cutlass::Status::kSuccess;
}

}  // namespace ftbert::cuda::sm90_gemm
