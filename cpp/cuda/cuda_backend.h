// The CUDA backend: cuBLAS GEMMs (fp32 accumulation) and the kernels of cpp/cuda/kernels/, all
// enqueued on one stream (the backend's own, or one set with set_stream). Built into
// libftbert_cuda.so, which the core loads on demand through ftbert_create_cuda_backend().
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/gemm/gemm_tuner.h"
#include "ftbert/backend.h"

namespace ftbert::cuda {

class CudaBackend;

// The weight GEMM choice as the op tests and benchmarks reach it (gemm_choice.h), over the
// backend's own picks and candidates (gemm/weight_gemm.cu).
class CudaGemmChoice final : public GemmChoiceControl {
 public:
  explicit CudaGemmChoice(CudaBackend& backend) : backend_(backend) {}
  void set_mode(const std::string& mode) override;
  std::string mode() const override;
  std::vector<std::string> candidates(DType dt, int m, int n, int k, Activation act) override;
  std::string pick(DType dt, int m, int n, int k, Activation act) const override;
  bool run_candidate(const std::string& name, DType dt, int m, int n, int k, const void* a,
                     const void* w, void* c, const void* bias, Activation act) override;

 private:
  CudaBackend& backend_;
};

class CudaBackend : public Backend {
 public:
  // Throws ftbert::Error when there is no such device or the CUDA context cannot be set up.
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  bool supports_dtype(DType dt) const override;
  int device_index() const { return device_; }

  // ---- memory -------------------------------------------------------------------------------
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  // Asynchronous in stream order (pageable host memory makes the runtime stage the copy).
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy_on_device(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  int32_t* allocate_host_flag(size_t words = 1) override;
  void free_host_flag(int32_t* flag) noexcept override;
  int32_t* host_flag_device_address(int32_t* flag) override;
  void set_stream(uintptr_t stream) override;
  uintptr_t stream() const override { return reinterpret_cast<uintptr_t>(stream_); }
  uintptr_t own_stream() const override { return reinterpret_cast<uintptr_t>(own_stream_); }
  void set_allow_tf32(bool allow) override { allow_tf32_ = allow; }
  // Batch-invariant: float16/bfloat16 weight GEMMs on one cuBLASLt algorithm per (n, k)
  // (weight_gemm.cu), other products (float32, the unfused attention's, DeBERTa's term tables) on
  // the ordered kernel (kernels/ordered_gemm.cu), the LayerNorms in one form, the softmax's
  // ordered variant, the flash kernel fixed per head dim.

  // ---- quantized weights: "fp8" (gemm/fp8_gemm.cu) -----------------------------------------
  std::string quantization_unsupported_reason(Quantization q, DType dt) const override;
  size_t weight_bytes(DType dt, int k, int n) const override;
  void upload_weight(DType dt, const void* host_w, int k, int n, void* dst) override;

  // ---- recording: CUDA graphs ---------------------------------------------------------------
  // Captured on a private stream (capture cannot run on the legacy default stream, torch's
  // default), replayed on the current one. Redirects set the noted kernels' parameters in the
  // executable graph before its launch (launch.cuh).
  using Device::record;
  using Device::replay;
  std::unique_ptr<RecordedOps> record(const std::function<void()>& enqueue,
                                      const std::vector<const void*>& redirectable) override;
  bool records() const override;
  void replay(const RecordedOps& ops, const std::vector<Redirect>& redirects) override;

  // ---- GEMMs ----------------------------------------------------------------------------------
  void gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda,
            const void* b, int ldb, void* c, int ldc, float alpha = 1.0f,
            float beta = 0.0f) override;
  // float16/bfloat16, no bias or bias + erf-GELU / tanh-GELU / ReLU (cpp/cuda/gemm/weight_gemm.cu):
  // the kernel per shape measured (gemm_tuner.h; cuBLASLt's candidates fuse tanh-GELU and ReLU)
  // or by the fixed rule: FFN-in (bias + erf-GELU) on Hopper as one CUTLASS kernel for the row
  // counts gemm_sm90.h names, otherwise cuBLAS (then the op).
  // Under "fp8", W [k, n] with k and n multiples of 16 is e4m3 (gemm/fp8_gemm.cu).
  void weight_gemm(DType dt, int m, int n, int k, const void* a, int lda, const void* w, void* c,
                   int ldc, const void* bias = nullptr, Activation act = Activation::kIdentity,
                   const void* a_codes = nullptr) override;
  // "fp8": e4m3 codes [rows, k] (16-byte aligned), then rows float32 scales.
  size_t gemm_input_codes_bytes(int64_t rows, int k) const override;
  GemmChoiceControl* gemm_choice_control() override { return &gemm_choice_; }
  // ---- forwards and measured choices (gemm_tuner.h) ---------------------------------------
  uint64_t begin_forward() override;
  void end_forward() override;
  void wait_for_tuning() override;
  std::map<std::string, int64_t> tuning_counters() const override;
  // The tuner's side: times the candidates of `key` at its bucket's row count, on this backend's
  // stream and operands of its own, and keeps the fixed rule's kernel unless one is kRuleMargin
  // faster; and the cache file this backend's picks go to.
  GemmPick measure_gemm(const GemmShapeKey& key);
  GemmCacheFile gemm_cache_file() const;

