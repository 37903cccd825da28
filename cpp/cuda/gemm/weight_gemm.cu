// CudaBackend's weight GEMMs: the candidates for a shape, the fixed rule, the measured pick
// (gemm_tuner.h) and running one. Row-major c [m, n] = a [m, k] · W [k, n] maps onto cuBLAS's
// column-major as cᵀ = Wᵀ · aᵀ (see CudaBackend::gemm).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm/lt_descriptors.h"
#include "cuda/gemm/tuning_data.h"
#include "cuda/launch.cuh"
#include "ftbert/pick_store.h"
#if FTBERT_GEMM_SM90
#include "cuda/gemm/gemm_sm90.h"
#endif

#ifndef FTBERT_CUTLASS_VERSION_TEXT
#define FTBERT_CUTLASS_VERSION_TEXT "none"
#endif

namespace ftbert::cuda {
namespace {

// The cache file's format, candidate set and how candidates are timed: a change to any makes
// older files foreign.
constexpr int kGemmCacheFormat = 4;

constexpr const char* kCublasLtPrefix = "cublaslt:";  // + the heuristic's rank
constexpr const char* kCublasLtNoWorkspacePrefix = "cublaslt-nows:";  // ranked, run with none
constexpr int kCublasLtCandidates = 8;

// The epilogues the choice covers: none (no bias), or bias + one of these activations.
bool covered_epilogue(bool has_bias, Activation act) {
  if (!has_bias) return act == Activation::kIdentity;
  return act == Activation::kGeluErf || act == Activation::kGeluTanh || act == Activation::kRelu;
}

// The picks that need no measurement, built once: the fixed rule returns them by reference.
const GemmPick kCublasPick{"cublas", GemmKernel::kCublas};

cudaDataType_t data_type(DType dt) { return dt == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF; }

// cuBLASLt's fused epilogue for act(acc + bias), where it computes that very function: ReLU, and
// GELU in the tanh form (HF "gelu_new" / "gelu_pytorch_tanh"; cuBLASLt's is within 1e-5 of it).
// erf-GELU has none (cuBLASLt's GELU is 4.8e-4 from it): DEFAULT, the bias and activation then
// run as a second op.
cublasLtEpilogue_t lt_epilogue(Activation act) {
  switch (act) {
    case Activation::kGeluTanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Activation::kRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

#if FTBERT_GEMM_SM90
// The Hopper fused FFN-in kernels (gemm_sm90.h), as candidates.
const GemmPick kCutlassPicks[] = {
    {"cutlass:64x64", GemmKernel::kCutlass, {}, GemmTiles::k64x64},
    {"cutlass:coop_128x256", GemmKernel::kCutlass, {}, GemmTiles::k128x256},
    {"cutlass:pingpong_128x128", GemmKernel::kCutlass, {}, GemmTiles::k128x128Pingpong},
};
// The plain kernel, the fixed choice for few rows without a bias (gemm_sm90.h).
const GemmPick kCutlassPlainPick{"cutlass:64x64_plain", GemmKernel::kCutlassPlain, {},
                                 GemmTiles::k64x64};
const GemmPick& cutlass_pick(GemmTiles tiles) {
  for (const GemmPick& p : kCutlassPicks) {
    if (p.tiles == tiles) return p;
  }
  return kCublasPick;  // not reached: every tiling has a pick
}

template <typename T>
bool run_cutlass_plain(int m, int n, int k, const void* a, const void* w, void* c, int sm_count,
                       cudaStream_t stream) {
  return gemm_sm90_tiled<T, GemmTiles::k64x64>(m, n, k, static_cast<const T*>(a),
                                               static_cast<const T*>(w), static_cast<T*>(c),
                                               sm_count, stream);
}

template <typename T>
bool run_cutlass(GemmTiles tiles, int m, int n, int k, const void* a, const void* w,
                 const void* bias, void* c, int sm_count, cudaStream_t stream) {
  const auto* ta = static_cast<const T*>(a);
  const auto* tw = static_cast<const T*>(w);
  const auto* tb = static_cast<const T*>(bias);
  auto* tc = static_cast<T*>(c);
  switch (tiles) {
    case GemmTiles::k64x64:
      return gemm_bias_gelu_sm90_tiled<T, GemmTiles::k64x64>(m, n, k, ta, tw, tb, tc, sm_count,
                                                             stream);
    case GemmTiles::k128x256:
      return gemm_bias_gelu_sm90_tiled<T, GemmTiles::k128x256>(m, n, k, ta, tw, tb, tc, sm_count,
                                                               stream);
    case GemmTiles::k128x128Pingpong:
      return gemm_bias_gelu_sm90_tiled<T, GemmTiles::k128x128Pingpong>(m, n, k, ta, tw, tb, tc,
                                                                       sm_count, stream);
  }
  return false;
}
#endif

}  // namespace

// cuBLASLt's description of one weight GEMM shape and epilogue, kept per backend (creating it
// costs host time on every call otherwise). The bias pointer is set per call.
struct CudaBackend::LtShape : LtDescriptors {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // run_bias_gemm's algorithm: the heuristic's first without workspace, asked once.
  bool ranked = false;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  LtShape(DType dt, int m, int n, int k, cublasLtEpilogue_t epi) : epilogue(epi) {
    FTBERT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    FTBERT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&w, data_type(dt), n, k, n));
    FTBERT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, data_type(dt), k, m, k));
    FTBERT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, data_type(dt), n, m, n));
  }
};

