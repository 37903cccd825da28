// The CUDA kernels of the BERT layer (the FasterTransformer v1.0 set), as stateless launchers:
// invoke_<op><T>(..., stream) enqueues the op on `stream` and checks the launch. Each is
// instantiated for float, __half and __nv_bfloat16; every tensor is row-major device memory with
// the shape in its comment. Arithmetic is fp32 whatever T is; results are rounded to T once.
//
// Files: layout.cu (QKV split / head merge), softmax.cu, layernorm.cu (residual LN, embeddings),
// activation.cu (bias + activation, gated activation), rotary.cu, sequences.cu (packing and the
// row moves around it). The CPU backend's op of the same name (cpp/cpu/) is the reference for each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/sequences.h"

namespace ftbert::cuda {

// q/k/v[b, h, s, :] = qkv[row, w·H + h·d + :] + bias[w·H + h·d + :] for w = 0, 1, 2 (H = heads·d),
// where row is the layout's row of (b, s); packed, padding positions are zeros.
template <typename T>
void invoke_add_qkv_bias_transpose(const T* qkv,   // [rows, 3H]
                                   const T* bias,  // [3H]
                                   T* q,           // [B, heads, S, d]
                                   T* k,           // [B, heads, S, d]
                                   T* v,           // [B, heads, S, d]
                                   const SequenceLayout& layout, int heads, int head_dim,
                                   cudaStream_t stream);

// out[row, h·d + :] = in[b, h, s, :] for the layout's rows (packed: rows < T only).
template <typename T>
void invoke_transpose_heads(const T* in,  // [B, heads, S, d]
                            T* out,       // [rows, H]
                            const SequenceLayout& layout, int heads, int head_dim,
                            cudaStream_t stream);

// ---- inputs.cu ---------------------------------------------------------------------------------
// Backend::stage_inputs: the inputs as int32, checked (rules: ftbert/staged_inputs.h); the first
// bad value recorded in `bad` (device address of mapped host memory, or null).
void invoke_stage_inputs(const void* ids, int ids_bytes, const void* mask, int mask_bytes,
                         const void* types, int types_bytes, int64_t n,
                         int32_t* ids_out,    // [n]
                         int32_t* mask_out,   // [n]
                         int32_t* types_out,  // [n]
                         int vocab, int type_vocab, BadInputValue* bad, cudaStream_t stream);

// ---- sequences.cu: the sequence layout ---------------------------------------------------------
// cu_seqlens and token_index (-1 from T to capacity) of a mask, in one block; first_unattended
// (when given) 1 if some sequence's position 0 is padding, else 0.
void invoke_pack_sequences(const int32_t* mask,  // [B, S]
                           int batch, int seq,
                           int32_t* cu_seqlens,   // [B + 1]
                           int32_t* token_index,  // [capacity]
                           int64_t capacity,
                           int32_t* first_unattended,  // [1] or null
                           cudaStream_t stream);
// out[b] = x[the layout's first row of sequence b] (zeros for an empty packed sequence).
template <typename T>
void invoke_first_tokens(const T* x,  // [rows, H]
                         const SequenceLayout& layout,
                         T* out,  // [B, H]
                         int hidden, cudaStream_t stream);
// out[b] = the mean of sequence b's tokens (Backend::mean_tokens).
template <typename T>
void invoke_mean_tokens(const T* x,  // [rows, H]
                        const SequenceLayout& layout,
                        T* out,  // [B, H]
                        int hidden, cudaStream_t stream);
// out[token_index[r]] = in[r] for r < T, every other row of out zeroed.
void invoke_unpack_rows(const void* in,  // [rows, row_bytes]
                        const SequenceLayout& layout,
                        void* out,  // [B·S, row_bytes]
                        size_t row_bytes, cudaStream_t stream);
// Rows T..layout.rows-1 of x = 0, T = cu_seqlens[B] read on the device.
void invoke_clear_rows_past_tokens(void* x,  // [rows, row_bytes]
                                   const SequenceLayout& layout, size_t row_bytes,
                                   cudaStream_t stream);

// In place, per row (b, h, query i): scores = softmax(scale · scores + rel) over keys j with
// mask != 0 (and |j − i| <= window when window > 0), rel = relative_bias[h·(2·span − 1) + (j − i)
// + span − 1] (AttentionOptions; none when relative_bias is null, else span >= seq). A row with
// every key masked becomes zeros.
// seq <= kSoftmaxWarpMaxSeq: one warp per row, the row in registers; longer rows: one block per
// row, the row in registers while it fits (seq <= 2048 · vector width), else an online max/sum
// pass and a normalizing pass over global memory.
constexpr int kSoftmaxWarpMaxSeq = 1024;
template <typename T>
void invoke_masked_softmax(T* scores,                   // [B, heads, S, S]
                           const int32_t* mask,         // [B, S] key mask, 1 = attend, 0 = padding
                           int batch, int heads, int seq, float scale,
                           const float* relative_bias,  // [heads, 2·span − 1] or null
                           int relative_span,
                           int window,  // 0: every key
                           bool ordered,  // the ordered variant at every length (batch-invariant)
                           cudaStream_t stream);
// In place, the unfused path's disentangled terms (Backend::disentangled_scores): score row
// (t, i) of [B·heads, S, S] += c2p[t][i][column[i − j] − first] + p2c[t][j][column[i − j] − first];
// c2p / p2c [B·heads, S, width], either may be null; column points at distance 0.
template <typename T>
void invoke_disentangled_scores(T* scores, const T* c2p, const T* p2c, const int32_t* column,
                                int batch, int heads, int seq, int width, int first,
                                cudaStream_t stream);

// c[b] = alpha · op(a[b]) · op(b[b]) + beta · c[b] for b < batch, row-major as
// Backend::batched_gemm, each element summed over k in order with fp32 FMAs: the same bits for
// any m, n or batch (batch-invariant forwards; ordered_gemm.cu).
template <typename T>
void invoke_ordered_batched_gemm(bool trans_a, bool trans_b, int m, int n, int k, const T* a,
                                 int lda, int64_t stride_a, const T* b, int ldb, int64_t stride_b,
                                 T* c, int ldc, int64_t stride_c, int batch, float alpha,
                                 float beta, cudaStream_t stream);

// "warp" or "block": the variant invoke_masked_softmax runs for this sequence length.
const char* masked_softmax_variant(int seq);

// A weight GEMM's input rows in e4m3 (quantization "fp8"; e4m3.cuh says how they are made): the
// LayerNorms below write them beside their 16-bit output when given; null codes: none.
struct E4m3Rows {
  unsigned char* codes = nullptr;  // [M, H]
  float* scales = nullptr;         // [M]
};
// The rows of one buffer (Backend::gemm_input_codes_bytes): codes [rows, k], then the scales
// from the next 16-byte boundary. Null: none.
inline E4m3Rows e4m3_rows(void* buffer, int64_t rows, int k) {
  if (buffer == nullptr) return {};
  const size_t codes = (static_cast<size_t>(rows) * k + 15) / 16 * 16;
  return {static_cast<unsigned char*>(buffer),
          reinterpret_cast<float*>(static_cast<unsigned char*>(buffer) + codes)};
}

// rows [M, k] (16-bit, lda apart; k a multiple of 16, rows 16-byte aligned) as e4m3 rows, in a
// pass of its own (e4m3.cu).
template <typename T>
void invoke_quantize_rows_e4m3(const T* a, int lda, int rows, int k, E4m3Rows out,
                               cudaStream_t stream);

// Per row: out = LayerNorm(x + bias + residual) · gamma + beta, statistics in fp32 (out may be x),
// and out's rows in e4m3 where `codes` are given.
template <typename T>
void invoke_dense_residual_layernorm(const T* x,         // [M, H]
                                     const T* residual,  // [M, H]
                                     const T* bias,      // [H]
                                     const T* gamma,     // [H]
                                     const T* beta,      // [H]
                                     T* out,             // [M, H]
                                     int rows, int hidden, float eps,
                                     int32_t* nonfinite,  // set to 1 on a NaN/Inf output; may be null
                                     cudaStream_t stream,
                                     // one kernel form at every row count (else by rows)
                                     bool batch_invariant = false, E4m3Rows codes = {});

// The same in place: x = LayerNorm(x + bias + residual) · gamma + beta.
template <typename T>
void invoke_add_bias_residual_layernorm(T* x,               // [M, H]
                                        const T* residual,  // [M, H]
                                        const T* bias,      // [H]
                                        const T* gamma,     // [H]
                                        const T* beta,      // [H]
                                        int rows, int hidden, float eps,
                                        int32_t* nonfinite,  // set to 1 on a NaN/Inf output; may be null
                                        cudaStream_t stream, bool batch_invariant = false);

// out = LayerNorm(Σ_s partials[s] + bias + residual) · gamma + beta: a k-split GEMM's fp32
// partial products (split order, summed in fp32) normalized with the residual, as above.
template <typename T>
void invoke_partials_residual_layernorm(const float* partials,  // [splits, M, H]
                                        int splits,
                                        const T* residual,  // [M, H]
                                        const T* bias,      // [H]
                                        const T* gamma,     // [H]
                                        const T* beta,      // [H]
                                        T* out,             // [M, H]
                                        int rows, int hidden, float eps,
                                        int32_t* nonfinite,  // set to 1 on a NaN/Inf output; may be null
                                        cudaStream_t stream);

// Per row: residual = round(residual + (x + bias)), stored; out = LayerNorm(that stored residual)
// · gamma + beta, statistics in fp32 (the pre-LayerNorm residual step). x and bias may each be
// null (nothing added); out may be x, never residual.
template <typename T>
void invoke_residual_add_layernorm(T* residual,      // [M, H] in and out
                                   const T* x,       // [M, H] or null
                                   const T* bias,    // [H] or null
                                   const T* gamma,   // [H]
                                   const T* beta,    // [H]
                                   T* out,           // [M, H]
                                   int rows, int hidden, float eps,
                                   int32_t* nonfinite,  // set to 1 on a NaN/Inf output; may be null
                                   cudaStream_t stream);

// invoke_residual_add_layernorm with RMSNorm: residual = round(residual + (x + bias)), stored;
// out = that stored residual · rsqrt(mean(residual²) + eps) · gamma, statistics in fp32, rounded
// once. x and bias may each be null; out may be x, never residual.
template <typename T>
void invoke_residual_add_rmsnorm(T* residual,     // [M, H] in and out
                                 const T* x,      // [M, H] or null
                                 const T* bias,   // [H] or null
                                 const T* gamma,  // [H]
                                 T* out,          // [M, H]
                                 int rows, int hidden, float eps,
                                 int32_t* nonfinite,  // set to 1 on a NaN/Inf output; may be null
                                 cudaStream_t stream);

// embedded[row] = word[id] (copied) and out[row] = RMSNorm(word[id]) · gamma for the token at the
// row's padded position, read as invoke_embed_layernorm reads it (packed: token_index[row]; -1
// gives zero rows in both); ids clamped into [0, vocab).
template <typename T>
void invoke_embed_rmsnorm(const int32_t* input_ids,  // [B, S]
                          const T* word,             // [V, H]
                          const T* gamma,            // [H]
                          T* embedded,               // [rows, H]
                          T* out,                    // [rows, H]
                          const SequenceLayout& layout, int hidden, int vocab, float eps,
                          cudaStream_t stream);

// out[row] = LayerNorm(word[id] + position[s] + token_type[type]) · gamma + beta for the token at
// the row's padded position (packed: token_index[row]; -1 gives a zero row). Ids and types are
// clamped into [0, vocab) and [0, type_vocab) so bad device input never reads out of bounds;
// token_type_ids may be null (all type 0); position may be null (no position added, and
// position_pad_id is then ignored).
template <typename T>
void invoke_embed_layernorm(const int32_t* input_ids,       // [B, S]
                            const int32_t* token_type_ids,  // [B, S] or null
                            const T* word,                  // [V, H]
                            const T* position,              // [P, H] or null, see position_pad_id
                            const T* token_type,            // [T, H]
                            const T* gamma,                 // [H]
                            const T* beta,                  // [H]
                            T* out,                         // [rows, H]
                            const SequenceLayout& layout, int hidden, int vocab, int type_vocab,
                            float eps,
                            int position_pad_id,  // < 0: position s; else Backend::embed_layernorm's
                            cudaStream_t stream,
                            E4m3Rows codes = {});  // out's rows in e4m3 as well, where given

// In place: x = act(x + bias). GELU is the exact erf form (kGeluErf) or the tanh form (kGeluTanh).
template <typename T>
void invoke_add_bias_activation(T* x,           // [M, N]
                                const T* bias,  // [N]
                                int rows, int cols, Activation act, cudaStream_t stream);

// out = act(x[:, :n]) · x[:, n:] (a gated linear unit), in fp32, rounded to T once.
template <typename T>
void invoke_gated_activation(const T* x,  // [M, 2n]
                             T* out,      // [M, n]
                             int rows, int n, Activation act, cudaStream_t stream);

// ---- rotary.cu ---------------------------------------------------------------------------------
// In place on Q and K (qkv's first 2H columns) of every token row: within each head, column
// c < d/2 and column c + d/2 rotate by the angle of (position, c): (x1, x2) -> (x1·cos − x2·sin,
// x2·cos + x1·sin), cos/sin = rotary[p][c], rotary[p][d/2 + c]. p is the row's position in its
// padded row (padded: row % S; packed: token_index[row] % S); packed rows past the tokens
// (token_index -1) are left alone. With `dynamic`, a packed sequence past its original length
// turns by its own frequencies (backend.h, RotaryDynamic).
template <typename T>
void invoke_rotary_embedding(T* qkv,               // [rows, 3H]
                             const float* rotary,  // [P, d] float32: cos | sin, P > every position
                             const SequenceLayout& layout, int heads, int head_dim,
                             cudaStream_t stream,
                             const T* bias = nullptr,  // [3H] or null: Q's, K's parts added first
                             const RotaryDynamic& dynamic = {});

}  // namespace ftbert::cuda
