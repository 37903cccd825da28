// CudaBackend: device/stream/cuBLAS state, the row-major -> cuBLAS GEMM mapping, and dtype
// dispatch onto the kernel launchers (cpp/cuda/kernels/) and the fused attention
// (cpp/cuda/attention/flash.h).
#include "cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/attention/flash.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm/split_k.h"
#if FTBERT_GEMM_SM90
#include "cuda/gemm/gemm_sm90.h"
#endif
#include "cuda/kernels/kernels.h"
#include "cuda/launch.cuh"

namespace ftbert::cuda {
namespace {

cudaDataType_t cuda_data_type(DType dt) {
  switch (dt) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
  }
  FTBERT_FAIL("unknown dtype " << static_cast<int>(dt));
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the CUDA storage type of dt.
template <typename F>
void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
  }
  FTBERT_FAIL("unknown dtype " << static_cast<int>(dt));
}

}  // namespace

// ---- device scope -------------------------------------------------------------------------------

CudaBackend::DeviceScope::DeviceScope(int device) {
  int current = -1;
  FTBERT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    FTBERT_CUDA_CHECK(cudaSetDevice(device));
    previous_ = current;
  }
}

CudaBackend::DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // best effort: destructors must not throw
}

// ---- lifetime -----------------------------------------------------------------------------------

CudaBackend::CudaBackend(int device_index) : device_(device_index) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later CUDA calls in the process do not see it
    FTBERT_FAIL("no CUDA device: cudaGetDeviceCount returned " << cudaGetErrorName(err) << " ("
                                                                << cudaGetErrorString(err) << ")");
  }
  FTBERT_CHECK(count > 0, "no CUDA device: cudaGetDeviceCount found 0 devices");
  FTBERT_CHECK(device_index >= 0 && device_index < count,
               "CUDA device index " << device_index << " out of range (" << count << " devices)");

  if (const char* choice = std::getenv("FTBERT_GEMM_CHOICE"); choice != nullptr && *choice) {
    FTBERT_CHECK_INPUT(std::string(choice) == "auto" || std::string(choice) == "fixed",
                       "FTBERT_GEMM_CHOICE must be 'auto' or 'fixed', got '" << choice << "'");
    measure_gemms_ = std::string(choice) == "auto";
  }
  (void)gemm_tuning_inline();  // checks FTBERT_GEMM_TUNING now rather than at a first forward
  DeviceScope scope(device_);
  cudaDeviceProp prop{};
  FTBERT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  compute_capability_major_ = prop.major;
  compute_capability_minor_ = prop.minor;
  sm_count_ = prop.multiProcessorCount;
#if FTBERT_GEMM_SM90
  fused_gemm_sm90_ = prop.major == 9 && prop.minor == 0;  // sm_90a code runs on 9.0 only
