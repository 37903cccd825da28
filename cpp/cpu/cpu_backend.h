// The CPU backend: every op in C++, computing in float32; the layers' weight GEMMs by our own panel
// kernel over weights packed at load, the other GEMMs through OpenBLAS; the row loops, attention
// and the panel kernel vectorized per instruction set (kernels.h, chosen at run time), all of it
// threaded by one small pool (parallel.h). It runs everywhere and is the readable reference for
// the CUDA kernels. bfloat16, where the CPU has AVX512-BF16: tensors kept in bfloat16, the weight
// GEMMs on bfloat16 dot products with float32 accumulation, every other op in float32 on rows
// widened as it reads them (rows.h).
#pragma once

#include "ftbert/backend.h"

namespace ftbert {

// Why dt cannot run on the CPU backend ("" when it can): float32 always; bfloat16 where the CPU
// has AVX512-BF16 and FTBERT_CPU_ISA leaves it in.
std::string cpu_dtype_unsupported_reason(DType dt);

class CpuBackend final : public Backend {
 public:
  // Settles the instruction set (throws on a bad FTBERT_CPU_ISA) before any op runs.
  CpuBackend();
  std::string name() const override { return "cpu"; }
  std::string device_name() const override;
  bool supports_dtype(DType dt) const override { return dtype_unsupported_reason(dt).empty(); }
  std::string dtype_unsupported_reason(DType dt) const override {
    return cpu_dtype_unsupported_reason(dt);
  }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_on_device(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}

  void gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda,
            const void* b, int ldb, void* c, int ldc, float alpha, float beta) override;
  void batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                    int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b, void* c,
                    int ldc, int64_t stride_c, int batch, float alpha, float beta) override;
  void stage_inputs(const void* ids, int ids_bytes, const void* mask, int mask_bytes,
                    const void* types, int types_bytes, int64_t n, int32_t* ids_out,
                    int32_t* mask_out, int32_t* types_out, int vocab, int type_vocab,
                    BadInputValue* bad) override;
  // quantization "int8": float32 forwards only (weight_gemm.cpp's int8 panels).
  std::string quantization_unsupported_reason(Quantization q, DType dt) const override;
  // Weights packed into cpu::kGemmPanel-wide panels (kernels.h), multiplied by our own kernel;
  // under quantization "int8", int8 panels with a scale per column.
  size_t weight_bytes(DType dt, int k, int n) const override;
  void upload_weight(DType dt, const void* host_w, int k, int n, void* dst) override;
  void weight_gemm(DType dt, int m, int n, int k, const void* a, int lda, const void* w, void* c,
                   int ldc, const void* bias = nullptr, Activation act = Activation::kIdentity,
                   const void* a_codes = nullptr) override;
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
  bool supports_attention(AttentionKind kind, DType dt, int head_dim) const override;
  std::string attention_unsupported_reason(AttentionKind kind, DType dt,
                                           int head_dim) const override;
  void flash_attention(DType dt, const void* qkv, const void* qkv_bias, void* out,
                       const SequenceLayout& layout, int heads, int head_dim,
                       float scale, const AttentionOptions& options) override;
};

// Shared by the CPU ops: throws, naming the op, for a dtype that cannot run here.
void require_cpu_dtype(DType dt, const char* op);

namespace cpu {
// out = x / sqrt(mean(x²) + eps) · gamma over n values (layernorm.cpp); out may be x.
void rmsnorm_row(const float* x, const float* gamma, float* out, int n, float eps);
}  // namespace cpu

}  // namespace ftbert
