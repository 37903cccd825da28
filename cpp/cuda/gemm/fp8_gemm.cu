// Quantization "fp8": the layers' weight GEMMs on e4m3 operands (Hopper and later).
//
// W [k, n] is kept as e4m3 Wᵀ [n, k] with a float32 scale per output channel,
// s_j = max_p |W[p, j]| / 448 (e4m3's largest finite value), made once at upload. Each GEMM's
// activations a [m, k] are quantized per row the same way (t_i = max_p |a[i, p]| / 448) into a
// buffer of the backend's own, and cuBLASLt multiplies the two with those scales as outer
// vectors (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F): c[i, j] = t_i · s_j · Σ_p qa[i, p] ·
// qw[j, p] in fp32, then bias (and ReLU or GELU, erf-GELU as its tanh form) in its epilogue,
// rounded once to the 16-bit output. Other activations run as add_bias_activation after it.
//
// In cuBLASLt's column-major terms cᵀ [n, m] = op(A) · op(B) with A = the stored Wᵀ (read
// transposed: e4m3 operands must be "TN") and B = the quantized rows; A's scales are per row of
// op(A) (channels), B's per column of op(B) (tokens).
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm/gemm_tuner.h"
#include "cuda/gemm/lt_descriptors.h"
#include "cuda/gemm/tuning_data.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/e4m3.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/launch.cuh"

namespace ftbert::cuda {
namespace {

// Under batch invariance every row count runs the algorithm cuBLASLt ranks first at this one.
constexpr int kFp8InvariantRows = 2048;

size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Random e4m3 codes of values uniform in [-448, 448): the FP8 measurement's operands, as
// fill_uniform's (tuning_data.h) once quantized.
__global__ void fill_e4m3_kernel(__nv_fp8_storage_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = __nv_cvt_float_to_fp8(kE4m3Max * hashed_uniform(i, seed), __NV_SATFINITE, __NV_E4M3);
  }
}

__global__ void fill_value_kernel(float* p, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

int fill_blocks(size_t n) { return static_cast<int>(std::min<size_t>((n + 255) / 256, 4096)); }

void fill_e4m3(void* p, size_t n, uint32_t seed, cudaStream_t stream) {
  fill_e4m3_kernel<<<fill_blocks(n), 256, 0, stream>>>(static_cast<__nv_fp8_storage_t*>(p), n,
                                                       seed);
  FTBERT_CUDA_CHECK(cudaGetLastError());
}

void fill_value(float* p, size_t n, float value, cudaStream_t stream) {
  fill_value_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, value);
  FTBERT_CUDA_CHECK(cudaGetLastError());
}

// The bias and the activation in cuBLASLt's epilogue where it has one for them. erf-GELU too:
// cuBLASLt's GELU is the tanh form, at most 4.7e-4 from erf's, far inside the e4m3 rounding that
// the next GEMM gives this output (2^-4 of each value), and a pass of its own over [m, n] costs
// more than the FP8 product saves.
cublasLtEpilogue_t fp8_epilogue(bool has_bias, Activation act) {
  if (!has_bias) return CUBLASLT_EPILOGUE_DEFAULT;
  switch (act) {
    case Activation::kIdentity: return CUBLASLT_EPILOGUE_BIAS;
    case Activation::kRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Activation::kGeluTanh:
    case Activation::kGeluErf: return CUBLASLT_EPILOGUE_GELU_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

// The candidates cuBLASLt ranks for a shape in the measurement (as many as the 16-bit GEMMs').
constexpr int kFp8Candidates = 8;
constexpr const char* kFp8CandidatePrefix = "cublaslt-fp8:";  // + the heuristic's rank

float host_to_float(DType dt, const void* p, int64_t i) {
  if (dt == DType::kFloat16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

}  // namespace

// cuBLASLt's description of one FP8 GEMM shape (its scale and bias pointers set per call) and
// the algorithm it runs, found once.
struct CudaBackend::Fp8Shape : LtDescriptors {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  size_t workspace = 0;

  Fp8Shape(DType dt, int m, int n, int k, int ldc, cublasLtEpilogue_t epi) : epilogue(epi) {
    FTBERT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nop = CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
    set(CUBLASLT_MATMUL_DESC_TRANSB, &nop, sizeof(nop));
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    const cudaDataType_t out = dt == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      const int32_t bias_type = out;
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    }
    FTBERT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&w, CUDA_R_8F_E4M3, k, n, k));
    FTBERT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, m, k));
    FTBERT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, out, n, m, ldc));
  }

  // The scale vectors (and the bias) of one call. Set before the heuristic too: cuBLASLt
  // checks outer-vector scales' pointers when it ranks algorithms.
  void point(const float* w_scales, const float* row_scales, const void* bias) {
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &row_scales, sizeof(row_scales));
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    }
  }
};

