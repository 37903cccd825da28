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
// the other's MMAs do. Clusters of 2 along M (the weight tile multicast to both): faster than
// clusters along N at the FFN-in shape (docs/performance.md, "Kernel choices").
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

namespace fusion = cutlass::epilogue::fusion;
constexpr auto kRoundToNearest = cutlass::FloatRoundStyle::round_to_nearest;

// The epilogues as CUTLASS visitor trees that compute only what they name. CUTLASS's own fusions
// (LinearCombination, LinCombPerColBiasEltAct) compute alpha · acc + beta · C, and without a C
// still issue the multiply by beta: an FP32 FMA an element, each of which costs the other
// warpgroup's MMAs about a cycle (benchmarks/results/wgmma-overlap-h100.txt): leaving it out is
// measurably faster at the FFN-in shape (docs/performance.md, "Kernel choices").

// act(acc), rounded to T (the kernel harness's GELU without a bias).
template <template <class> class Act, typename T>
using ActTree = fusion::Sm90EVT<fusion::Sm90Compute<Act, T, float, kRoundToNearest>,
                                fusion::Sm90AccFetch>;
// acc, rounded to T.
template <typename T>
using AccTree = ActTree<cutlass::epilogue::thread::Identity, T>;
// act(acc + bias[col]), rounded to T; bias [n] in T (a row of the tile's width, read once a tile).
template <template <class> class Act, typename T, class TileShape>
using BiasActTree = fusion::Sm90EVT<
    fusion::Sm90Compute<Act, T, float, kRoundToNearest>,
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, float, float, kRoundToNearest>,
                    fusion::Sm90AccFetch,
                    fusion::Sm90RowBroadcast<0, TileShape, T, float, Stride<_0, _1, int64_t>,
                                             /*alignment*/ 8>>>;

template <typename T, class Tiles, Epilogue kEpilogue>
struct TreeOf {
  using type = AccTree<T>;
};
template <typename T, class Tiles>
struct TreeOf<T, Tiles, Epilogue::kBiasGelu> {
  using type = BiasActTree<ErfGelu, T, typename Tiles::TileShape>;
};

// Row-major A [m, k], W [k, n] (CUTLASS's B, n-major), D [m, n]; fp32 accumulation; no C operand.
// Tiles: a TilingOf; Tree: the epilogue's visitor tree, a BiasActTree when kHasBias (its bias is
// run()'s), else one without arguments.
template <typename T, class Tiles, class Tree, bool kHasBias_>
struct GemmWith {
  using Row = cutlass::layout::RowMajor;
  static constexpr int kAlign = 8;  // elements per 16 bytes
  static constexpr bool kHasBias = kHasBias_;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Tiles::TileShape,
      typename Tiles::ClusterShape, typename Tiles::EpilogueTile, float, float,
      void, Row, kAlign, T, Row, kAlign, typename Tiles::EpilogueSchedule, Tree>::CollectiveOp;
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
using GemmOf = GemmWith<T, Tiles, typename TreeOf<T, Tiles, kEpilogue>::type,
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
  if constexpr (G::kHasBias) {  // BiasActTree's: {{acc, bias, plus}, act}
    args.epilogue.thread = {{{}, {reinterpret_cast<const T*>(bias)}, {}}, {}};
  }
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