void CudaBackend::LtShapeDelete::operator()(LtShape* shape) const noexcept { delete shape; }

CudaBackend::LtShape& CudaBackend::lt_shape(DType dt, int m, int n, int k, Activation act) {
  return lt_shape_with(dt, m, n, k, lt_epilogue(act));
}

CudaBackend::LtShape& CudaBackend::lt_shape_with(DType dt, int m, int n, int k,
                                                 cublasLtEpilogue_t epilogue) {
  const auto key = std::make_tuple(static_cast<int>(dt), m, n, k, static_cast<int>(epilogue));
  auto it = lt_shapes_.find(key);
  if (it == lt_shapes_.end()) {
    if (lt_shapes_.size() >= 256) lt_shapes_.clear();  // packed batches: any row count
    it = lt_shapes_
             .emplace(key, std::unique_ptr<LtShape, LtShapeDelete>(
                               new LtShape(dt, m, n, k, epilogue)))
             .first;
  }
  return *it->second;
}

GemmShapeKey CudaBackend::gemm_key(const WeightGemm& g) const {
  return {device_, g.dt, rows_bucket(g.m), g.n, g.k, g.act};
}

std::vector<cublasLtMatmulHeuristicResult_t> CudaBackend::lt_heuristic(LtShape& shape,
                                                                      size_t workspace) {
  // Split-k reductions in fp32 or none: never in the 16-bit output type (as for cuBLAS,
  // CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION). No result (an unsupported shape) leaves
  // cuBLAS's own path.
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  return lt_ranked(cublaslt_, shape, workspace, schemes, kCublasLtCandidates);
}

std::vector<GemmPick> CudaBackend::gemm_candidates(const WeightGemm& g) {
  std::vector<GemmPick> out;
  out.push_back(kCublasPick);
  LtShape& shape = lt_shape(g.dt, g.m, g.n, g.k, g.act);
  // cuBLASLt's heuristic twice: with the workspace, and with none. At 4,096 rows and more most
  // algorithms given a workspace clear part of it before every kernel (a memset: in a CUDA graph
  // a node and two edges, benchmarks/results/gemm-choice-graphs-h100.txt); given none, the same
  // algorithms run without it, in the same kernel time (H100, BERT-base's GEMMs). Both are
  // candidates here (CudaGemmChoice::run_candidate runs either); the tuner times the ones without
  // (measure_gemm). The first keep the whole workspace: a pick serves every row count of its
  // bucket, and a larger one may need more than the heuristic said for the measured one.
  for (const size_t workspace : {cublas_workspace_bytes_, size_t{0}}) {
    const char* prefix = workspace > 0 ? kCublasLtPrefix : kCublasLtNoWorkspacePrefix;
    const std::vector<cublasLtMatmulHeuristicResult_t> found = lt_heuristic(shape, workspace);
    for (size_t i = 0; i < found.size(); ++i) {
      out.push_back({prefix + std::to_string(i), GemmKernel::kCublasLt, found[i].algo, {},
                     workspace});
    }
  }
#if FTBERT_GEMM_SM90
  // TMA needs 16-byte rows: k and n multiples of 8 (the pointers are checked at run time).
  if (fused_gemm_sm90_ && g.bias_gelu() && g.n % 8 == 0 && g.k % 8 == 0) {
    for (const GemmPick& p : kCutlassPicks) out.push_back(p);
  }
  if (fused_gemm_sm90_ && g.bias == nullptr && gemm_sm90_plain_pays(g.m, g.n, g.k)) {
    out.push_back(kCutlassPlainPick);
  }
#endif
  return out;
}

