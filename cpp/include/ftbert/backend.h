// The backend interface: one method per fused op of a BERT layer (the FasterTransformer v1.0 set and
// the few around it), on top of the device half (device.h: memory, streams, recording). The
// encoder (cpp/core) is written once on top of it; cpp/cpu and cpp/cuda implement it. Ops write
// into buffers the caller passes in and never allocate.
//
// Conventions:
//   - Every matrix is row-major. Activations are `dt` (the compute dtype); ids and masks are int32.
//   - Pointers are the backend's memory (host memory on CPU, device memory on CUDA).
//   - Ops are asynchronous where the backend is (CUDA: in stream order); synchronize() waits.
//
// Adding an op: declare it here with shape comments, implement it in cpp/cpu/<family>.cpp (the
// reference) and cpp/cuda/kernels/<family>.cu, and test the CUDA op against the CPU op in tests/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ftbert/check.h"
#include "ftbert/config.h"
#include "ftbert/device.h"
#include "ftbert/dtype.h"
#include "ftbert/gemm_choice.h"
#include "ftbert/sequences.h"

namespace ftbert {

enum class AttentionKind : int { kUnfused = 0, kFlash = 1 };

// DeBERTa's disentangled attention terms as the attention kernels read them (run_attention makes
// them from AttentionOptions::disentangled): the raw score of query i and key j of a sequence (the
// biased q_i · k_j, before the scale) gets
//   c2p[t(i)][row(i)][col(i − j)] + p2c[t(j)][row(j)][col(i − j)],   col(δ) = column[δ] − first
// where positions i, j are those of the padded row (a packed row's from token_index) and a table
// t/row is, for the fused kernels, head h and the layout's row; for disentangled_scores, b·heads + h
// and the padded position.
struct DisentangledTerms {
  const void* c2p = nullptr;  // [tables, rows, width] in dt: q · the relative keys; null: none
  const void* p2c = nullptr;  // [tables, rows, width] in dt: k · the relative queries; null: none
  int64_t rows = 0;           // rows of one table
  int width = 0;              // columns of a row
  int first = 0;              // the table's column 0 (<= column[−(S − 1)])
  const int32_t* column = nullptr;  // backend memory, pointing at δ = 0; |δ| < the max_seq
  // Or no tables (Backend::flash_computes_terms): the fused kernel computes the terms it needs
  // from the layer's relative queries and keys (DisentangledAttention::positions), and `column`
  // indexes their rows directly.
  const void* positions = nullptr;
  int position_rows = 0;
  int max_distance = 0;  // column[δ] exists for |δ| < max_distance
  bool inline_c2p = false;
  bool inline_p2c = false;
};

// What an architecture gives run_attention for DeBERTa's disentangled attention, per layer.
struct DisentangledAttention {
  // [position_rows, 3H] in dt: the (normalized) relative embeddings through this layer's Q|K|V
  // projection, bias included; relative query and key of head h at columns h·d and H + h·d. Rows
  // past 2·span pad it to a multiple of 8 and are never read.
  const void* positions = nullptr;
  int position_rows = 0;
  // [2·P − 1] int32 in backend memory and on the host, each pointing at distance δ = i − j = 0
  // (column[δ] for |δ| < P): the row of `positions` for that distance (the clamped log bucket),
  // non-decreasing in δ.
  const int32_t* column = nullptr;
  const int32_t* host_column = nullptr;
  int max_distance = 0;  // P
  bool c2p = true;       // content→position: q_i · relative key
  bool p2c = true;       // position→content: k_j · relative query
  // The fused attention computes the terms itself (Backend::flash_computes_terms, asked once by
  // the model): it needs no scratch for them.
  bool inline_terms = false;
  // Scratch for the terms: disentangled_scratch_bytes(...) bytes.
  void* scratch = nullptr;

