// Attention selection and the unfused path, written once over the backend ops.
#include "ftbert/attention.h"

#include <cmath>

#include "ftbert/check.h"

namespace ftbert {

AttentionMode attention_mode_from_string(const std::string& name) {
  if (name == "auto") return AttentionMode::kAuto;
  if (name == "unfused") return AttentionMode::kUnfused;
  if (name == "flash") return AttentionMode::kFlash;
  FTBERT_FAIL("unknown attention '" << name << "': expected 'auto', 'unfused' or 'flash'");
}

const char* attention_mode_name(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kAuto: return "auto";
    case AttentionMode::kUnfused: return "unfused";
    case AttentionMode::kFlash: return "flash";
  }
  return "?";
}

// The selection rule. `auto` takes the fused kernel wherever the backend supports it: it was faster
// than the unfused path at every shape measured, on the GPU and the CPU (docs/performance.md,
// "Attention: fused or unfused"). Elsewhere (CUDA float32, other head dims), unfused.
AttentionKind select_attention(AttentionMode mode, const Backend& backend, DType dt, int head_dim,
                               int batch, int seq) {
  (void)batch;
  (void)seq;
  const bool flash_ok = backend.supports_attention(AttentionKind::kFlash, dt, head_dim);
  switch (mode) {
    case AttentionMode::kUnfused: return AttentionKind::kUnfused;
    case AttentionMode::kFlash:
      FTBERT_CHECK(flash_ok, "attention='flash' is not supported here: "
                                 << backend.attention_unsupported_reason(AttentionKind::kFlash, dt,
                                                                         head_dim));
      return AttentionKind::kFlash;
    case AttentionMode::kAuto: return flash_ok ? AttentionKind::kFlash : AttentionKind::kUnfused;
  }
  return AttentionKind::kUnfused;
}

namespace {
constexpr size_t kAlign = 256;  // keeps every sub-buffer aligned for vector loads and cuBLAS
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct UnfusedLayout {
  size_t head_bytes;    // one of q, k, v, context: [B, heads, S, d]
  size_t scores_bytes;  // [B, heads, S, S]
};
UnfusedLayout unfused_layout(DType dt, int batch, int seq, int heads, int head_dim) {
  const size_t es = dtype_size(dt);
  return {round_up(es * batch * heads * seq * static_cast<size_t>(head_dim)),
          round_up(es * batch * heads * static_cast<size_t>(seq) * seq)};
}
}  // namespace

size_t attention_workspace_bytes(AttentionKind kind, DType dt, int batch, int seq, int heads,
                                 int head_dim) {
  if (kind == AttentionKind::kFlash) return 0;
  const UnfusedLayout l = unfused_layout(dt, batch, seq, heads, head_dim);
  return 4 * l.head_bytes + l.scores_bytes;
}

float DisentangledAttention::scale(int head_dim) const {
  return 1.0f / std::sqrt(static_cast<float>(head_dim) * static_cast<float>(1 + c2p + p2c));
}

namespace {
// One of the two term tables: per head (fused) or per (b, head) (unfused), a row per query or key.
size_t term_table_bytes(AttentionKind kind, DType dt, int64_t rows, int batch, int seq, int heads,
                        int width) {
  const int64_t table_rows = kind == AttentionKind::kFlash ? rows : int64_t{batch} * seq;
  return round_up(dtype_size(dt) * heads * table_rows * static_cast<size_t>(width));
}
}  // namespace

size_t disentangled_scratch_bytes(AttentionKind kind, DType dt, int64_t rows, int batch, int seq,
                                  int heads, const DisentangledAttention& d) {
  return 2 * term_table_bytes(kind, dt, rows, batch, seq, heads, d.width(seq));
}

