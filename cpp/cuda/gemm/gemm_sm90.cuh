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

#include "cuda/gemm/erf_gelu.cuh"
#include "cuda/gemm/gemm_sm90.h"
#include "cuda/launch.cuh"

namespace ftbert::cuda::sm90_gemm {

using namespace cute;

// The epilogue's activation, erf-GELU (erf_gelu.cuh), as CUTLASS's epilogue calls it.
template <class V>
struct ErfGelu;

template <>
struct ErfGelu<float> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_DEVICE float operator()(float x) const { return erf_gelu(x); }
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
// 128 x 128 tiles, each consumer warpgroup owning a tile: one's epilogue (the GELU) runs while
// the other's MMAs do. Clusters of 2 along M (the weight tile multicast to both): on an H100 at
// the FFN-in shape, in three runs of benchmarks/kernels/gemm_variants.cu, faster than clusters
// along N at 4,096 rows (bias + erf-GELU 37.0-41.1 us against 38.2-42.1) and mostly at 16,384
// (138.9-163.2 against 149.5-163.7; plain 115.6-120.9 against 130.6-137.5).
template <>
struct Tiling<GemmTiles::k128x128Pingpong>
    : TilingOf<Shape<_128, _128, _64>, Shape<_2, _1, _1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized> {};
// 64 x 64 tiles, one consumer warpgroup: with few rows, enough tiles to fill the GPU. (At 128
// rows on an H100, 64 x 48 and 64 x 32 tiles ran slower, and clusters of 2 along M no faster:
// benchmarks/results/gemm-variants-rows128-h100.txt.)
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
// The plain GEMM of gemm_sm90.h: acc rounded to T.
template <typename T, GemmTiles kTiles>
using Plain = GemmOf<T, Tiling<kTiles>, Epilogue::kPlain>;

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
  // Programmatic where ftbert's own kernels are: CUTLASS's wait for the previous kernel is built
  // in (CUTLASS_ENABLE_GDC_FOR_SM90, CMakeLists.txt).
  return gemm.run(stream, nullptr, dependent_launch_enabled()) == cutlass::Status::kSuccess;
}

}  // namespace ftbert::cuda::sm90_gemm