const GemmPick& CudaBackend::fixed_gemm_choice(const WeightGemm& g) const {
#if FTBERT_GEMM_SM90
  if (fused_gemm_sm90_ && g.bias_gelu() && gemm_bias_gelu_sm90_pays(g.m)) {
    return cutlass_pick(g.m <= kGemmSmallTileMaxRows ? GemmTiles::k64x64 : GemmTiles::k128x256);
  }
  if (fused_gemm_sm90_ && g.bias == nullptr && gemm_sm90_plain_pays(g.m, g.n, g.k)) {
    return kCutlassPlainPick;
  }
#endif
  (void)g;
  return kCublasPick;
}

const GemmPick& CudaBackend::measured_gemm_pick(const WeightGemm& g) {
  const GemmShapeKey key = gemm_key(g);
  if (const GemmPick* found = GemmPicks::find(key)) return *found;
  if (gemm_tuning_inline()) {
    const GemmPick* measured = GemmPicks::measure_and_wait(key);
    return measured != nullptr ? *measured : fixed_gemm_choice(g);
  }
  GemmPicks::request(key);  // measured on the tuner's thread; this forward runs the rule
  return fixed_gemm_choice(g);
}

namespace {
template <typename T>
__global__ void fill_uniform_kernel(T* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<T>(scale * hashed_uniform(i, seed));
  }
}

__global__ void count_differing_elements(const uint16_t* a, const uint16_t* b, size_t n,
                                         int* differing) {
  int local = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    local += a[i] != b[i];
  }
  if (local > 0) atomicAdd(differing, local);  // a count: the order of the adds does not matter
}
}  // namespace

void count_differing_bits(const void* a, const void* b, size_t n, int* differing,
                          cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<size_t>((n + 255) / 256, 1024));
  count_differing_elements<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(a),
                                                       static_cast<const uint16_t*>(b), n,
                                                       differing);
  FTBERT_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform(DType dt, void* p, size_t n, uint32_t seed, float scale, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<size_t>((n + 255) / 256, 4096));
  if (dt == DType::kFloat16) {
    fill_uniform_kernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(p), n, seed, scale);
  } else {
    fill_uniform_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed,
                                                    scale);
  }
  FTBERT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::grow_tuning_operands(const size_t (&need)[5]) {
  for (int i = 0; i < 5; ++i) {
    if (tuning_bytes_[i] >= need[i]) continue;
    if (tuning_operands_[i] != nullptr) FTBERT_CUDA_CHECK(cudaFreeAsync(tuning_operands_[i], stream_));
    tuning_operands_[i] = nullptr;
    tuning_bytes_[i] = 0;
    FTBERT_CUDA_CHECK(cudaMallocAsync(&tuning_operands_[i], need[i], stream_));
    tuning_bytes_[i] = need[i];
  }
}