#endif
  try {
    FTBERT_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
    stream_ = own_stream_;
    FTBERT_CUDA_CHECK(cudaEventCreateWithFlags(&switch_event_, cudaEventDisableTiming));
    FTBERT_CUBLAS_CHECK(cublasCreate(&cublas_));
    FTBERT_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
    // cuBLAS's recommended workspace: 32 MiB on Hopper, 4 MiB before.
    cublas_workspace_bytes_ = size_t{prop.major >= 9 ? 32 : 4} << 20;
    FTBERT_CUDA_CHECK(cudaMalloc(&cublas_workspace_, cublas_workspace_bytes_));
    bind_cublas(stream_);
    // fp32 accumulation all the way: no split-K reductions in fp16/bf16.
    FTBERT_CUBLAS_CHECK(cublasSetMathMode(
        cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
  if (measure_gemms_) load_gemm_picks();
}

CudaBackend::~CudaBackend() {
  // No DeviceScope here (it may throw): set the device by hand, ignoring failures.
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  release();
  if (switched) (void)cudaSetDevice(current);
}

void CudaBackend::release() noexcept {
  for (void*& p : tuning_operands_) {
    if (p != nullptr && own_stream_ != nullptr) (void)cudaFreeAsync(p, own_stream_);
    p = nullptr;
  }
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  if (cublaslt_ != nullptr) (void)cublasLtDestroy(cublaslt_);
  if (cublas_workspace_ != nullptr) (void)cudaFree(cublas_workspace_);
  fp8_shapes_.clear();
  for (void* p : fp8_rows_) (void)cudaFree(p);
  fp8_rows_.clear();
  if (capture_stream_ != nullptr) (void)cudaStreamDestroy(capture_stream_);
  if (own_stream_ != nullptr) (void)cudaStreamDestroy(own_stream_);
  if (switch_event_ != nullptr) (void)cudaEventDestroy(switch_event_);
  switch_event_ = nullptr;
  cublas_ = nullptr;
  cublaslt_ = nullptr;
  cublas_workspace_ = nullptr;
  capture_stream_ = nullptr;
  own_stream_ = nullptr;
  stream_ = nullptr;
}

void CudaBackend::bind_cublas(cudaStream_t stream) {
  FTBERT_CUBLAS_CHECK(cublasSetStream(cublas_, stream));
  FTBERT_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, cublas_workspace_bytes_));
}

bool CudaBackend::supports_dtype(DType dt) const {
  // bf16 kernels and cuBLAS bf16 GEMMs need compute capability 8.0 (Ampere) or newer.
  return dt != DType::kBFloat16 || compute_capability_major_ >= 8;
}

// ---- memory -------------------------------------------------------------------------------------

void* CudaBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  DeviceScope scope(device_);
  void* ptr = nullptr;
  FTBERT_CUDA_CHECK(cudaMalloc(&ptr, bytes));
  return ptr;
}

void CudaBackend::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  (void)cudaFree(ptr);  // cannot throw here; an error would also surface on the next checked call
  if (switched) (void)cudaSetDevice(current);
}

