// One CUTLASS GEMM configuration of gemm_variants.h, selected by -DFTBERT_VARIANT and
// -DFTBERT_EPILOGUE (see gemm_variants.cu for the build).
#include "../../benchmarks/kernels/gemm_variants.h"
#include "cuda/gemm/gemm_sm90.cuh"

namespace ftbert::bench {
namespace {

using namespace cute;
namespace g = ftbert::cuda::sm90_gemm;

struct Coop {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};
struct Ws {  // one consumer warpgroup, not persistent: the engine's small-tile kernel
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecialized;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

template <int kVariant>
struct Tiles;
template <int kM, int kN>
struct EpilogueTileOf {
  using type = Shape<Int<kM>, Int<kN>>;
};
template <>
struct EpilogueTileOf<0, 0> {
  using type = cutlass::epilogue::collective::EpilogueTileAuto;
};
#define FTBERT_GEMM_TILES(index, name, tm, tn, cm, cn, schedule, em, en)                       \
  template <>                                                                                 \
  struct Tiles<index> : g::TilingOf<Shape<Int<tm>, Int<tn>, _64>, Shape<Int<cm>, Int<cn>, _1>, \
                                    schedule::Mainloop, schedule::Epilogue,                   \
                                    typename EpilogueTileOf<em, en>::type> {};
FTBERT_GEMM_VARIANTS(FTBERT_GEMM_TILES)
#undef FTBERT_GEMM_TILES

}  // namespace

template <>
bool run_variant<FTBERT_VARIANT, FTBERT_EPILOGUE>(int m, int n, int k, const __half* a,
                                                  const __half* w, const __half* bias, __half* c,
                                                  int sm_count, cudaStream_t stream) {
  using T = cutlass::half_t;
#if FTBERT_EPILOGUE == 2  // erf-GELU without the bias: what the bias's loads cost
  using G = g::GemmWith<T, Tiles<FTBERT_VARIANT>, g::ActTree<g::ErfGelu, T>, false>;
#elif FTBERT_EPILOGUE == 3  // bias + ReLU: the activation's arithmetic against one instruction
  using G = g::GemmWith<T, Tiles<FTBERT_VARIANT>,
                        g::BiasActTree<cutlass::epilogue::thread::ReLu, T,
                                       typename Tiles<FTBERT_VARIANT>::TileShape>,
                        true>;
#else
  constexpr auto kEpilogue = FTBERT_EPILOGUE ? g::Epilogue::kBiasGelu : g::Epilogue::kPlain;
  using G = g::GemmOf<T, Tiles<FTBERT_VARIANT>, kEpilogue>;
#endif
  return g::run<G>(m, n, k, a, w, bias, c, sm_count, stream);
}

}  // namespace ftbert::bench