GemmPick CudaBackend::measure_gemm(const GemmShapeKey& key) {
  if (key.fp8) return measure_fp8_gemm(key);
  DeviceScope scope(device_);
  const int m = key.rows_bucket, n = key.n, k = key.k;
  const bool has_bias = key.act != Activation::kIdentity;
  const size_t es = dtype_size(key.dt);
  // Invariant shapes' candidates are checked on at least kInvariantCheckedRows rows, whatever
  // the bucket (tuning_data.h).
  const int checked_rows = key.invariant ? std::max(m, kInvariantCheckedRows) : m;
  const size_t out_bytes = static_cast<size_t>(checked_rows) * n * es;
  const size_t count_at = (out_bytes + 255) / 256 * 256;  // the reference's count of differences
  const size_t need[5] = {static_cast<size_t>(checked_rows) * k * es,
                          static_cast<size_t>(k) * n * es, static_cast<size_t>(n) * es, out_bytes,
                          key.invariant ? count_at + sizeof(int) : 0};
  grow_tuning_operands(need);
  const float scales[3] = {1.7f, 0.05f, 0.1f};
  for (int i = 0; i < 3; ++i) {
    fill_uniform(key.dt, tuning_operands_[i], need[i] / es, 0x9e3779b9u * (i + 1), scales[i], stream_);
  }
  const WeightGemm g{key.dt, m, n, k, tuning_operands_[0], tuning_operands_[1],
                     has_bias ? tuning_operands_[2] : nullptr, tuning_operands_[3], key.act};
  // Batch-invariant shapes: the reference is the rule, and only kernels that give its bits
  // here are candidates. A kernel that does not split k keeps each output's sum in k order
  // whatever its tiling, and cuBLASLt's and CUTLASS's such kernels agree bit for bit
  // (docs/performance.md, "Batch invariance"); the check keeps any that does not out.
  const GemmPick& rule = key.invariant ? invariant_gemm_pick(g) : fixed_gemm_choice(g);
  void* const reference_out = tuning_operands_[4];
  int* const differing = key.invariant
      ? reinterpret_cast<int*>(static_cast<char*>(tuning_operands_[4]) + count_at) : nullptr;
  if (key.invariant) {
    // Checked on products of a model's size (|a·W| ~ 2, where GELU bends) rather than the
    // timing's small ones, on which two epilogues may round alike by chance.
    fill_uniform(key.dt, tuning_operands_[1], need[1] / es, 0x7f4a7c15u, 3.5f / std::sqrt(float(k)), stream_);
    FTBERT_CHECK(run_gemm(rule, {g.dt, checked_rows, n, k, g.a, g.w, g.bias, reference_out, g.act}),
                 "batch_invariant: the reference GEMM refused its own shape");
  }
  const auto gives_reference_bits = [&](const GemmPick& p) {
    // Only the order of the sums may differ between kernels of the class, never the epilogue's
    // code: CUTLASS's fused GELU is another implementation than cuBLASLt's.
    if (may_split_k(p) || (p.kernel != rule.kernel && g.bias != nullptr)) return false;
    FTBERT_CUDA_CHECK(cudaMemsetAsync(g.c, 0xff, out_bytes, stream_));
    if (!run_gemm(p, {g.dt, checked_rows, n, k, g.a, g.w, g.bias, g.c, g.act})) return false;
    int count = 0;
    FTBERT_CUDA_CHECK(cudaMemsetAsync(differing, 0, sizeof(int), stream_));
    count_differing_bits(g.c, reference_out, out_bytes / es, differing, stream_);
    FTBERT_CUDA_CHECK(cudaMemcpyAsync(&count, differing, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    FTBERT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return count == 0;
  };
  // Timed on the stream, not captured into graphs as a forward runs them: a capture in progress
  // makes another thread's cudaDeviceSynchronize (torch.cuda.synchronize()) fail, and the tuner
  // runs beside the caller's code. Without graphs, a cuBLASLt algorithm that clears its workspace
  // before each kernel would look no slower than its memset-free twin, though in a recorded
  // forward the memset is a node with an edge on each side (gemm_candidates): so the tuner times
  // the twins only, run with no workspace.
  std::vector<GemmPick> candidates;
  for (GemmPick& p : gemm_candidates(g)) {
    if (p.kernel == GemmKernel::kCublasLt && p.workspace > 0) continue;
    if (key.invariant && !gives_reference_bits(p)) continue;
    candidates.push_back(std::move(p));
  }
  if (key.invariant) {
    candidates.insert(candidates.begin(), rule);  // its time is the bar
    fill_uniform(key.dt, tuning_operands_[1], need[1] / es, 0x9e3779b9u * 2, scales[1], stream_);
  }
  std::vector<std::function<bool()>> runs;
  for (size_t i = 0; i < candidates.size(); ++i) {
    runs.push_back([&, i] { return run_gemm(candidates[i], g); });
  }
  std::vector<float> ms = time_candidates(stream_, runs);
  if (dependent_launch_enabled()) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      const GemmKernel kernel = candidates[i].kernel;
      if (kernel == GemmKernel::kCutlass || kernel == GemmKernel::kCutlassPlain) {
        ms[i] -= kProgrammaticEdgeMs;
      }
    }
  }
  // The rule's time: its kernel's, or cuBLAS's where its kernel cannot take the shape (run_gemm
  // then falls back to cuBLAS, candidate 0).
  float rule_ms = ms[0];
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].name == rule.name && std::isfinite(ms[i])) rule_ms = ms[i];
  }
  const size_t best = std::min_element(ms.begin(), ms.end()) - ms.begin();
  return ms[best] < (1.0f - kRuleMargin) * rule_ms ? candidates[best] : rule;
}