void CudaBackend::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  DeviceScope scope(device_);
  FTBERT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceScope scope(device_);
  FTBERT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceScope scope(device_);
  FTBERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::synchronize() {
  DeviceScope scope(device_);
  FTBERT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

int32_t* CudaBackend::allocate_host_flag(size_t words) {
  DeviceScope scope(device_);
  void* p = nullptr;
  FTBERT_CUDA_CHECK(cudaHostAlloc(&p, words * sizeof(int32_t), cudaHostAllocMapped));
  std::memset(p, 0, words * sizeof(int32_t));
  return static_cast<int32_t*>(p);
}

void CudaBackend::free_host_flag(int32_t* flag) noexcept {
  if (flag != nullptr) (void)cudaFreeHost(flag);
}

int32_t* CudaBackend::host_flag_device_address(int32_t* flag) {
  DeviceScope scope(device_);
  void* device = nullptr;
  FTBERT_CUDA_CHECK(cudaHostGetDevicePointer(&device, flag, 0));
  return static_cast<int32_t*>(device);
}

void CudaBackend::set_stream(uintptr_t stream) {
  DeviceScope scope(device_);
  // 0 is the legacy default stream, which is what torch's default stream is: work queued by the
  // caller there must be ordered with ours, so 0 is taken literally, not as "our own stream".
  cudaStream_t next = reinterpret_cast<cudaStream_t>(stream);
  if (next == stream_) return;
  // The next stream waits for everything queued so far on the last one: the buffers they share
  // (staged inputs, workspace, outputs) are then never read and written by two streams at once.
  FTBERT_CUDA_CHECK(cudaEventRecord(switch_event_, stream_));
  FTBERT_CUDA_CHECK(cudaStreamWaitEvent(next, switch_event_, 0));
  bind_cublas(next);
  stream_ = next;
}

// ---- recording ----------------------------------------------------------------------------------

namespace {
// The executable graph, the graph it came from (whose nodes the noted launches name) and, for a
// redirectable recording, its noted launches and the addresses they were last given.
class CudaGraph final : public RecordedOps {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, std::vector<const void*> redirectable,
            std::vector<std::unique_ptr<NotedLaunch>> launches)
      : graph_(graph), exec_(exec), redirectable_(std::move(redirectable)),
        launches_(std::move(launches)), applied_(redirectable_.size(), nullptr) {}
  ~CudaGraph() override {
    (void)cudaGraphExecDestroy(exec_);
    (void)cudaGraphDestroy(graph_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }

  // Gives the noted launches this replay's addresses (when they differ from the last ones).
  void redirect(const std::vector<Redirect>& redirects) const {
    bool changed = false;
    for (size_t i = 0; i < redirectable_.size(); ++i) {
      void* to = nullptr;
      for (const Redirect& r : redirects) {
        if (r.recorded == redirectable_[i]) to = r.replayed;
      }
      FTBERT_CHECK(to != nullptr, "replay: the recording's redirectable address "
                                      << redirectable_[i] << " was given no replay address");
      changed = changed || to != applied_[i];
      applied_[i] = to;
    }
    if (!changed) return;
    for (const auto& launch : launches_) FTBERT_CUDA_CHECK(launch->apply(exec_, redirects));
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::vector<const void*> redirectable_;
  std::vector<std::unique_ptr<NotedLaunch>> launches_;
  mutable std::vector<void*> applied_;  // replays run one at a time (the session's)
};
}  // namespace

bool CudaBackend::records() const { return !sync_debug_enabled(); }

std::unique_ptr<RecordedOps> CudaBackend::record(const std::function<void()>& enqueue,
                                                 const std::vector<const void*>& redirectable) {
  if (sync_debug_enabled()) return nullptr;  // a stream cannot be synchronized while captured
  DeviceScope scope(device_);
  if (capture_stream_ == nullptr) {
    FTBERT_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  }
  cudaStream_t caller = stream_;
  bind_cublas(capture_stream_);
  stream_ = capture_stream_;
  LaunchNotes notes(redirectable);
  // Thread-local: work other threads (e.g. torch's) issue meanwhile is neither captured nor
  // restricted.
  cudaError_t err = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal);
  cudaGraph_t graph = nullptr;
  if (err == cudaSuccess) {
    try {
      LaunchNotes::Scope noting(notes);
      enqueue();
    } catch (...) {
      (void)cudaStreamEndCapture(capture_stream_, &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();  // a failed capture leaves a (non-sticky) error behind
      stream_ = caller;
      (void)cublasSetStream(cublas_, caller);  // best effort: the first error is the one to report
      (void)cublasSetWorkspace(cublas_, cublas_workspace_, cublas_workspace_bytes_);
      throw;
    }
    err = cudaStreamEndCapture(capture_stream_, &graph);
  }
  stream_ = caller;
  bind_cublas(caller);
  FTBERT_CUDA_CHECK(err);
  if (notes.failed()) {
    (void)cudaGraphDestroy(graph);
    FTBERT_FAIL("recording: a kernel that takes a redirectable address was not found in the graph");
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) (void)cudaGraphDestroy(graph);
  FTBERT_CUDA_CHECK(err);
  return std::make_unique<CudaGraph>(graph, exec, redirectable, notes.take());
}

void CudaBackend::replay(const RecordedOps& ops, const std::vector<Redirect>& redirects) {
  const auto* graph = dynamic_cast<const CudaGraph*>(&ops);
  FTBERT_CHECK(graph != nullptr, "replay: not a recording of the CUDA backend");
  DeviceScope scope(device_);
  graph->redirect(redirects);
  FTBERT_CUDA_CHECK(cudaGraphLaunch(graph->exec(), stream_));
}

// ---- GEMMs --------------------------------------------------------------------------------------
// cuBLAS is column-major; a row-major X with row stride ldx is, to cuBLAS, Xᵀ with the same
// leading dimension. So row-major C = op(A)·op(B) is computed as the column-major product
// Cᵀ = op(B)ᵀ·op(A)ᵀ: B and A swap places, m and n swap, and each keeps its own transpose flag.

void CudaBackend::gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                       int lda, const void* b, int ldb, void* c, int ldc, float alpha,
                       float beta) {
  FTBERT_CHECK(m >= 0 && n >= 0 && k >= 0,
               "gemm: negative size (m " << m << ", n " << n << ", k " << k << ")");
  if (m == 0 || n == 0) return;
  DeviceScope scope(device_);
  if (batch_invariant_) {
    // Plain 16-bit products of the weights' layout (heads, projections) on the fixed algorithm of
    // weight_gemm's; any other (float32, transposed or strided operands, rows of other widths than
    // invariant_kernels_take's) on the ordered kernel, which sums each element over k in order at
    // any shape.
    if (!trans_a && !trans_b && alpha == 1.0f && beta == 0.0f && k > 0 && lda == k && ldb == n &&
        ldc == n && (dt == DType::kFloat16 || dt == DType::kBFloat16) &&
        invariant_kernels_take(n, k)) {
      run_invariant_gemm({dt, m, n, k, a, b, nullptr, c, Activation::kIdentity});
      return;
    }
    dispatch_dtype(dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      invoke_ordered_batched_gemm<T>(trans_a, trans_b, m, n, k, static_cast<const T*>(a), lda, 0,
                                     static_cast<const T*>(b), ldb, 0, static_cast<T*>(c), ldc, 0,
                                     1, alpha, beta, stream_);
    });
    return;
  }
  const cudaDataType_t type = cuda_data_type(dt);
  const cublasComputeType_t compute = dt == DType::kFloat32 && allow_tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  FTBERT_CUBLAS_CHECK(cublasGemmEx(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, type,
                                   ldb, a, type, lda, &beta, c, type, ldc, compute,
                                   CUBLAS_GEMM_DEFAULT));
}

