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

void run_attention(Backend& backend, AttentionKind kind, DType dt, const void* qkv,
                   const void* qkv_bias, void* out, void* workspace, const SequenceLayout& layout,
                   int heads, int head_dim, const AttentionOptions& options) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (kind == AttentionKind::kFlash) {
    backend.flash_attention(dt, qkv, qkv_bias, out, layout, heads, head_dim, scale, options);
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
  backend.masked_softmax(dt, scores, layout, heads, scale, options);
  // context = P V per (batch, head)
  backend.batched_gemm(dt, false, false, seq, head_dim, seq, scores, seq, score_stride, v,
                       head_dim, head_stride, ctx, head_dim, head_stride, bh);
  backend.transpose_heads(dt, ctx, out, layout, heads, head_dim);
}

}  // namespace ftbert