void CudaBackend::Fp8ShapeDelete::operator()(Fp8Shape* shape) const noexcept { delete shape; }

std::string CudaBackend::quantization_unsupported_reason(Quantization q, DType dt) const {
  if (q != Quantization::kFp8) return Backend::quantization_unsupported_reason(q, dt);
  if (compute_capability_major_ < 9) {
    return "quantization 'fp8' needs an NVIDIA GPU of compute capability 9.0 (Hopper) or later; " +
           device_name_ + " is " + std::to_string(compute_capability_major_) + "." +
           std::to_string(compute_capability_minor_);
  }
  if (dt != DType::kFloat16 && dt != DType::kBFloat16) {
    return std::string("quantization 'fp8' runs float16 or bfloat16 activations (got dtype ") +
           dtype_name(dt) + ")";
  }
  return "";
}

size_t CudaBackend::weight_bytes(DType dt, int k, int n) const {
  if (!fp8_weight(n, k)) return Backend::weight_bytes(dt, k, n);
  return align16(static_cast<size_t>(n) * k) + static_cast<size_t>(n) * sizeof(float);
}

void CudaBackend::upload_weight(DType dt, const void* host_w, int k, int n, void* dst) {
  if (!fp8_weight(n, k)) {
    Backend::upload_weight(dt, host_w, k, n, dst);
    return;
  }
  FTBERT_CHECK(dt == DType::kFloat16 || dt == DType::kBFloat16,
               "fp8 weights are quantized from float16 or bfloat16");
  // Host: Wᵀ [n, k] in e4m3, then the n scales.
  std::vector<unsigned char> packed(weight_bytes(dt, k, n), 0);
  auto* scales = reinterpret_cast<float*>(packed.data() + align16(static_cast<size_t>(n) * k));
  std::vector<float> column(k);
  for (int j = 0; j < n; ++j) {
    float top = 0.0f;
    for (int p = 0; p < k; ++p) {
      column[p] = host_to_float(dt, host_w, int64_t{p} * n + j);
      top = std::max(top, std::fabs(column[p]));
    }
    const float inv = top > 0.0f ? kE4m3Max / top : 1.0f;
    scales[j] = top > 0.0f ? top / kE4m3Max : 1.0f;
    unsigned char* row = packed.data() + static_cast<size_t>(j) * k;
    for (int p = 0; p < k; ++p) {
      row[p] = __nv_cvt_float_to_fp8(column[p] * inv, __NV_SATFINITE, __NV_E4M3);
    }
  }
  copy_to_device(dst, packed.data(), packed.size());
  synchronize();  // `packed` is gone after this call
}