size_t CudaBackend::dense_residual_layernorm_workspace_bytes(int rows, int n) const {
  return dense_layernorm_workspace_bytes(rows, n);
}

void CudaBackend::dense_residual_layernorm(DType dt, int m, int n, int k, const void* a,
                                           const void* w, const void* bias, const void* residual,
                                           const void* gamma, const void* beta, void* out,
                                           float eps, void* workspace, size_t workspace_bytes,
                                           int32_t* nonfinite, void* product, void* out_codes) {
  const E4m3Rows codes = e4m3_rows(out_codes, m, n);
  // A split by the row count would change how a row's products are summed: none when invariant.
  // FP8 weights have no split form.
  const int splits = batch_invariant_ || fp8_weight(n, k) ? 1 : dense_layernorm_splits(m, n, k);
  if (splits <= 1 || workspace == nullptr ||
      workspace_bytes < dense_layernorm_partials_bytes(m, n, splits)) {
    // Unsplit, the LayerNorm adds the bias and the residual. Adding them in the GEMM's epilogue
    // instead (cuBLASLt, bias epilogue and the residual as C) spares the LayerNorm a read, but
    // the forward got no faster: cuBLASLt's algorithms with a C operand ran slower by more than
    // the LayerNorms saved (docs/performance.md, "Kernel choices").
    if (product == nullptr) product = out;
    weight_gemm(dt, m, n, k, a, k, w, product, n);
    DeviceScope scope(device_);
    dispatch_dtype(dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      invoke_dense_residual_layernorm<T>(
          static_cast<const T*>(product), static_cast<const T*>(residual),
          static_cast<const T*>(bias), static_cast<const T*>(gamma), static_cast<const T*>(beta),
          static_cast<T*>(out), m, n, eps, nonfinite, stream_, batch_invariant_, codes);
    });
    return;
  }
  DeviceScope scope(device_);
  // partials[s] [m, n] = a[:, s·kk : (s+1)·kk] · W[s·kk : (s+1)·kk, :], in fp32 (row-major as
  // cuBLAS's column-major transposes: see gemm above).
  const int kk = k / splits;
  const cudaDataType_t type = cuda_data_type(dt);
  const cublasComputeType_t compute = dt == DType::kFloat32 && allow_tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const float one = 1.0f, zero = 0.0f;
  float* partials = static_cast<float*>(workspace);
  FTBERT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, kk, &one, w, type, n,
      static_cast<int64_t>(kk) * n, a, type, k, kk, &zero, partials, CUDA_R_32F, n,
      static_cast<int64_t>(m) * n, splits, compute, CUBLAS_GEMM_DEFAULT));
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_partials_residual_layernorm<T>(
        partials, splits, static_cast<const T*>(residual), static_cast<const T*>(bias),
        static_cast<const T*>(gamma), static_cast<const T*>(beta), static_cast<T*>(out), m, n,
        eps, nonfinite, stream_);
    if (codes.codes != nullptr) invoke_quantize_rows_e4m3<T>(static_cast<T*>(out), n, m, n, codes, stream_);
  });
}