  // Few rows (gemm/split_k.h): the GEMM split over k into fp32 partials that the LayerNorm sums.
  size_t dense_residual_layernorm_workspace_bytes(int rows, int n) const override;
  void dense_residual_layernorm(DType dt, int m, int n, int k, const void* a, const void* w,
                                const void* bias, const void* residual, const void* gamma,
                                const void* beta, void* out, float eps, void* workspace,
                                size_t workspace_bytes, int32_t* nonfinite = nullptr,
                                void* product = nullptr, void* out_codes = nullptr) override;
  void batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                    int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b, void* c,
                    int ldc, int64_t stride_c, int batch, float alpha = 1.0f,
                    float beta = 0.0f) override;

  // ---- fused ops ------------------------------------------------------------------------------
  void stage_inputs(const void* ids, int ids_bytes, const void* mask, int mask_bytes,
                    const void* types, int types_bytes, int64_t n, int32_t* ids_out,
                    int32_t* mask_out, int32_t* types_out, int vocab, int type_vocab,
                    BadInputValue* bad) override;
  void pack_sequences(const int32_t* mask, int batch, int seq, int32_t* cu_seqlens,
                      int32_t* token_index, int64_t capacity,
                      int32_t* first_unattended = nullptr) override;
  void first_tokens(DType dt, const void* x, const SequenceLayout& layout, void* out,
                    int hidden) override;
  void mean_tokens(DType dt, const void* x, const SequenceLayout& layout, void* out,
                   int hidden) override;
  void unpack_rows(const void* in, const SequenceLayout& layout, void* out,
                   size_t row_bytes) override;
  void clear_rows_past_tokens(void* x, const SequenceLayout& layout, size_t row_bytes) override;
  void embed_layernorm(DType dt, const int32_t* input_ids, const int32_t* token_type_ids,
                       const void* word, const void* position, const void* token_type,
                       const void* gamma, const void* beta, void* out,
                       const SequenceLayout& layout, int hidden, int vocab, int type_vocab,
                       float eps, int position_pad_id = -1,
                       void* out_codes = nullptr) override;
  void add_qkv_bias_transpose(DType dt, const void* qkv, const void* bias, void* q, void* k,
                              void* v, const SequenceLayout& layout, int heads,
                              int head_dim) override;
  void masked_softmax(DType dt, void* scores, const SequenceLayout& layout, int heads,
                      float scale, const AttentionOptions& options) override;
  void disentangled_scores(DType dt, void* scores, int batch, int heads, int seq,
                           const DisentangledTerms& terms) override;
  void transpose_heads(DType dt, const void* in, void* out, const SequenceLayout& layout,
                       int heads, int head_dim) override;
  void add_bias_residual_layernorm(DType dt, void* x, const void* residual, const void* bias,
                                   const void* gamma, const void* beta, int rows, int hidden,
                                   float eps, int32_t* nonfinite = nullptr) override;
  void rotary_embedding(DType dt, void* qkv, const float* rotary, const SequenceLayout& layout,
                        int heads, int head_dim, const void* bias = nullptr,
                        const RotaryDynamic& dynamic = {}) override;
  void gated_activation(DType dt, const void* x, void* out, int rows, int n,
                        Activation act) override;
  void residual_add_layernorm(DType dt, void* residual, const void* x, const void* bias,
                              const void* gamma, const void* beta, void* out, int rows,
                              int hidden, float eps, int32_t* nonfinite = nullptr) override;
  void residual_add_rmsnorm(DType dt, void* residual, const void* x, const void* bias,
                            const void* gamma, void* out, int rows, int hidden, float eps,
                            int32_t* nonfinite = nullptr) override;
  void embed_rmsnorm(DType dt, const int32_t* input_ids, const void* word, const void* gamma,
                     void* embedded, void* out, const SequenceLayout& layout, int hidden,
                     int vocab, float eps) override;
  void add_bias_activation(DType dt, void* x, const void* bias, int rows, int cols,
                           Activation act) override;