// Batch invariance: one kernel per (dtype, n, k, activation) for every row count, the reference
// whose bits every measured pick must give.
// - erf-GELU on Hopper: the fused CUTLASS kernel in 64 x 64 tiles. cuBLASLt has no erf epilogue,
//   so its class would round the product before a second pass adds the bias and the GELU; the
//   fused class keeps the fp32 sum to one rounding, runs one kernel instead of two, and its other
//   tilings (the default's FFN-in kernels at many rows) share its epilogue code.
// - Else cuBLASLt's ranking at kInvariantRows rows given no workspace (so no split of k, whose
//   partial sums would change with the grid), the first that also takes a single row and a large
//   row count, else the first unsplit one (a row count it refuses then fails the forward, never
//   silently runs another kernel).
constexpr int kInvariantRows = 2048;
constexpr int kInvariantCheckRows[] = {1, 16384};

const GemmPick& CudaBackend::invariant_gemm_pick(const WeightGemm& g) {
  const auto key = std::make_tuple(static_cast<int>(g.dt), g.n, g.k, static_cast<int>(g.act));
  if (auto it = invariant_picks_.find(key); it != invariant_picks_.end()) return it->second;
#if FTBERT_GEMM_SM90
  if (fused_gemm_sm90_ && g.bias_gelu() && g.n % 8 == 0 && g.k % 8 == 0) {
    return invariant_picks_.emplace(key, cutlass_pick(GemmTiles::k64x64)).first->second;
  }
#endif
  const cublasLtEpilogue_t epilogue = lt_epilogue(g.act);
  LtShape reference(g.dt, kInvariantRows, g.n, g.k, epilogue);
  const std::vector<cublasLtMatmulHeuristicResult_t> ranked = lt_heuristic(reference, 0);
  const cublasLtMatmulAlgo_t* chosen = nullptr;
  const cublasLtMatmulAlgo_t* unsplit = nullptr;
  for (const cublasLtMatmulHeuristicResult_t& found : ranked) {
    if (lt_splits_k(found.algo)) continue;
    if (unsplit == nullptr) unsplit = &found.algo;
    bool every = true;
    for (const int m : kInvariantCheckRows) {
      LtShape at(g.dt, m, g.n, g.k, epilogue);
      cublasLtMatmulHeuristicResult_t check{};
      every = every && cublasLtMatmulAlgoCheck(cublaslt_, at.desc, at.w, at.a, at.c, at.c,
                                               &found.algo, &check) == CUBLAS_STATUS_SUCCESS &&
              check.workspaceSize == 0;
    }
    if (every) {
      chosen = &found.algo;
      break;
    }
  }
  if (chosen == nullptr) chosen = unsplit;
  FTBERT_CHECK(chosen != nullptr, "batch_invariant: cuBLASLt offers no unsplit algorithm for the "
                                      << dtype_name(g.dt) << " GEMM n=" << g.n << ", k=" << g.k
                                      << " on " << device_name_);
  GemmPick pick{"cublaslt-invariant", GemmKernel::kCublasLt, *chosen, {}, 0};
  return invariant_picks_.emplace(key, std::move(pick)).first->second;
}

bool CudaBackend::may_split_k(const GemmPick& pick) const {
  if (pick.kernel == GemmKernel::kCublas) return true;
  if (pick.kernel != GemmKernel::kCublasLt) return false;  // CUTLASS: one tile per output block
  if (pick.workspace > 0) return true;
  return lt_splits_k(pick.algo);
}

void CudaBackend::run_invariant_gemm(const WeightGemm& g) {
  if (measure_gemms_) {
    // The measured kernel of this row bucket gives the reference's bits (measure_gemm); until it
    // is measured, and wherever it cannot take these operands, the reference runs.
    GemmShapeKey key = gemm_key(g);
    key.invariant = true;
    const GemmPick* pick = GemmPicks::find(key);
    if (pick == nullptr) {
      if (gemm_tuning_inline()) {
        pick = GemmPicks::measure_and_wait(key);
      } else {
        GemmPicks::request(key);
      }
    }
    if (pick != nullptr && run_gemm(*pick, g)) return;
  }
  const GemmPick& rule = invariant_gemm_pick(g);
  FTBERT_CHECK(run_gemm(rule, g), "batch_invariant: the reference GEMM ("
                                      << rule.name << ") refused the " << dtype_name(g.dt)
                                      << " GEMM m=" << g.m << ", n=" << g.n << ", k=" << g.k
                                      << " (operands not 16-byte aligned?)");
}