void CudaBackend::batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k,
                               const void* a, int lda, int64_t stride_a, const void* b, int ldb,
                               int64_t stride_b, void* c, int ldc, int64_t stride_c, int batch,
                               float alpha, float beta) {
  FTBERT_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0,
               "batched_gemm: negative size (m " << m << ", n " << n << ", k " << k << ", batch "
                                                 << batch << ")");
  if (m == 0 || n == 0 || batch == 0) return;
  DeviceScope scope(device_);
  if (batch_invariant_) {
    // cuBLAS's kernel, and so its order of sums, may change with m (DeBERTa's term tables take
    // every row of the batch, the unfused attention every sequence): the ordered kernel sums each
    // element the same way at any shape.
    dispatch_dtype(dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      invoke_ordered_batched_gemm<T>(trans_a, trans_b, m, n, k, static_cast<const T*>(a), lda,
                                     stride_a, static_cast<const T*>(b), ldb, stride_b,
                                     static_cast<T*>(c), ldc, stride_c, batch, alpha, beta,
                                     stream_);
    });
    return;
  }
  const cudaDataType_t type = cuda_data_type(dt);
  const cublasComputeType_t compute = dt == DType::kFloat32 && allow_tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  FTBERT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
      &alpha, b, type, ldb, stride_b, a, type, lda, stride_a, &beta, c, type, ldc, stride_c, batch,
      compute, CUBLAS_GEMM_DEFAULT));
}

// ---- fused ops ----------------------------------------------------------------------------------

void CudaBackend::stage_inputs(const void* ids, int ids_bytes, const void* mask, int mask_bytes,
                               const void* types, int types_bytes, int64_t n, int32_t* ids_out,
                               int32_t* mask_out, int32_t* types_out, int vocab, int type_vocab,
                               BadInputValue* bad) {
  DeviceScope scope(device_);
  invoke_stage_inputs(ids, ids_bytes, mask, mask_bytes, types, types_bytes, n, ids_out, mask_out,
                      types_out, vocab, type_vocab, bad, stream_);
}

void CudaBackend::pack_sequences(const int32_t* mask, int batch, int seq, int32_t* cu_seqlens,
                                 int32_t* token_index, int64_t capacity,
                                 int32_t* first_unattended) {
  DeviceScope scope(device_);
  invoke_pack_sequences(mask, batch, seq, cu_seqlens, token_index, capacity, first_unattended,
                        stream_);
}

void CudaBackend::first_tokens(DType dt, const void* x, const SequenceLayout& layout, void* out,
                               int hidden) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_first_tokens<T>(static_cast<const T*>(x), layout, static_cast<T*>(out), hidden,
                           stream_);
  });
}