CudaBackend::Fp8Shape& CudaBackend::fp8_shape(DType dt, int m, int n, int k, int ldc,
                                              cublasLtEpilogue_t epilogue, bool invariant,
                                              const float* w_scales, const float* row_scales,
                                              const void* bias) {
  const auto key = std::make_tuple(static_cast<int>(dt), m, n, k, ldc, static_cast<int>(epilogue),
                                   invariant);
  auto it = fp8_shapes_.find(key);
  if (it != fp8_shapes_.end()) return *it->second;
  if (fp8_shapes_.size() >= 256) fp8_shapes_.clear();  // packed batches: any row count
  auto shape = std::unique_ptr<Fp8Shape, Fp8ShapeDelete>(new Fp8Shape(dt, m, n, k, ldc, epilogue));
  shape->point(w_scales, row_scales, bias);
  // The algorithm: cuBLASLt's first, found at this row count or, under batch invariance, at
  // kFp8InvariantRows with no workspace and no split reduction, so that every row count runs
  // the same kernel and sums each output in the same order.
  const size_t workspace = invariant ? 0 : cublas_workspace_bytes_;
  const uint32_t schemes = invariant ? CUBLASLT_REDUCTION_SCHEME_NONE
                                     : (CUBLASLT_REDUCTION_SCHEME_NONE |
                                        CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  std::vector<cublasLtMatmulHeuristicResult_t> ranked;
  if (invariant && m != kFp8InvariantRows) {
    Fp8Shape reference(dt, kFp8InvariantRows, n, k, n, epilogue);
    reference.point(w_scales, row_scales, bias);
    ranked = lt_ranked(cublaslt_, reference, workspace, schemes, 1);
    // That algorithm must run at this row count as it is; where it cannot, this row count's own
    // first one (still without workspace or split), which the invariance tests would catch
    // giving other bits.
    cublasLtMatmulHeuristicResult_t check{};
    if (!ranked.empty() &&
        (cublasLtMatmulAlgoCheck(cublaslt_, shape->desc, shape->w, shape->a, shape->c, shape->c,
                                 &ranked[0].algo, &check) != CUBLAS_STATUS_SUCCESS ||
         check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize != 0)) {
      ranked.clear();
    }
  }
  if (ranked.empty()) ranked = lt_ranked(cublaslt_, *shape, workspace, schemes, 1);
  if (!ranked.empty()) {
    shape->algo = ranked[0].algo;
    shape->workspace = ranked[0].workspaceSize;
    shape->found = true;
  }
  return *fp8_shapes_.emplace(key, std::move(shape)).first->second;
}

void* CudaBackend::fp8_rows(size_t bytes) {
  if (fp8_rows_.empty() || fp8_rows_bytes_ < bytes) {
    // Grown, never shrunk or freed while the backend lives: recordings made earlier keep the
    // address they captured.
    const size_t grown = std::max(bytes, fp8_rows_bytes_ * 2);
    void* p = nullptr;
    FTBERT_CUDA_CHECK(cudaMalloc(&p, grown));
    fp8_rows_.push_back(p);
    fp8_rows_bytes_ = grown;
  }
  return fp8_rows_.back();
}

size_t CudaBackend::gemm_input_codes_bytes(int64_t rows, int k) const {
  if (quantization_ != Quantization::kFp8 || k % 16 != 0) return 0;
  return align16(static_cast<size_t>(rows) * k) + static_cast<size_t>(rows) * sizeof(float);
}

void CudaBackend::fp8_weight_gemm(const WeightGemm& g, int lda, int ldc, const void* a_codes) {
  DeviceScope scope(device_);
  FTBERT_CHECK(lda % 8 == 0 && is_aligned(g.a, 16) && is_aligned(g.c, 16) && ldc % 8 == 0,
               "fp8 weight GEMM: activations and outputs need 16-byte aligned rows (lda "
                   << lda << ", ldc " << ldc << ")");
  // The rows in e4m3: as the op that wrote them left them, else quantized here.
  E4m3Rows rows = e4m3_rows(const_cast<void*>(a_codes), g.m, g.k);
  if (rows.codes == nullptr) {
    rows = e4m3_rows(fp8_rows(gemm_input_codes_bytes(g.m, g.k)), g.m, g.k);
    if (g.dt == DType::kFloat16) {
      invoke_quantize_rows_e4m3(static_cast<const __half*>(g.a), lda, g.m, g.k, rows, stream_);
    } else {
      invoke_quantize_rows_e4m3(static_cast<const __nv_bfloat16*>(g.a), lda, g.m, g.k, rows,
                                stream_);
    }
  }
  const unsigned char* q = rows.codes;
  const float* row_scales = rows.scales;
  const auto* w = static_cast<const unsigned char*>(g.w);
  const auto* w_scales = reinterpret_cast<const float*>(w + align16(static_cast<size_t>(g.n) * g.k));

  const bool has_bias = g.bias != nullptr;
  const bool invariant = batch_invariant_;
  cublasLtEpilogue_t epilogue = fp8_epilogue(has_bias, g.act);
  Fp8Shape* shape = &fp8_shape(g.dt, g.m, g.n, g.k, ldc, epilogue, invariant, w_scales,
                               row_scales, g.bias);
  if (!shape->found && epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // no kernel with that epilogue: a second op adds it
    shape = &fp8_shape(g.dt, g.m, g.n, g.k, ldc, epilogue, invariant, w_scales, row_scales,
                       g.bias);
  }
  FTBERT_CHECK(shape->found, "fp8 weight GEMM: cuBLASLt has no algorithm for m=" << g.m << ", n="
                                 << g.n << ", k=" << g.k << " on " << device_name_);
  shape->point(w_scales, row_scales, g.bias);
  // The measured pick of the row bucket where there is one (it may refuse a row count or ldc of
  // its bucket), else the rule.
  const GemmPick* pick = measured_fp8_pick(g, epilogue, invariant);
  if (pick == nullptr || !run_fp8(*shape, pick->algo, pick->workspace, w, q, g.c)) {
    FTBERT_CHECK(run_fp8(*shape, shape->algo, shape->workspace, w, q, g.c),
                 "fp8 weight GEMM: cuBLASLt refused its own algorithm for m="
                     << g.m << ", n=" << g.n << ", k=" << g.k << ", ldc=" << ldc);
  }
  if (has_bias && epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
    FTBERT_CHECK(ldc == g.n, "fp8 weight GEMM: a bias after the product needs ldc == n");
    add_bias_activation(g.dt, g.c, g.bias, g.m, g.n, g.act);
  }
}

bool CudaBackend::run_fp8(Fp8Shape& shape, const cublasLtMatmulAlgo_t& algo, size_t workspace,
                          const void* w, const void* q, void* c) {
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(cublaslt_, shape.desc, &alpha, w, shape.w, q, shape.a, &beta, c, shape.c, c,
                     shape.c, &algo, workspace > 0 ? cublas_workspace_ : nullptr, workspace,
                     stream_);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;
  FTBERT_CUBLAS_CHECK(status);
  return true;
}

const GemmPick* CudaBackend::measured_fp8_pick(const WeightGemm& g, cublasLtEpilogue_t epilogue,
                                               bool invariant) {
  // As the 16-bit GEMMs: few rows keep the rule, except under batch invariance, where the rule's
  // algorithm is the one ranked at kFp8InvariantRows and every bucket is measured. A bias alone
  // (no activation) is not a key of the tuner's.
  if (!measure_gemms_ || epilogue == CUBLASLT_EPILOGUE_BIAS ||
      (!invariant && g.m < kTunedMinRows)) {
    return nullptr;
  }
  GemmShapeKey key{device_, g.dt, rows_bucket(g.m), g.n, g.k,
                   epilogue == CUBLASLT_EPILOGUE_DEFAULT ? Activation::kIdentity : g.act};
  key.invariant = invariant;
  key.fp8 = true;
  if (const GemmPick* found = GemmPicks::find(key)) return found;
  if (gemm_tuning_inline()) return GemmPicks::measure_and_wait(key);
  GemmPicks::request(key);  // measured on the tuner's thread; this GEMM runs the rule
  return nullptr;
}

GemmPick CudaBackend::measure_fp8_gemm(const GemmShapeKey& key) {
  DeviceScope scope(device_);
  const int m = key.rows_bucket, n = key.n, k = key.k;
  const bool has_bias = key.act != Activation::kIdentity;
  const cublasLtEpilogue_t epilogue = fp8_epilogue(has_bias, key.act);
  const size_t es = dtype_size(key.dt);
  const int checked_rows = key.invariant ? std::max(m, kInvariantCheckedRows) : m;
  // The quantized rows [checked_rows, k] and their scales; Wᵀ [n, k] and its scales (as
  // upload_weight lays them out); the bias; c; and for invariant keys the reference's c and a count.
  const size_t q_bytes = align16(static_cast<size_t>(checked_rows) * k);
  const size_t w_bytes = align16(static_cast<size_t>(n) * k);
  const size_t out_bytes = static_cast<size_t>(checked_rows) * n * es;
  const size_t count_at = (out_bytes + 255) / 256 * 256;
  const size_t need[5] = {q_bytes + static_cast<size_t>(checked_rows) * sizeof(float),
                          w_bytes + static_cast<size_t>(n) * sizeof(float),
                          static_cast<size_t>(n) * es, out_bytes,
                          key.invariant ? count_at + sizeof(int) : 0};
  grow_tuning_operands(need);
  auto* q = static_cast<unsigned char*>(tuning_operands_[0]);
  auto* row_scales = reinterpret_cast<float*>(q + q_bytes);
  auto* w = static_cast<unsigned char*>(tuning_operands_[1]);
  auto* w_scales = reinterpret_cast<float*>(w + w_bytes);
  const void* bias = has_bias ? tuning_operands_[2] : nullptr;
  void* const c = tuning_operands_[3];
  // The 16-bit measurement's magnitudes (weight_gemm.cu): rows ~1.7, weights ~0.05, bias ~0.1.
  fill_e4m3(q, static_cast<size_t>(checked_rows) * k, 0x9e3779b9u, stream_);
  fill_value(row_scales, checked_rows, 1.7f / kE4m3Max, stream_);
  fill_e4m3(w, static_cast<size_t>(n) * k, 0x9e3779b9u * 2, stream_);
  fill_value(w_scales, n, 0.05f / kE4m3Max, stream_);
  if (has_bias) fill_uniform(key.dt, tuning_operands_[2], n, 0x9e3779b9u * 3, 0.1f, stream_);

  // The rule: what fp8_weight_gemm runs at this row count until a pick is published.
  Fp8Shape& rule = fp8_shape(key.dt, m, n, k, n, epilogue, key.invariant, w_scales, row_scales,
                             bias);
  FTBERT_CHECK(rule.found, "fp8 weight GEMM: cuBLASLt has no algorithm for m=" << m << ", n=" << n
                               << ", k=" << k << " on " << device_name_);
  const GemmPick rule_pick{"cublaslt-fp8-rule", GemmKernel::kCublasLtFp8, rule.algo, {},
                           rule.workspace};
  const uint32_t schemes = key.invariant ? CUBLASLT_REDUCTION_SCHEME_NONE
                                         : (CUBLASLT_REDUCTION_SCHEME_NONE |
                                            CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  rule.point(w_scales, row_scales, bias);
  // Given no workspace, as the 16-bit candidates are timed (measure_gemm): in a recorded forward
  // an algorithm that clears its workspace adds a memset node and its edges.
  const std::vector<cublasLtMatmulHeuristicResult_t> ranked =
      lt_ranked(cublaslt_, rule, 0, schemes, kFp8Candidates);

  // Batch invariance: a candidate must give the reference's bits on checked_rows rows, on
  // products of a model's size (|a·W| ~ 2, where GELU bends).
  std::optional<Fp8Shape> checked;
  void* const reference_out = tuning_operands_[4];
  int* const differing =
      key.invariant ? reinterpret_cast<int*>(static_cast<char*>(reference_out) + count_at) : nullptr;
  if (key.invariant) {
    fill_value(w_scales, n, 3.5f / std::sqrt(static_cast<float>(k)) / kE4m3Max, stream_);
    checked.emplace(key.dt, checked_rows, n, k, n, epilogue);
    checked->point(w_scales, row_scales, bias);
    FTBERT_CHECK(run_fp8(*checked, rule.algo, rule.workspace, w, q, reference_out),
                 "batch_invariant: the FP8 reference refused " << checked_rows << " rows");
  }
  const auto gives_reference_bits = [&](const cublasLtMatmulAlgo_t& algo) {
    if (lt_splits_k(algo)) return false;
    FTBERT_CUDA_CHECK(cudaMemsetAsync(c, 0xff, out_bytes, stream_));
    if (!run_fp8(*checked, algo, 0, w, q, c)) return false;
    int count = 0;
    FTBERT_CUDA_CHECK(cudaMemsetAsync(differing, 0, sizeof(int), stream_));
    count_differing_bits(c, reference_out, out_bytes / es, differing, stream_);
    FTBERT_CUDA_CHECK(cudaMemcpyAsync(&count, differing, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    FTBERT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return count == 0;
  };
  std::vector<GemmPick> candidates{rule_pick};  // its time is the bar
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (key.invariant && !gives_reference_bits(ranked[i].algo)) continue;
    candidates.push_back({kFp8CandidatePrefix + std::to_string(i), GemmKernel::kCublasLtFp8,
                          ranked[i].algo, {}, 0});
  }
  if (key.invariant) fill_value(w_scales, n, 0.05f / kE4m3Max, stream_);
  std::vector<std::function<bool()>> runs;
  for (const GemmPick& p : candidates) {
    runs.push_back([&, p] { return run_fp8(rule, p.algo, p.workspace, w, q, c); });
  }
  const std::vector<float> ms = time_candidates(stream_, runs);
  const size_t best = std::min_element(ms.begin(), ms.end()) - ms.begin();
  return ms[best] < (1.0f - kRuleMargin) * ms[0] ? candidates[best] : rule_pick;
}

}  // namespace ftbert::cuda