  // 1/sqrt(d · (1 + terms)): DeBERTa scales every term by it.
  float scale(int head_dim) const;
  // A batch of sequences up to `seq` long reads columns column[-(seq-1)] .. column[seq-1]; the
  // tables hold `width` columns from `first` that cover them. The width is a multiple of 8 so that
  // cuBLAS runs its 16-byte vectorized kernels on the term products: with an odd one (DeBERTa-v3
  // reads 511 columns at 512 tokens) it takes one-element kernels several times slower.
  int width(int seq) const { return (host_column[seq - 1] - host_column[-(seq - 1)]) / 8 * 8 + 8; }
  int first(int seq) const { return std::min(host_column[-(seq - 1)], position_rows - width(seq)); }
};

// What an architecture adds to attention beyond softmax(scale · Q Kᵀ, key mask) V; the default
// adds nothing (BERT).
struct AttentionOptions {
  // A relative position bias (MPNet): [heads, 2·span − 1] float32 in the backend's memory. The
  // scaled score of the query at position i and the key at position j of a sequence gets
  // relative_bias[h·(2·span − 1) + (j − i) + span − 1] added before the softmax. Positions are
  // those of the padded row (a packed row's from token_index), so packing changes no distance.
  // Null: none; else span >= the layout's max_seq.
  const float* relative_bias = nullptr;
  int relative_span = 0;
  // A sliding window (ModernBERT's local layers): the key at position j attends the query at
  // position i only where |j − i| <= window (positions as for the bias). 0: every key.
  int window = 0;
  // DeBERTa's disentangled attention (null: none); `terms` is what run_attention makes of it for
  // the kernels (their input q, k and v then carry their bias: the QKV bias passed is zeros).
  const DisentangledAttention* disentangled = nullptr;
  DisentangledTerms terms;

  bool has_relative_bias() const { return relative_bias != nullptr; }
  bool has_terms() const {
    return terms.c2p != nullptr || terms.p2c != nullptr || terms.positions != nullptr;
  }
};

// Dynamic NTK rope scaling (transformers' rope_type "dynamic"; NomicBERT's rotary_scaling_factor):
// a sequence whose extent n (sequence_extent: 1 + its last token's position) passes `original`
// turns by the frequencies inv_freq[n − original − 1] [d/2] of a theta grown with n, every
// position p at angle p · inv_freq[c]; shorter ones keep the table's angles. Each sequence's
// angles depend on its own extent only, never on its batch, so it needs a packed layout (its
// cu_seqlens say where a sequence ends). Null inv_freq: the table for every sequence.
struct RotaryDynamic {
  const float* inv_freq = nullptr;  // [P − original, d/2] float32, one row per extent past original
  int original = 0;

  FTBERT_HOST_DEVICE bool on() const { return inv_freq != nullptr; }
};

// The first out-of-range input value stage_inputs met, in host memory the device writes
// (Backend::allocate_host_flag): `field` is set last, so a host that reads it non-zero reads the
// value that goes with it. The host clears field, then claim.
struct BadInputValue {
  enum Field : int32_t { kNone = 0, kInputIds = 1, kTokenTypeIds = 2, kAttentionMask = 3 };
  int32_t claim = 0;  // taken (0 -> 1) by the one writer that records its value
  int32_t field = kNone;
  int64_t value = 0;
};
static_assert(sizeof(BadInputValue) == 16, "BadInputValue is four host-flag words");

inline const char* attention_kind_name(AttentionKind k) {
  return k == AttentionKind::kFlash ? "flash" : "unfused";
}

// Weights a backend keeps quantized, weight_gemm running on them: none, "int8" (CPU: per output
// channel int8 weights; each GEMM's activations quantized per row; exact int32 sums) or "fp8"
// (e4m3 weights per output channel, e4m3 activations per row, fp32 accumulation, 16-bit
// outputs). A backend that cannot keep one says why (quantization_unsupported_reason).
enum class Quantization : int { kNone = 0, kInt8 = 1, kFp8 = 2 };
Quantization quantization_from_string(const std::string& name);  // "none", "int8" or "fp8"
const char* quantization_name(Quantization q);

class Backend : public Device {
 public:
  // ---- GEMMs (fp32 accumulation) -------------------------------------------------------------
  // Allow TF32 tensor cores for float32 GEMMs (CUDA only; off by default for exact fp32 parity).
  virtual void set_allow_tf32(bool /*allow*/) {}