void CudaBackend::mean_tokens(DType dt, const void* x, const SequenceLayout& layout, void* out,
                              int hidden) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_mean_tokens<T>(static_cast<const T*>(x), layout, static_cast<T*>(out), hidden,
                          stream_);
  });
}

void CudaBackend::unpack_rows(const void* in, const SequenceLayout& layout, void* out,
                              size_t row_bytes) {
  DeviceScope scope(device_);
  invoke_unpack_rows(in, layout, out, row_bytes, stream_);
}

void CudaBackend::clear_rows_past_tokens(void* x, const SequenceLayout& layout,
                                         size_t row_bytes) {
  DeviceScope scope(device_);
  invoke_clear_rows_past_tokens(x, layout, row_bytes, stream_);
}

void CudaBackend::embed_layernorm(DType dt, const int32_t* input_ids, const int32_t* token_type_ids,
                                  const void* word, const void* position, const void* token_type,
                                  const void* gamma, const void* beta, void* out,
                                  const SequenceLayout& layout, int hidden, int vocab,
                                  int type_vocab, float eps, int position_pad_id,
                                  void* out_codes) {
  DeviceScope scope(device_);
  const E4m3Rows codes = e4m3_rows(out_codes, layout.rows, hidden);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_embed_layernorm<T>(input_ids, token_type_ids, static_cast<const T*>(word),
                              static_cast<const T*>(position), static_cast<const T*>(token_type),
                              static_cast<const T*>(gamma), static_cast<const T*>(beta),
                              static_cast<T*>(out), layout, hidden, vocab, type_vocab, eps,
                              position_pad_id, stream_, codes);
  });
}

void CudaBackend::add_qkv_bias_transpose(DType dt, const void* qkv, const void* bias, void* q,
                                         void* k, void* v, const SequenceLayout& layout,
                                         int heads, int head_dim) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_add_qkv_bias_transpose<T>(static_cast<const T*>(qkv), static_cast<const T*>(bias),
                                     static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v),
                                     layout, heads, head_dim, stream_);
  });
}

void CudaBackend::disentangled_scores(DType dt, void* scores, int batch, int heads, int seq,
                                      const DisentangledTerms& terms) {
  FTBERT_CHECK(terms.rows == seq && terms.column != nullptr &&
                   (terms.c2p != nullptr || terms.p2c != nullptr),
               "disentangled_scores: terms for " << terms.rows << " rows, expected one per "
                                                 << "position (" << seq << ") and a table");
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_disentangled_scores<T>(static_cast<T*>(scores), static_cast<const T*>(terms.c2p),
                                  static_cast<const T*>(terms.p2c), terms.column, batch, heads,
                                  seq, terms.width, terms.first, stream_);
  });
}

void CudaBackend::masked_softmax(DType dt, void* scores, const SequenceLayout& layout, int heads,
                                 float scale, const AttentionOptions& options) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_masked_softmax<T>(static_cast<T*>(scores), layout.mask, layout.batch, heads,
                             layout.max_seq, scale, options.relative_bias,
                             options.relative_span, options.window, batch_invariant_, stream_);
  });
}

void CudaBackend::transpose_heads(DType dt, const void* in, void* out,
                                  const SequenceLayout& layout, int heads, int head_dim) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_transpose_heads<T>(static_cast<const T*>(in), static_cast<T*>(out), layout, heads,
                              head_dim, stream_);
  });
}

void CudaBackend::add_bias_residual_layernorm(DType dt, void* x, const void* residual,
                                              const void* bias, const void* gamma,
                                              const void* beta, int rows, int hidden, float eps,
                                              int32_t* nonfinite) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_add_bias_residual_layernorm<T>(static_cast<T*>(x), static_cast<const T*>(residual),
                                          static_cast<const T*>(bias),
                                          static_cast<const T*>(gamma),
                                          static_cast<const T*>(beta), rows, hidden, eps,
                                          nonfinite, stream_, batch_invariant_);
  });
}