GemmCacheFile CudaBackend::gemm_cache_file() const {
  GemmCacheFile file;
  const std::string dir = PickStore::default_dir();
  if (dir.empty()) return file;
  int minor = 0, driver = 0, runtime = 0;
  FTBERT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
  FTBERT_CUDA_CHECK(cudaDriverGetVersion(&driver));
  FTBERT_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::ostringstream id;
  // Everything a pick depends on: the GPU, the libraries whose kernels are candidates, the
  // workspace they were given, and the candidate set and its timing (kGemmCacheFormat changes
  // with them).
  id << "gemm-picks " << kGemmCacheFormat << "; " << device_name_ << "; sm_"
     << compute_capability_major_ << minor << "; " << sm_count_ << " SMs; driver " << driver
     << "; CUDA runtime " << runtime << "; cuBLASLt " << cublasLtGetVersion() << "; CUTLASS "
     << FTBERT_CUTLASS_VERSION_TEXT << (fused_gemm_sm90_ ? " (fused GEMMs on)" : "")
     << "; workspace " << cublas_workspace_bytes_;
  file.identity = id.str();
  std::string gpu;
  for (const char ch : device_name_) {
    gpu += std::isalnum(static_cast<unsigned char>(ch)) ? static_cast<char>(std::tolower(ch)) : '-';
  }
  file.path = dir + "/gemm-picks-" + gpu + ".txt";
  return file;
}

bool CudaBackend::runs_loaded_pick(const GemmShapeKey& key, const GemmPick& pick) const {
  // The file's identity names this cuBLASLt, CUTLASS and GPU, and its checksums hold, so a
  // cuBLASLt algorithm in it is one this library gave for the shape; it only needs the workspace
  // it ran with. (Should it still not take a row count, run_gemm falls back to cuBLAS.)
  // An FP8 key's picks are cuBLASLt's FP8 algorithms, and only those.
  if (key.fp8 != (pick.kernel == GemmKernel::kCublasLtFp8)) return false;
  switch (pick.kernel) {
    case GemmKernel::kCublas: return true;
    case GemmKernel::kCublasLt:
    case GemmKernel::kCublasLtFp8: return pick.workspace <= cublas_workspace_bytes_;
    case GemmKernel::kCutlass: return fused_gemm_sm90_ && key.act == Activation::kGeluErf;
    case GemmKernel::kCutlassPlain: return fused_gemm_sm90_ && key.act == Activation::kIdentity;
  }
  return false;
}

void CudaBackend::load_gemm_picks() {
  if (!GemmPicks::claim_load(device_)) return;  // once per device and process
  const GemmCacheFile file = gemm_cache_file();
  if (file.path.empty()) return;
  DeviceScope scope(device_);
  for (const auto& [key_text, pick_text] : PickStore(file.path, file.identity).load()) {
    GemmShapeKey key{};
    GemmPick pick;
    if (!parse_gemm_key(key_text, device_, &key) || !parse_gemm_pick(pick_text, &pick) ||
        !runs_loaded_pick(key, pick)) {
      std::fprintf(stderr,
                   "ftbert: warning: %s: ignoring the entry for %s, which this build cannot "
                   "run (it will be measured again)\n",
                   file.path.c_str(), key_text.c_str());
      continue;
    }
    GemmPicks::stage_loaded(key, pick);
  }
}

GemmPick measure_gemm_shape(const GemmShapeKey& key, GemmCacheFile* cache) {
  // The tuner's own backend per device (its stream, handles and operands), on its thread only.
  // Leaked: the tuner may still run while static destructors do.
  static auto* backends = new std::map<int, std::unique_ptr<CudaBackend>>();
  std::unique_ptr<CudaBackend>& backend = (*backends)[key.device];
  if (!backend) backend = std::make_unique<CudaBackend>(key.device);
  *cache = backend->gemm_cache_file();
  return backend->measure_gemm(key);
}