namespace {

// The fused kernels' terms: per head h, c2p[h][r] = q_r · relative key (columns first ..
// first + width) for every row r of the layout, and p2c[h][r] = k_r · relative query; one batched
// product over the heads each (qkv's head h at column h·d, H + h·d).
DisentangledTerms fused_terms(Backend& be, DType dt, const void* qkv, const SequenceLayout& L,
                              int heads, int d, const DisentangledAttention& da) {
  const int S = L.max_seq, H = heads * d;
  const size_t es = dtype_size(dt);
  DisentangledTerms t;
  t.rows = L.rows;
  t.first = da.first(S);
  t.width = da.width(S);
  t.column = da.column;
  const size_t table = term_table_bytes(AttentionKind::kFlash, dt, L.rows, L.batch, S, heads,
                                        t.width);
  char* c2p = static_cast<char*>(da.scratch);
  char* p2c = c2p + table;
  const char* pos = static_cast<const char*>(da.positions) + static_cast<size_t>(t.first) * 3 * H * es;
  const char* q = static_cast<const char*>(qkv);
  const int64_t table_elems = t.rows * t.width;
  if (da.c2p) {
    be.batched_gemm(dt, false, true, L.rows, t.width, d, q, 3 * H, d, pos + H * es, 3 * H, d, c2p,
                    t.width, table_elems, heads);
    t.c2p = c2p;
  }
  if (da.p2c) {
    be.batched_gemm(dt, false, true, L.rows, t.width, d, q + H * es, 3 * H, d, pos, 3 * H, d, p2c,
                    t.width, table_elems, heads);
    t.p2c = p2c;
  }
  return t;
}

// No tables: what the fused kernel needs to compute the terms itself.
DisentangledTerms inline_terms(const DisentangledAttention& da) {
  DisentangledTerms t;
  t.column = da.column;
  t.positions = da.positions;
  t.position_rows = da.position_rows;
  t.max_distance = da.max_distance;
  t.inline_c2p = da.c2p;
  t.inline_p2c = da.p2c;
  return t;
}

// The unfused path's: per (b, h), from the padded q and k [B, heads, S, d]; one batched product
// over the batch per head (the relative keys and queries are the head's for every b).
DisentangledTerms unfused_terms(Backend& be, DType dt, const void* q, const void* k, int batch,
                                int seq, int heads, int d, const DisentangledAttention& da) {
  const int H = heads * d;
  const size_t es = dtype_size(dt);
  DisentangledTerms t;
  t.rows = seq;
  t.first = da.first(seq);
  t.width = da.width(seq);
  t.column = da.column;
  const size_t table = term_table_bytes(AttentionKind::kUnfused, dt, 0, batch, seq, heads, t.width);
  char* c2p = static_cast<char*>(da.scratch);
  char* p2c = c2p + table;
  const char* pos = static_cast<const char*>(da.positions) + static_cast<size_t>(t.first) * 3 * H * es;
  const int64_t head_elems = int64_t{seq} * d, table_elems = int64_t{seq} * t.width;
  for (int h = 0; h < heads; ++h) {
    const size_t in = static_cast<size_t>(h) * head_elems * es;
    const size_t out = static_cast<size_t>(h) * table_elems * es;
    if (da.c2p) {
      be.batched_gemm(dt, false, true, seq, t.width, d, static_cast<const char*>(q) + in, d,
                      heads * head_elems, pos + (H + h * d) * es, 3 * H, 0, c2p + out, t.width,
                      heads * table_elems, batch);
    }
    if (da.p2c) {
      be.batched_gemm(dt, false, true, seq, t.width, d, static_cast<const char*>(k) + in, d,
                      heads * head_elems, pos + h * d * es, 3 * H, 0, p2c + out, t.width,
                      heads * table_elems, batch);
    }
  }
  if (da.c2p) t.c2p = c2p;
  if (da.p2c) t.p2c = p2c;
  return t;
}

}  // namespace

void run_attention(Backend& backend, AttentionKind kind, DType dt, const void* qkv,
                   const void* qkv_bias, void* out, void* workspace, const SequenceLayout& layout,
                   int heads, int head_dim, const AttentionOptions& options) {
  const DisentangledAttention* da = options.disentangled;
  const float scale = da != nullptr ? da->scale(head_dim)
                                    : 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (da != nullptr) {
    FTBERT_CHECK(layout.max_seq <= da->max_distance,
                 "attention: sequences of " << layout.max_seq << " positions are longer than the "
                 "relative positions' table (" << da->max_distance << ")");
    FTBERT_CHECK(da->scratch != nullptr || (kind == AttentionKind::kFlash && da->inline_terms),
                 "attention: disentangled attention without its scratch");
  }
  if (kind == AttentionKind::kFlash) {
    if (da == nullptr) {
      backend.flash_attention(dt, qkv, qkv_bias, out, layout, heads, head_dim, scale, options);
      return;
    }
    AttentionOptions with_terms = options;
    with_terms.terms = da->inline_terms ? inline_terms(*da)
                                        : fused_terms(backend, dt, qkv, layout, heads, head_dim, *da);
    backend.flash_attention(dt, qkv, qkv_bias, out, layout, heads, head_dim, scale, with_terms);
    return;
  }
  const int batch = layout.batch, seq = layout.max_seq;
  const UnfusedLayout l = unfused_layout(dt, batch, seq, heads, head_dim);
  char* base = static_cast<char*>(workspace);
  void* q = base;                        // [B, heads, S, d]
  void* k = base + l.head_bytes;         // [B, heads, S, d]
  void* v = base + 2 * l.head_bytes;     // [B, heads, S, d]
  void* ctx = base + 3 * l.head_bytes;   // [B, heads, S, d]
  void* scores = base + 4 * l.head_bytes;  // [B, heads, S, S]
  const int bh = batch * heads;
  const int64_t head_stride = static_cast<int64_t>(seq) * head_dim;
  const int64_t score_stride = static_cast<int64_t>(seq) * seq;

  backend.add_qkv_bias_transpose(dt, qkv, qkv_bias, q, k, v, layout, heads, head_dim);
  // scores = Q Kᵀ per (batch, head); the 1/sqrt(d) scale is folded into the softmax.
  backend.batched_gemm(dt, false, true, seq, seq, head_dim, q, head_dim, head_stride, k, head_dim,
                       head_stride, scores, seq, score_stride, bh);
  if (da != nullptr) {
    const DisentangledTerms t = unfused_terms(backend, dt, q, k, batch, seq, heads, head_dim, *da);
    backend.disentangled_scores(dt, scores, batch, heads, seq, t);
  }
  backend.masked_softmax(dt, scores, layout, heads, scale, options);
  // context = P V per (batch, head)
  backend.batched_gemm(dt, false, false, seq, head_dim, seq, scores, seq, score_stride, v,
                       head_dim, head_stride, ctx, head_dim, head_stride, bh);
  backend.transpose_heads(dt, ctx, out, layout, heads, head_dim);
}

}  // namespace ftbert