  // ---- fused attention (cpp/cuda/attention/flash.cu) ----------------------------------------
  bool supports_attention(AttentionKind kind, DType dt, int head_dim) const override;
  std::string attention_unsupported_reason(AttentionKind kind, DType dt,
                                           int head_dim) const override;
  bool flash_computes_terms(DType dt, int head_dim) const override;
  void flash_attention(DType dt, const void* qkv, const void* qkv_bias, void* out,
                       const SequenceLayout& layout, int heads, int head_dim,
                       float scale, const AttentionOptions& options) override;

 private:
  // Makes this backend's device current for the scope of a public method, then restores the
  // caller's (e.g. PyTorch's) current device.
  class DeviceScope {
   public:
    explicit DeviceScope(int device);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    int previous_ = -1;  // -1: the device was already current, nothing to restore
  };

  // A weight GEMM the choice applies to: row-major, lda = k, ldc = n, float16/bfloat16, no bias
  // or bias + erf-GELU.
  struct WeightGemm {
    DType dt;
    int m, n, k;
    const void* a;  // [m, k]
    const void* w;  // [k, n]
    const void* bias;  // [n], or nullptr
    void* c;        // [m, n]
    Activation act;  // kIdentity exactly when there is no bias
    bool bias_gelu() const { return act == Activation::kGeluErf; }
  };
  // Whether W [k, n] is kept in e4m3 (quantization "fp8"): cuBLASLt's FP8 kernels need k and n
  // in multiples of 16; other weights (a layer of odd test sizes) stay 16-bit, decided by the
  // shape alone so that weight_bytes, upload_weight and weight_gemm agree.
  bool fp8_weight(int n, int k) const {
    return quantization_ == Quantization::kFp8 && n % 16 == 0 && k % 16 == 0;
  }
  struct Fp8Shape;  // cuBLASLt's FP8 descriptors and algorithm of a shape (fp8_gemm.cu)
  struct Fp8ShapeDelete {
    void operator()(Fp8Shape* shape) const noexcept;
  };
  // The descriptors of a shape and its fixed rule's algorithm: cuBLASLt's first at m rows, or
  // under batch invariance the invariant reference (the first at kFp8InvariantRows rows, unsplit).
  Fp8Shape& fp8_shape(DType dt, int m, int n, int k, int ldc, cublasLtEpilogue_t epilogue,
                      bool invariant, const float* w_scales, const float* row_scales,
                      const void* bias);
  // The quantized activations' buffer, at least `bytes`.
  void* fp8_rows(size_t bytes);
  // `a_codes`: g.a's rows in e4m3 already (gemm_input_codes_bytes), else null.
  void fp8_weight_gemm(const WeightGemm& g, int lda, int ldc, const void* a_codes);
  // The measured pick of an FP8 GEMM (m rows, that epilogue), as measured_gemm_pick; nullptr
  // where the fixed rule runs (not measured yet, too few rows, or an epilogue not tuned).
  const GemmPick* measured_fp8_pick(const WeightGemm& g, cublasLtEpilogue_t epilogue,
                                    bool invariant);
  // measure_gemm for an FP8 key: cuBLASLt's FP8 algorithms on e4m3 data.
  GemmPick measure_fp8_gemm(const GemmShapeKey& key);
  // Enqueues cᵀ = op(w) · q with `algo`; false, enqueuing nothing, where it refuses the shape.
  bool run_fp8(Fp8Shape& shape, const cublasLtMatmulAlgo_t& algo, size_t workspace, const void* w,
               const void* q, void* c);
  struct LtShape;  // cuBLASLt's descriptors of a shape (weight_gemm.cu)
  struct LtShapeDelete {
    void operator()(LtShape* shape) const noexcept;  // where LtShape is complete
  };
  LtShape& lt_shape(DType dt, int m, int n, int k, Activation act);
  LtShape& lt_shape_with(DType dt, int m, int n, int k, cublasLtEpilogue_t epilogue);
  // g with a bias and no activation as one cuBLASLt GEMM, the bias added to the fp32 accumulators
  // (CUBLASLT_EPILOGUE_BIAS); false, enqueuing nothing, where cuBLASLt has no such kernel.
  bool run_bias_gemm(const WeightGemm& g);
  // cuBLASLt's ranked algorithms for `shape` that fit in `workspace` bytes.
  std::vector<cublasLtMatmulHeuristicResult_t> lt_heuristic(LtShape& shape, size_t workspace);
  GemmShapeKey gemm_key(const WeightGemm& g) const;
  std::vector<GemmPick> gemm_candidates(const WeightGemm& g);
  const GemmPick& fixed_gemm_choice(const WeightGemm& g) const;
  // The published pick; where there is none yet, the fixed rule while the tuner measures the
  // shape (or, FTBERT_GEMM_TUNING=inline, the pick once measured).
  const GemmPick& measured_gemm_pick(const WeightGemm& g);
  // Stages the cache file's picks, once per device and process; entries this build cannot run
  // (runs_loaded_pick) are skipped with a warning.
  void load_gemm_picks();
  bool runs_loaded_pick(const GemmShapeKey& key, const GemmPick& pick) const;
  // Enqueues g as `pick` says; false, enqueuing nothing, where that kernel cannot take it.
  bool run_gemm(const GemmPick& pick, const WeightGemm& g);
  bool run_cublaslt(const GemmPick& pick, const WeightGemm& g);
  // Batch invariance: the reference algorithm of g's (dtype, n, k, epilogue), the same at every
  // row count; run_invariant_gemm runs it, or under "auto" the measured kernel of g's row bucket
  // whose bits equal it (measure_gemm with key.invariant).
  const GemmPick& invariant_gemm_pick(const WeightGemm& g);
  void run_invariant_gemm(const WeightGemm& g);
  // Whether a 16-bit product of n outputs over k goes to those kernels: rows of 16-byte multiples,
  // which cuBLASLt's and CUTLASS's kernels need. Other shapes (a head of 1 or 9 labels) run on the
  // ordered kernel: a choice by the shape alone, so the same at every row count.
  static bool invariant_kernels_take(int n, int k) { return n % 8 == 0 && k % 8 == 0; }
  // Whether `pick` may ever give other bits than the reference: cuBLAS's own choice (its kernel
  // changes with the row count), and cuBLASLt algorithms that split k or take a workspace.
  bool may_split_k(const GemmPick& pick) const;
  // The tuning operands grown to at least `need` bytes each, in stream order: cudaFree would
  // synchronize the device, which fails while another thread records a CUDA graph.
  void grow_tuning_operands(const size_t (&need)[5]);