bool CudaBackend::run_cublaslt(const GemmPick& pick, const WeightGemm& g) {
  LtShape& shape = lt_shape(g.dt, g.m, g.n, g.k, g.act);
  if (shape.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    shape.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias));
  }
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(cublaslt_, shape.desc, &one, g.w, shape.w, g.a, shape.a, &zero, g.c,
                     shape.c, g.c, shape.c, &pick.algo,
                     pick.workspace > 0 ? cublas_workspace_ : nullptr, pick.workspace, stream_);
  // An algorithm picked at another row count of the bucket may not take this one.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;
  FTBERT_CUBLAS_CHECK(status);
  return true;
}

bool CudaBackend::run_bias_gemm(const WeightGemm& g) {
  LtShape& shape = lt_shape_with(g.dt, g.m, g.n, g.k, CUBLASLT_EPILOGUE_BIAS);
  shape.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias));
  if (!shape.ranked) {
    // Without workspace, as the tuner times its candidates: in a recorded forward an algorithm
    // that clears its workspace adds a memset node and its edges.
    const std::vector<cublasLtMatmulHeuristicResult_t> ranked = lt_heuristic(shape, 0);
    shape.ranked = true;
    shape.found = !ranked.empty();
    if (shape.found) shape.algo = ranked[0].algo;
  }
  if (!shape.found) return false;
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(cublaslt_, shape.desc, &one, g.w, shape.w, g.a, shape.a, &zero, g.c,
                     shape.c, g.c, shape.c, &shape.algo, nullptr, 0, stream_);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;
  FTBERT_CUBLAS_CHECK(status);
  return true;
}

bool CudaBackend::run_gemm(const GemmPick& pick, const WeightGemm& g) {
  bool separate_epilogue = true;
  switch (pick.kernel) {
    case GemmKernel::kCublas:
      gemm(g.dt, false, false, g.m, g.n, g.k, g.a, g.k, g.w, g.n, g.c, g.n);
      break;
    case GemmKernel::kCublasLt:
      if (!run_cublaslt(pick, g)) return false;
      separate_epilogue = lt_epilogue(g.act) == CUBLASLT_EPILOGUE_DEFAULT;
      break;
    case GemmKernel::kCutlassPlain: {
#if FTBERT_GEMM_SM90
      if (!fused_gemm_sm90_ || g.bias != nullptr) return false;
      return g.dt == DType::kFloat16
                 ? run_cutlass_plain<__half>(g.m, g.n, g.k, g.a, g.w, g.c, sm_count_, stream_)
                 : run_cutlass_plain<__nv_bfloat16>(g.m, g.n, g.k, g.a, g.w, g.c, sm_count_,
                                                    stream_);
#else
      return false;
#endif
    }
    case GemmKernel::kCutlass: {
#if FTBERT_GEMM_SM90
      if (!fused_gemm_sm90_ || !g.bias_gelu()) return false;
      const bool done =
          g.dt == DType::kFloat16
              ? run_cutlass<__half>(pick.tiles, g.m, g.n, g.k, g.a, g.w, g.bias, g.c, sm_count_,
                                    stream_)
              : run_cutlass<__nv_bfloat16>(pick.tiles, g.m, g.n, g.k, g.a, g.w, g.bias, g.c,
                                           sm_count_, stream_);
      if (!done) return false;
      separate_epilogue = false;
      break;
#else
      return false;
#endif
    }
    case GemmKernel::kCublasLtFp8:
      return false;  // runs on e4m3 operands, in fp8_weight_gemm
  }
  if (separate_epilogue && g.bias != nullptr) {
    add_bias_activation(g.dt, g.c, g.bias, g.m, g.n, g.act);
  }
  return true;
}