void CudaBackend::rotary_embedding(DType dt, void* qkv, const float* rotary,
                                   const SequenceLayout& layout, int heads, int head_dim,
                                   const void* bias, const RotaryDynamic& dynamic) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_rotary_embedding<T>(static_cast<T*>(qkv), rotary, layout, heads, head_dim, stream_,
                               static_cast<const T*>(bias), dynamic);
  });
}

void CudaBackend::gated_activation(DType dt, const void* x, void* out, int rows, int n,
                                   Activation act) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_gated_activation<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, n, act,
                               stream_);
  });
}

void CudaBackend::residual_add_layernorm(DType dt, void* residual, const void* x, const void* bias,
                                         const void* gamma, const void* beta, void* out, int rows,
                                         int hidden, float eps, int32_t* nonfinite) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_residual_add_layernorm<T>(static_cast<T*>(residual), static_cast<const T*>(x),
                                     static_cast<const T*>(bias), static_cast<const T*>(gamma),
                                     static_cast<const T*>(beta), static_cast<T*>(out), rows,
                                     hidden, eps, nonfinite, stream_);
  });
}

void CudaBackend::residual_add_rmsnorm(DType dt, void* residual, const void* x, const void* bias,
                                       const void* gamma, void* out, int rows, int hidden,
                                       float eps, int32_t* nonfinite) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_residual_add_rmsnorm<T>(static_cast<T*>(residual), static_cast<const T*>(x),
                                   static_cast<const T*>(bias), static_cast<const T*>(gamma),
                                   static_cast<T*>(out), rows, hidden, eps, nonfinite, stream_);
  });
}

void CudaBackend::embed_rmsnorm(DType dt, const int32_t* input_ids, const void* word,
                                const void* gamma, void* embedded, void* out,
                                const SequenceLayout& layout, int hidden, int vocab, float eps) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_embed_rmsnorm<T>(input_ids, static_cast<const T*>(word), static_cast<const T*>(gamma),
                            static_cast<T*>(embedded), static_cast<T*>(out), layout, hidden, vocab,
                            eps, stream_);
  });
}

void CudaBackend::add_bias_activation(DType dt, void* x, const void* bias, int rows, int cols,
                                      Activation act) {
  DeviceScope scope(device_);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    invoke_add_bias_activation<T>(static_cast<T*>(x), static_cast<const T*>(bias), rows, cols, act,
                                  stream_);
  });
}

// ---- fused attention ----------------------------------------------------------------------------

bool CudaBackend::supports_attention(AttentionKind kind, DType dt, int head_dim) const {
  return attention_unsupported_reason(kind, dt, head_dim).empty();
}

std::string CudaBackend::attention_unsupported_reason(AttentionKind kind, DType dt,
                                                      int head_dim) const {
  if (kind == AttentionKind::kUnfused) return "";
  if (kind == AttentionKind::kFlash) return flash_attention_unsupported_reason(dt, head_dim);
  return "unknown attention kind " + std::to_string(static_cast<int>(kind));
}

bool CudaBackend::flash_computes_terms(DType dt, int head_dim) const {
  return cuda::flash_computes_terms(dt, head_dim);
}

void CudaBackend::flash_attention(DType dt, const void* qkv, const void* qkv_bias, void* out,
                                  const SequenceLayout& layout, int heads, int head_dim,
                                  float scale, const AttentionOptions& options) {
  const std::string why = flash_attention_unsupported_reason(dt, head_dim);
  FTBERT_CHECK(why.empty(), "flash attention on " << device_name_ << ": " << why);
  DeviceScope scope(device_);
  invoke_flash_attention(dt, qkv, qkv_bias, out, layout, heads, head_dim, scale, options,
                         stream_, batch_invariant_);
}

}  // namespace ftbert::cuda

extern "C" __attribute__((visibility("default"))) ftbert::Backend* ftbert_create_cuda_backend(
    int device_index) {
  return new ftbert::cuda::CudaBackend(device_index);
}