  void release() noexcept;
  // Points cuBLAS at `stream` and at our own workspace (cublasSetStream resets it to cuBLAS's
  // pool, which would give every captured graph a workspace of its own).
  void bind_cublas(cudaStream_t stream);

  int device_ = 0;
  int compute_capability_major_ = 0;
  int compute_capability_minor_ = 0;
  int sm_count_ = 0;
  bool fused_gemm_sm90_ = false;  // built with FTBERT_GEMM_SM90 and running on a 9.0 device
  std::string device_name_;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;  // own_stream_ or the one set with set_stream
  cudaStream_t capture_stream_ = nullptr;  // record()'s, created on first use
  cudaEvent_t switch_event_ = nullptr;     // orders the next stream after the last (set_stream)
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  // the GEMM choice "auto" (else "fixed"): FTBERT_GEMM_CHOICE at creation, or CudaGemmChoice::set_mode
  bool measure_gemms_ = true;
  CudaGemmChoice gemm_choice_{*this};
  friend class CudaGemmChoice;
  // (dt, m, n, k, epilogue activation) -> descriptors
  std::map<std::tuple<int, int, int, int, int>, std::unique_ptr<LtShape, LtShapeDelete>>
      lt_shapes_;
  // (dt, n, k, activation) -> the batch-invariant reference kernel
  std::map<std::tuple<int, int, int, int>, GemmPick> invariant_picks_;
  // (dt, m, n, k, ldc, epilogue, invariant) -> FP8 descriptors and algorithm
  std::map<std::tuple<int, int, int, int, int, int, bool>, std::unique_ptr<Fp8Shape, Fp8ShapeDelete>>
      fp8_shapes_;
  // fp8_rows' buffers, the last the current one; all freed with the backend (recordings may
  // hold any of them)
  std::vector<void*> fp8_rows_;
  size_t fp8_rows_bytes_ = 0;
  void* cublas_workspace_ = nullptr;
  size_t cublas_workspace_bytes_ = 0;
  bool allow_tf32_ = false;
  // measure_gemm's a [m, k], W [k, n], bias [n], c [m, n], and for invariant shapes the
  // reference's c [m, n] followed by a count: stream-ordered allocations
  void* tuning_operands_[5] = {};
  size_t tuning_bytes_[5] = {};
};

}  // namespace ftbert::cuda

// The entry point the core looks up after dlopen("libftbert_cuda.so"). Throws ftbert::Error
// (no device, index out of range, CUDA setup failure); the caller owns the result.
extern "C" ftbert::Backend* ftbert_create_cuda_backend(int device_index);