void CudaBackend::weight_gemm(DType dt, int m, int n, int k, const void* a, int lda,
                              const void* w, void* c, int ldc, const void* bias, Activation act,
                              const void* a_codes) {
  if (fp8_weight(n, k)) {  // W is e4m3 (fp8_gemm.cu)
    if (m > 0) {
      fp8_weight_gemm({dt, m, n, k, a, w, bias, c, bias != nullptr ? act : Activation::kIdentity},
                      lda, ldc, a_codes);
    }
    return;
  }
  const bool choosable = (dt == DType::kFloat16 || dt == DType::kBFloat16) && lda == k &&
                         ldc == n && m > 0 && n > 0 && k > 0 &&
                         (bias == nullptr || covered_epilogue(true, act)) &&
                         (!batch_invariant_ || invariant_kernels_take(n, k));
  if (!choosable) {
    // A bias without an activation (DeBERTa's QKV, a gated FFN-in's bias) in the GEMM's epilogue
    // instead of a pass of its own over [m, n]; not measured: the tuner's keys have no bias
    // without an activation. Batch invariance keeps its reference kernels.
    const bool bias_alone = bias != nullptr && act == Activation::kIdentity &&
                            (dt == DType::kFloat16 || dt == DType::kBFloat16) && lda == k &&
                            ldc == n && m > 0 && n > 0 && k > 0 && !batch_invariant_;
    if (bias_alone) {
      DeviceScope scope(device_);
      if (run_bias_gemm({dt, m, n, k, a, w, bias, c, Activation::kIdentity})) return;
    }
    Backend::weight_gemm(dt, m, n, k, a, lda, w, c, ldc, bias, act);
    return;
  }
  DeviceScope scope(device_);
  // Without a bias the activation is not applied (as in Backend::weight_gemm).
  const WeightGemm g{dt, m, n, k, a, w, bias, c, bias != nullptr ? act : Activation::kIdentity};
  if (batch_invariant_) {
    run_invariant_gemm(g);
    return;
  }
  const GemmPick& pick = measure_gemms_ && m >= kTunedMinRows ? measured_gemm_pick(g)
                                                               : fixed_gemm_choice(g);
  if (!run_gemm(pick, g)) run_gemm(kCublasPick, g);  // e.g. unaligned pointers
}

void CudaGemmChoice::set_mode(const std::string& mode) {
  check_gemm_choice_mode(mode);
  backend_.measure_gemms_ = mode == "auto";
  if (backend_.measure_gemms_) backend_.load_gemm_picks();
}

std::string CudaGemmChoice::mode() const { return backend_.measure_gemms_ ? "auto" : "fixed"; }

uint64_t CudaBackend::begin_forward() { return GemmPicks::forward_begins(device_); }

void CudaBackend::end_forward() { GemmPicks::forward_ends(device_); }

void CudaBackend::wait_for_tuning() { GemmPicks::wait_idle(device_); }

std::map<std::string, int64_t> CudaBackend::tuning_counters() const {
  const GemmPicks::Counters c = GemmPicks::counters();
  return {{"measured", c.measured},
          {"on_caller", c.on_caller},
          {"loaded", c.loaded},
          {"cache_writes", c.cache_writes}};
}

std::vector<std::string> CudaGemmChoice::candidates(DType dt, int m, int n, int k, Activation act) {
  std::vector<std::string> names;
  const bool has_bias = act != Activation::kIdentity;
  if ((dt != DType::kFloat16 && dt != DType::kBFloat16) || m <= 0 || n <= 0 || k <= 0 ||
      !covered_epilogue(has_bias, act)) {
    return names;
  }
  CudaBackend::DeviceScope scope(backend_.device_);
  static const unsigned char kSomeBias = 0;  // only whether there is one matters here
  const CudaBackend::WeightGemm g{dt, m, n, k, nullptr, nullptr, has_bias ? &kSomeBias : nullptr, nullptr, act};
  for (const GemmPick& p : backend_.gemm_candidates(g)) names.push_back(p.name);
  return names;
}

std::string CudaGemmChoice::pick(DType dt, int m, int n, int k, Activation act) const {
  // The pick of the backend's current setting: batch-invariant shapes have picks of their own.
  GemmShapeKey key{backend_.device_, dt, rows_bucket(m), n, k, act};
  key.invariant = backend_.batch_invariant();
  const GemmPick* pick = GemmPicks::find(key);
  return pick != nullptr ? pick->name : std::string();
}

bool CudaGemmChoice::run_candidate(const std::string& name, DType dt, int m, int n, int k,
                                   const void* a, const void* w, void* c, const void* bias,
                                   Activation act) {
  if ((dt != DType::kFloat16 && dt != DType::kBFloat16) || m <= 0 || n <= 0 || k <= 0 ||
      !covered_epilogue(bias != nullptr, act)) {
    return false;
  }
  CudaBackend::DeviceScope scope(backend_.device_);
  const CudaBackend::WeightGemm g{dt, m, n, k, a, w, bias, c, act};
  for (const GemmPick& p : backend_.gemm_candidates(g)) {
    if (p.name == name) return backend_.run_gemm(p, g);
  }
  return false;
}

}  // namespace ftbert::cuda
