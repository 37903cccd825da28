#include "core/models/blocks.h"

#include <cmath>

#include "ftbert/check.h"

namespace ftbert::blocks {

std::vector<float> rotary_table(int positions, int head_dim, float theta, float scale) {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int c = 0; c < half; ++c) {
    const float exponent = static_cast<float>(2 * c) / static_cast<float>(head_dim);
    inv[c] = 1.0f / std::pow(theta, exponent);
    if (scale != 1.0f) inv[c] /= scale;
  }
  std::vector<float> t(static_cast<size_t>(positions) * head_dim);
  for (int p = 0; p < positions; ++p) {
    float* row = t.data() + static_cast<size_t>(p) * head_dim;
    for (int c = 0; c < half; ++c) {
      const float angle = static_cast<float>(p) * inv[c];
      row[c] = std::cos(angle);
      row[half + c] = std::sin(angle);
    }
  }
  return t;
}

std::vector<float> rotary_dynamic_frequencies(int positions, int original, int head_dim,
                                              float theta, float factor) {
  FTBERT_CHECK(original >= 1 && original <= positions && head_dim > 2 && head_dim % 2 == 0,
               "rotary_dynamic_frequencies: original " << original << ", positions " << positions
                                                       << ", head dim " << head_dim);
  const int half = head_dim / 2;
  const float power = static_cast<float>(static_cast<double>(head_dim) / (head_dim - 2));
  const float less = static_cast<float>(static_cast<double>(factor) - 1.0);
  std::vector<float> t(static_cast<size_t>(positions - original) * half);
  for (int n = original + 1; n <= positions; ++n) {
    const float growth = factor * static_cast<float>(n) / static_cast<float>(original) - less;
    const float base = theta * std::pow(growth, power);
    float* row = t.data() + static_cast<size_t>(n - original - 1) * half;
    for (int c = 0; c < half; ++c) {
      row[c] = 1.0f / std::pow(base, static_cast<float>(2 * c) / static_cast<float>(head_dim));
    }
  }
  return t;
}

DeviceBuffer upload_floats(Backend* backend, const std::vector<float>& values) {
  DeviceBuffer buf(backend, values.size() * sizeof(float));
  backend->copy_to_device(buf.data(), values.data(), values.size() * sizeof(float));
  return buf;
}

DeviceBuffer upload_ints(Backend* backend, const std::vector<int32_t>& values) {
  DeviceBuffer buf(backend, values.size() * sizeof(int32_t));
  backend->copy_to_device(buf.data(), values.data(), values.size() * sizeof(int32_t));
  return buf;
}

DeviceBuffer zeros(Backend* backend, size_t bytes) {
  const std::vector<unsigned char> z(bytes, 0);
  DeviceBuffer buf(backend, bytes);
  backend->copy_to_device(buf.data(), z.data(), bytes);
  return buf;
}

const void* embeddings(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                       const Activations& act, const int32_t* ids, const int32_t* types,
                       const SequenceLayout& L, bool codes) {
  const int H = c.hidden_size, E = c.embedding_size, M = L.rows;
  const bool project = c.has_projection();
  void* const hidden_codes = codes && !project ? act.gemm_codes : nullptr;
  be.embed_layernorm(dt, ids, types, w.word_embeddings.data(), w.position_embeddings.data(),
                     w.token_type_embeddings.data(), w.emb_ln_gamma.data(), w.emb_ln_beta.data(),
                     project ? act.embedded : act.hidden, L, E, c.vocab_size, c.type_vocab_size,
                     c.layer_norm_eps, c.position_pad_id, hidden_codes);
  if (project) {
    be.gemm(dt, false, false, M, H, E, act.embedded, E, w.project_weight.data(), H, act.hidden, H);
    be.add_bias_activation(dt, act.hidden, w.project_bias.data(), M, H, Activation::kIdentity);
  }
  // Rows past the tokens (a bucketed recording): the embeddings made them zeros and the per-row
  // ops keep them finite; attention never writes them, so its output there is zeroed once.
  if (L.bounded) be.clear_rows_past_tokens(act.ctx, L, static_cast<size_t>(H) * dtype_size(dt));
  return hidden_codes;
}

void post_ln_layer(Backend& be, DType dt, const ModelConfig& c, const Activations& act,
                   const LayerWeights& w, const SequenceLayout& L, AttentionKind attention,
                   const AttentionOptions& options, void* out, int32_t* nonfinite,
                   const void* hidden_codes, void* out_codes) {
  // qkv [M, 3H] = hidden [M, H] · Wqkv [H, 3H]   (bias added inside attention)
  be.weight_gemm(dt, L.rows, 3 * c.hidden_size, c.hidden_size, act.hidden, c.hidden_size,
                 w.qkv_weight.data(), act.qkv, 3 * c.hidden_size, nullptr, Activation::kIdentity,
                 hidden_codes);
  run_attention(be, attention, dt, act.qkv, w.qkv_bias.data(), act.ctx, act.attention_scratch, L,
                c.num_heads, c.head_dim(), options);
  post_ln_output(be, dt, c, act, w, L, out, nonfinite, out_codes);
}