  // ---- batch invariance ----------------------------------------------------------------------
  // On: each output row is computed by the same kernels in the same order whatever the row count,
  // so a sequence's results never depend on the batch it came in (its size, its neighbours): one
  // GEMM kernel per (n, k) for every m, no reduction split by the row count, one form of each
  // row kernel, one attention kernel per head dim. Off (the default): kernels chosen per shape.
  // The CPU backend's kernels are invariant either way (cpp/cpu/gemm.cpp).
  virtual void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }
  // ---- quantized weights ----------------------------------------------------------------------
  // Why this backend cannot keep its weights as `q` for forwards in `dt` ("" where it can).
  virtual std::string quantization_unsupported_reason(Quantization q, DType /*dt*/) const {
    if (q == Quantization::kNone) return "";
    return std::string("quantization '") + quantization_name(q) + "' is not available on the " +
           name() + " backend";
  }
  // Set before the weights are uploaded: weight_bytes, upload_weight and weight_gemm follow it.
  virtual void set_quantization(Quantization q) { quantization_ = q; }
  Quantization quantization() const { return quantization_; }

  // Why this backend cannot keep a forward in `dt` with `attention` invariant ("" where it can).
  virtual std::string batch_invariant_unsupported_reason(DType /*dt*/,
                                                         AttentionKind /*attention*/) const {
    return "";
  }
  // C = alpha * op(A) · op(B) + beta * C, where op(X) = Xᵀ if trans_x.
  //   op(A): [m, k], op(B): [k, n], C: [m, n]; lda/ldb/ldc are the row strides of A, B, C as stored.
  virtual void gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k,
                    const void* a, int lda, const void* b, int ldb, void* c, int ldc,
                    float alpha = 1.0f, float beta = 0.0f) = 0;

  // `batch` independent GEMMs; matrix i of X starts at X + i * stride_x elements. Under
  // batch_invariant each element of C is the same bits for any m, n or batch.
  virtual void batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k,
                            const void* a, int lda, int64_t stride_a,
                            const void* b, int ldb, int64_t stride_b,
                            void* c, int ldc, int64_t stride_c, int batch,
                            float alpha = 1.0f, float beta = 0.0f) = 0;

  // ---- weight GEMMs --------------------------------------------------------------------------
  // The layers' weight matrices W [k, n] (in, out) are kept in the layout weight_gemm reads
  // fastest, made once at load: upload_weight writes W (host, row-major, in dt) into
  // weight_bytes(dt, k, n) bytes of backend memory. The base implementation keeps W as it is and
  // runs gemm(); a backend may pack it into panels instead.
  virtual size_t weight_bytes(DType dt, int k, int n) const {
    return static_cast<size_t>(k) * n * dtype_size(dt);
  }
  virtual void upload_weight(DType dt, const void* host_w, int k, int n, void* dst) {
    copy_to_device(dst, host_w, weight_bytes(dt, k, n));
  }
  // c [m, n] (row stride ldc) = act(a [m, k] (row stride lda) · W + bias), W as upload_weight
  // left it; without a bias, c = a · W (act must then be identity). A backend may apply the bias
  // and activation as the GEMM's epilogue; the base adds them in a second op (ldc must be n).
  // `a_codes`: a's rows in the quantized form this backend's GEMM reads (gemm_input_codes_bytes),
  // written by the op that wrote a (a LayerNorm given `out_codes`); the GEMM then reads them
  // instead of quantizing a itself. Null, or ignored where W is not kept quantized.
  virtual void weight_gemm(DType dt, int m, int n, int k, const void* a, int lda, const void* w,
                           void* c, int ldc, const void* bias = nullptr,
                           Activation act = Activation::kIdentity,
                           const void* a_codes = nullptr) {
    (void)a_codes;
    gemm(dt, false, false, m, n, k, a, lda, w, n, c, ldc);
    if (bias != nullptr) add_bias_activation(dt, c, bias, m, n, act);
  }
  // Bytes of a weight GEMM input's rows [rows, k] in the quantized form weight_gemm reads (fp8:
  // e4m3 codes, then a float32 scale per row), where the LayerNorms (embed_layernorm,
  // dense_residual_layernorm) can write them beside their output in the same pass; 0 where the
  // backend takes none (no quantization, or a GEMM that quantizes its input otherwise).
  virtual size_t gemm_input_codes_bytes(int64_t /*rows*/, int /*k*/) const { return 0; }

  // The weight GEMM's kernel choice, for the op tests and benchmarks (gemm_choice.h): null where
  // the backend has one kernel per shape (the CPU).
  virtual GemmChoiceControl* gemm_choice_control() { return nullptr; }

  // ---- forwards and measured choices ---------------------------------------------------------
  // Session::forward brackets each forward's ops with these. What a backend picks per op by
  // measurement (CUDA: the weight GEMMs' kernels under "auto") changes only while no forward of
  // its device is between the two, so that forwards overlapping in time run the same kernels.
  // begin_forward returns the generation of those picks: a recording made under another one
  // holds kernels that forwards no longer run.
  virtual uint64_t begin_forward() { return 0; }
  virtual void end_forward() {}
  // Waits until every measurement that ops asked for so far is done and in use: the next forward
  // runs its picks.
  virtual void wait_for_tuning() {}
  // For tests and reports: "measured" (shapes timed), "on_caller" (timings that ran on a
  // forward's own thread: none by design), "loaded" (picks read from the cache file),
  // "cache_writes". Empty where nothing is measured.
  virtual std::map<std::string, int64_t> tuning_counters() const { return {}; }

  // out [m, n] = LayerNorm(a [m, k] · W + bias + residual) · gamma + beta: a post-LN residual
  // block's output projection and its LayerNorm as one op, W as upload_weight left it. A backend
  // may split the GEMM over k and let the LayerNorm sum the pieces, in `workspace`:
  // dense_residual_layernorm_workspace_bytes(rows, n) bytes for any m <= rows (the caller's own,
  // so concurrent callers never share it). With less workspace than that (or none), the op runs
  // unsplit. out may not overlap a or residual. The base runs weight_gemm into out, then
  // add_bias_residual_layernorm; `nonfinite` as there.
  virtual size_t dense_residual_layernorm_workspace_bytes(int /*rows*/, int /*n*/) const {
    return 0;
  }
  virtual void dense_residual_layernorm(DType dt, int m, int n, int k,
                                        const void* a,         // [m, k]
                                        const void* w,         // W [k, n], uploaded
                                        const void* bias,      // [n]
                                        const void* residual,  // [m, n]
                                        const void* gamma,     // [n]
                                        const void* beta,      // [n]
                                        void* out,             // [m, n]
                                        float eps, void* workspace, size_t workspace_bytes,
                                        int32_t* nonfinite = nullptr,
                                        void* product = nullptr,     // [m, n] or null
                                        void* out_codes = nullptr) {  // out's, as weight_gemm's
    (void)workspace;
    (void)workspace_bytes;
    FTBERT_CHECK(out_codes == nullptr, "dense_residual_layernorm: this backend writes no quantized "
                                       "rows (gemm_input_codes_bytes is 0)");
    // `product`: where a GEMM and a LayerNorm run as two steps put the GEMM's output (null: `out`
    // itself), so that only the LayerNorm writes `out` (a redirectable address: record()).
    if (product == nullptr || product == out) {
      weight_gemm(dt, m, n, k, a, k, w, out, n);
      add_bias_residual_layernorm(dt, out, residual, bias, gamma, beta, m, n, eps, nonfinite);
      return;
    }
    weight_gemm(dt, m, n, k, a, k, w, product, n);
    add_bias_residual_layernorm(dt, product, residual, bias, gamma, beta, m, n, eps, nonfinite);
    copy_on_device(out, product, static_cast<size_t>(m) * n * dtype_size(dt));
  }

  // ---- inputs --------------------------------------------------------------------------------
  // Copies a forward's inputs into the int32 arrays the ops read, checking each value on the way:
  // input_ids in [0, vocab), token_type_ids in [0, type_vocab), attention_mask 0 or 1. Each input
  // holds `*_bytes`-wide values: 4 (int32), 8 (int64) or 1 (uint8 / bool). A value out of range is
  // stored as 0, so it never reads outside a table, and the first one met is recorded in `bad`
  // (when given; the device address of a BadInputValue) for the host to read without waiting.
  // A null attention_mask stages 1s (packed inputs), null token_type_ids 0s.
  virtual void stage_inputs(const void* input_ids, int ids_bytes,            // [n]
                            const void* attention_mask, int mask_bytes,      // [n]
                            const void* token_type_ids, int types_bytes,     // [n]
                            int64_t n,
                            int32_t* ids_out,    // [n]
                            int32_t* mask_out,   // [n]
                            int32_t* types_out,  // [n]
                            int vocab, int type_vocab, BadInputValue* bad) = 0;

  // ---- sequence layout (sequences.h) --------------------------------------------------------
  // Packs the attended positions of `mask`: cu_seqlens [B + 1] and token_index [capacity] (-1 from
  // T on), in stream order; T = cu_seqlens[B] stays on the device; first_unattended, when given,
  // becomes 1 if some sequence's position 0 is padding (left padding, an empty row), else 0. The
  // base implementation runs pack_sequences_host, for backends whose memory is the host's.
  virtual void pack_sequences(const int32_t* mask,   // [B, S]
                              int batch, int seq,
                              int32_t* cu_seqlens,   // [B + 1]
                              int32_t* token_index,  // [capacity]
                              int64_t capacity,
                              int32_t* first_unattended = nullptr);  // [1] or null

  // out[b] = x[the first token of sequence b]: row b·S padded, row cu[b] packed (zeros for an
  // empty sequence).
  virtual void first_tokens(DType dt,
                            const void* x,  // [rows, H]
                            const SequenceLayout& layout,
                            void* out,      // [B, H]
                            int hidden) = 0;

  // out[b] = the mean of sequence b's tokens: its attended rows padded (the mask), rows
  // cu[b]..cu[b+1]-1 packed; zeros for an empty sequence. Summed in float32 in token order, so a
  // sequence's mean does not depend on the rest of the batch. (ModernBERT's classifier_pooling
  // "mean".)
  virtual void mean_tokens(DType dt,
                           const void* x,  // [rows, H]
                           const SequenceLayout& layout,
                           void* out,      // [B, H]
                           int hidden) = 0;

  // Packed rows back to the padded layout: out[token_index[r]] = in[r], padding rows zeroed.
  virtual void unpack_rows(const void* in,  // [rows, row_bytes] packed
                           const SequenceLayout& layout,
                           void* out,       // [B·S, row_bytes]
                           size_t row_bytes) = 0;

  // Zeroes rows T..layout.rows-1 of x (T = cu_seqlens[B], read on the device): the rows a
  // recording for a token-count bucket computes past the real tokens.
  virtual void clear_rows_past_tokens(void* x,  // [rows, row_bytes]
                                      const SequenceLayout& layout, size_t row_bytes) = 0;

  // ---- fused element-wise / reduction ops ----------------------------------------------------
  // out = LayerNorm(word[ids] + position[pos] + token_type[types]) with gamma/beta, one row per
  // layout row: row r is the token at padded position r (padded) or token_index[r] (packed; a row
  // with index -1 is zeros). The position of the token at padded position b·S + s is s when
  // position_pad_id < 0 (BERT); else, as the RoBERTa family counts them, pad + (non-pad ids among
  // tokens 0..s of its padded row) for a non-pad token and pad for a pad token, where
  // pad = position_pad_id (so P >= S + pad + 1). Packing therefore never changes a position.
  // A null `position` adds none (a model with rotary positions: ModernBERT).
  virtual void embed_layernorm(DType dt,
                               const int32_t* input_ids,       // [B, S]
                               const int32_t* token_type_ids,  // [B, S]
                               const void* word,               // [V, H]
                               const void* position,           // [P, H]
                               const void* token_type,         // [T, H]
                               const void* gamma,              // [H]
                               const void* beta,               // [H]
                               void* out,                      // [rows, H]
                               const SequenceLayout& layout, int hidden, int vocab,
                               int type_vocab, float eps, int position_pad_id = -1,
                               void* out_codes = nullptr) = 0;  // out's, as weight_gemm's a_codes

  // Adds the Q|K|V bias and splits heads: q/k/v[b, h, s, :] = qkv[row of (b, s), {0,1,2}·H + h·d
  // + :] + bias. Packed, each row lands at its padded position (token_index) and padding is zeros,
  // so the mask applies to the scores as for a padded batch.
  virtual void add_qkv_bias_transpose(DType dt,
                                      const void* qkv,   // [rows, 3H]
                                      const void* bias,  // [3H]
                                      void* q,           // [B, heads, S, d]
                                      void* k,           // [B, heads, S, d]
                                      void* v,           // [B, heads, S, d]
                                      const SequenceLayout& layout, int heads, int head_dim) = 0;

  // In place: scores = softmax(scale * scores + options' bias) over the last axis, keys with
  // mask == 0 excluded (packed batches too: add_qkv_bias_transpose puts their tokens back at their
  // positions). A row whose keys are all masked becomes all zeros (finite, never NaN).
  virtual void masked_softmax(DType dt,
                              void* scores,  // [B, heads, S, S]
                              const SequenceLayout& layout, int heads, float scale,
                              const AttentionOptions& options) = 0;

  // In place, the unfused path's disentangled terms (DisentangledTerms; tables b·heads + h, rows
  // the padded positions): scores[b, h, i, j] += c2p[b·heads + h][i][col(i − j)] +
  // p2c[b·heads + h][j][col(i − j)], before masked_softmax scales them.
  virtual void disentangled_scores(DType dt,
                                   void* scores,  // [B, heads, S, S]
                                   int batch, int heads, int seq,
                                   const DisentangledTerms& terms) = 0;

  // Merges heads back: out[row of (b, s), h·d + :] = in[b, h, s, :] (packed: the T token rows,
  // from their padded positions; padding and rows past T are not written).
  virtual void transpose_heads(DType dt,
                               const void* in,  // [B, heads, S, d]
                               void* out,       // [rows, H]
                               const SequenceLayout& layout, int heads, int head_dim) = 0;

  // In place: x = LayerNorm(x + bias + residual) with gamma/beta (post-LN residual block).
  // When `nonfinite` is given, an output NaN or Inf (as stored in dt) sets it to 1; it is never
  // cleared here. The check rides along the values the op writes anyway.
  virtual void add_bias_residual_layernorm(DType dt,
                                           void* x,               // [M, H] GEMM output -> result
                                           const void* residual,  // [M, H]
                                           const void* bias,      // [H]
                                           const void* gamma,     // [H]
                                           const void* beta,      // [H]
                                           int rows, int hidden, float eps,
                                           int32_t* nonfinite = nullptr) = 0;

  // In place: x = act(x + bias).
  virtual void add_bias_activation(DType dt,
                                   void* x,           // [M, N]
                                   const void* bias,  // [N]
                                   int rows, int cols, Activation act) = 0;

  // ---- ops of pre-LayerNorm, rotary, gated-MLP encoders (ModernBERT) --------------------------
  // In place: the rotary position embedding of Q and K (qkv's first 2H columns; V untouched).
  // Within each head, column c < d/2 pairs with c + d/2 and the pair (x1, x2) at position p
  // becomes (x1·cos − x2·sin, x2·cos + x1·sin), cos and sin read from rotary[p] = [cos of the d/2
  // angles | sin of them] (transformers' rotate_half convention). Positions are those of the
  // padded row: s for padded row b·S + s, token_index[r] − b·S for packed row r. Rows past the
  // tokens are left alone. With a bias, its Q and K parts are added first (its V part is not
  // read: attention adds V's), so a QKV bias costs no pass of its own. Computed in float32,
  // rounded once. With `dynamic` (RotaryDynamic), a packed layout's longer sequences turn by
  // angles of their own, computed as the op reads them.
  virtual void rotary_embedding(DType dt,
                                void* qkv,            // [rows, 3H]
                                const float* rotary,  // [P, d] float32, P > every position
                                const SequenceLayout& layout, int heads, int head_dim,
                                const void* bias = nullptr,  // [3H] or null
                                const RotaryDynamic& dynamic = {}) = 0;

  // out = act(x[:, :n]) · x[:, n:] (a gated linear unit: GeGLU with GELU), in float32, rounded
  // once.
  virtual void gated_activation(DType dt,
                                const void* x,  // [M, 2n]
                                void* out,      // [M, n]
                                int rows, int n, Activation act) = 0;

  // The pre-LayerNorm residual step: residual += x + bias (x and bias may each be null), then
  // out = LayerNorm(residual) with gamma/beta (statistics in float32; residual is stored in dt
  // first and the LayerNorm reads that stored value). `nonfinite` as add_bias_residual_layernorm,
  // on `out`.
  virtual void residual_add_layernorm(DType dt,
                                      void* residual,     // [M, H] in and out
                                      const void* x,      // [M, H] or null
                                      const void* bias,   // [H] or null
                                      const void* gamma,  // [H]
                                      const void* beta,   // [H]
                                      void* out,          // [M, H] (not residual)
                                      int rows, int hidden, float eps,
                                      int32_t* nonfinite = nullptr) = 0;

  // ---- ops of pre-RMSNorm encoders (Llama-style: EuroBERT) -----------------------------------
  // RMSNorm(v) = v / sqrt(mean(v²) + eps) · gamma: LayerNorm without the mean and beta.

  // residual_add_layernorm with RMSNorm: residual += x + bias (x and bias may each be null),
  // stored in dt, then out = RMSNorm(that stored residual) with gamma (statistics in float32,
  // rounded once). `nonfinite` as add_bias_residual_layernorm, on `out`.
  virtual void residual_add_rmsnorm(DType dt,
                                    void* residual,     // [M, H] in and out
                                    const void* x,      // [M, H] or null
                                    const void* bias,   // [H] or null
                                    const void* gamma,  // [H]
                                    void* out,          // [M, H] (not residual)
                                    int rows, int hidden, float eps,
                                    int32_t* nonfinite = nullptr) = 0;

  // The embeddings of a model whose first layer norms its own input: embedded = word[ids] (the
  // residual stream, copied in dt) and out = RMSNorm(embedded) with gamma (the first layer's
  // input), one row per layout row as embed_layernorm reads them (a packed row with index -1 is
  // zeros in both).
  virtual void embed_rmsnorm(DType dt,
                             const int32_t* input_ids,  // [B, S]
                             const void* word,          // [V, H]
                             const void* gamma,         // [H]
                             void* embedded,            // [rows, H]
                             void* out,                 // [rows, H]
                             const SequenceLayout& layout, int hidden, int vocab, float eps) = 0;

  // ---- fused attention -----------------------------------------------------------------------
  // Whether `kind` can run for this dtype and head dim; the unfused path runs everywhere.
  virtual bool supports_attention(AttentionKind kind, DType dt, int head_dim) const {
    (void)dt; (void)head_dim;
    return kind == AttentionKind::kUnfused;
  }
  // Why supports_attention() is false, naming the unsupported property ("" when supported).
  virtual std::string attention_unsupported_reason(AttentionKind kind, DType dt,
                                                   int head_dim) const;
  // Whether flash_attention computes DeBERTa's disentangled terms inside the kernel from the
  // relative queries and keys (DisentangledTerms::positions), with no term tables.
  virtual bool flash_computes_terms(DType dt, int head_dim) const {
    (void)dt; (void)head_dim;
    return false;
  }

  // One fused kernel: out = softmax(scale · Q Kᵀ + options' bias, key mask) V, reading Q, K, V
  // (+ bias) straight from the QKV GEMM output and writing the merged-heads layout the next GEMM
  // reads. Packed, each sequence attends over its own rows only and no padding is read or written.
  virtual void flash_attention(DType dt,
                               const void* qkv,       // [rows, 3H], bias not yet added
                               const void* qkv_bias,  // [3H]
                               void* out,             // [rows, H]
                               const SequenceLayout& layout, int heads, int head_dim, float scale,
                               const AttentionOptions& options);

  // ---- composed ops --------------------------------------------------------------------------
  // out = act(x_b · W + b) for each sequence's first token x_b: the pooler (tanh) or a
  // classification head's dense. Padded, the GEMM reads the first-token rows in place (row stride
  // S·H); packed, or with `gather`, they are gathered into `scratch` first (first_tokens), so that
  // `hidden` reaches the device only as a kernel's pointer parameter (a redirectable address).
  void first_token_dense(DType dt,
                         const void* hidden,  // [rows, H]
                         const SequenceLayout& layout,
                         const void* weight,  // [H, N] (in, out)
                         const void* bias,    // [N]
                         void* out,           // [B, N]
                         void* scratch,       // [B, H], packed or gather only
                         int hidden_size, int out_size, Activation act, bool gather = false) {
    const int B = layout.batch;
    const void* x = hidden;
    int ldx = layout.max_seq * hidden_size;
    if (layout.packed() || gather) {
      first_tokens(dt, hidden, layout, scratch, hidden_size);
      x = scratch;
      ldx = hidden_size;
    }
    gemm(dt, false, false, B, out_size, hidden_size, x, ldx, weight, out_size, out, out_size);
    add_bias_activation(dt, out, bias, B, out_size, act);
  }

 protected:
  bool batch_invariant_ = false;
  Quantization quantization_ = Quantization::kNone;
};

// Creates the backend for "cpu" or "cuda[:N]". CUDA lives in a separate shared library loaded on
// demand, so that a build with CUDA still imports and runs on a machine without a GPU or driver.
std::unique_ptr<Backend> create_backend(const std::string& device);

// Whether this build has the CUDA backend library next to the core library.
bool cuda_backend_built();

}  // namespace ftbert