void post_ln_output(Backend& be, DType dt, const ModelConfig& c, const Activations& act,
                    const LayerWeights& w, const SequenceLayout& L, void* out,
                    int32_t* nonfinite, void* out_codes) {
  const int M = L.rows, H = c.hidden_size, I = c.intermediate_size;
  const float eps = c.layer_norm_eps;
  // hidden2 = LN(ctx · Wo + bo + hidden), its rows also in act.gemm_codes where the backend takes
  // them: the FFN-in GEMM reads those before anything else writes there.
  be.dense_residual_layernorm(dt, M, H, H, act.ctx, w.attn_out_weight.data(),
                              w.attn_out_bias.data(), act.hidden, w.attn_ln_gamma.data(),
                              w.attn_ln_beta.data(), act.hidden2, eps, act.dense_workspace,
                              act.dense_workspace_bytes, nullptr, nullptr, act.gemm_codes);
  // inter = act(hidden2 · W1 + b1)
  be.weight_gemm(dt, M, I, H, act.hidden2, H, w.ffn_in_weight.data(), act.inter, I,
                 w.ffn_in_bias.data(), c.activation, act.gemm_codes);
  // out = LN(inter · W2 + b2 + hidden2); into act.output, only the LayerNorm writes it (model.h):
  // the product goes to ctx, free once the attention output above has read it.
  be.dense_residual_layernorm(dt, M, H, I, act.inter, w.ffn_out_weight.data(),
                              w.ffn_out_bias.data(), act.hidden2, w.ffn_ln_gamma.data(),
                              w.ffn_ln_beta.data(), out, eps, act.dense_workspace,
                              act.dense_workspace_bytes, nonfinite,
                              out == act.hidden ? nullptr : act.ctx, out_codes);
}

void* post_ln_layers(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                     const Activations& act, const SequenceLayout& L, AttentionKind attention,
                     const AttentionOptions& options, const void* hidden_codes) {
  void* const out = act.output != nullptr ? act.output : act.hidden;
  const void* codes = hidden_codes;
  for (const LayerWeights& l : w.layers) {
    const bool last = &l == &w.layers.back();
    // Every layer but the last hands its output's rows to the next one's QKV GEMM.
    void* const out_codes = last ? nullptr : act.gemm_codes;
    post_ln_layer(be, dt, c, act, l, L, attention, options, last ? out : act.hidden,
                  last ? act.nonfinite : nullptr, codes, out_codes);
    codes = out_codes;
  }
  return out;
}

void sequence_head_dense(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                         const Activations& act, const void* hidden, const SequenceLayout& L) {
  const HeadConfig& hc = c.head;
  const int H = c.hidden_size;
  if (hc.reads_late_mean) {
    // act(x · Wd + bd) on every token into ctx (free after the last layer), then each sequence's
    // mean: the classifier after it is affine, so this is the mean of the per-token logits.
    FTBERT_CHECK(act.output == nullptr,
                 "forward: a head whose dense reads every token cannot have the final hidden states "
                 "in act.output");
    const int M = L.rows;
    be.gemm(dt, false, false, M, H, H, hidden, H, w.head_dense_weight.data(), H, act.ctx, H);
    be.add_bias_activation(dt, act.ctx, w.head_dense_bias.data(), M, H, hc.dense_activation);
    be.mean_tokens(dt, act.ctx, L, act.head_hidden, H);
    return;
  }
  if (!hc.reads_mean) {
    be.first_token_dense(dt, hidden, L, w.head_dense_weight.data(), w.head_dense_bias.data(),
                         act.head_hidden, act.first_tokens, H, H, hc.dense_activation,
                         act.output != nullptr);
    return;
  }
  // The means [B, H] go to first_tokens; `hidden` is read by a kernel only (model.h).
  be.mean_tokens(dt, hidden, L, act.first_tokens, H);
  be.gemm(dt, false, false, L.batch, H, H, act.first_tokens, H, w.head_dense_weight.data(), H,
          act.head_hidden, H);
  be.add_bias_activation(dt, act.head_hidden, w.head_dense_bias.data(), L.batch, H,
                         hc.dense_activation);
}

namespace {

// The task head: the final hidden states `hidden` (and act.pooled for a head on the pooler)
// -> act.logits.
void head(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
          const Activations& act, const void* hidden, const SequenceLayout& L) {
  const HeadConfig& hc = c.head;
  const int H = c.hidden_size, N = hc.num_labels;
  // x [rows, H]: every token, the pooler output, or token 0 through the head's own dense.
  const void* x = hidden;
  int rows = L.rows;
  if (hc.kind == HeadKind::kSequence) {
    rows = L.batch;
    if (hc.reads_pooler) {
      x = act.pooled;
    } else {
      sequence_head_dense(be, dt, c, w, act, hidden, L);
      x = act.head_hidden;
    }
  }
  // logits [rows, N] = x · Wout + bout
  be.gemm(dt, false, false, rows, N, H, x, H, w.head_out_weight.data(), N, act.logits, N);
  be.add_bias_activation(dt, act.logits, w.head_out_bias.data(), rows, N, Activation::kIdentity);
}

}  // namespace

void pooler_and_head(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                     const Activations& act, const void* hidden, const SequenceLayout& L,
                     Model::Outputs outputs) {
  const HeadConfig& hc = c.head;
  const int H = c.hidden_size;
  const bool logits = outputs.logits && hc.kind != HeadKind::kNone;
  // act.output is read through first_tokens only (model.h).
  const bool gather = act.output != nullptr;
  FTBERT_CHECK(!(logits && gather && hc.kind == HeadKind::kToken),
               "forward: a per-token head reads the final hidden states in a GEMM, so they cannot "
               "go to act.output");
  if (outputs.pooled || (logits && hc.reads_pooler)) {
    be.first_token_dense(dt, hidden, L, w.pooler_weight.data(), w.pooler_bias.data(), act.pooled,
                         act.first_tokens, H, H, Activation::kTanh, gather);
  }
  if (logits) head(be, dt, c, w, act, hidden, L);
}

}  // namespace ftbert::blocks
