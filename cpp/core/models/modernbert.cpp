// ModernBERT's architecture (weights_tools/families.py's MODERNBERT; transformers' ModernBertModel):
//   embeddings (word + LN, no positions) -> L x [pre-LN (from layer 1) -> fused QKV GEMM ->
//   rotary -> attention (global, or a sliding window of ±local_window) -> out GEMM -> + residual
//   -> pre-LN -> FFN-in GEMM [input | gate] -> act(input) · gate -> FFN-out GEMM -> + residual]
//   -> final LN -> task head (dense + act + LN on token 0 or every token, then the classifier).
// No biases and no LayerNorm betas (transformers' defaults; the converter refuses other
// settings): the model keeps one zero buffer for the ops that take them.
#include "core/models/blocks.h"
#include "core/models/models.h"
#include "ftbert/attention.h"
#include "ftbert/check.h"

namespace ftbert {
namespace {

class ModernBertModel final : public Model {
 public:
  ModernBertModel(const ModelConfig& config, const HostWeights& weights, Backend* backend,
                  DType compute)
      : Model(config, *backend, compute),
        weights_(upload_weights(backend, config_, weights, compute)),
        global_rotary_(blocks::upload_floats(backend, blocks::rotary_table(config_.max_seq(), config_.head_dim(),
                                                           config_.rotary_theta))),
        local_rotary_(blocks::upload_floats(backend, blocks::rotary_table(config_.max_seq(), config_.head_dim(),
                                                          config_.local_rotary_theta))),
        zeros_(blocks::zeros(backend, 3 * static_cast<size_t>(config_.hidden_size) * dtype_size(compute))) {
    backend->synchronize();  // the host tables are gone after this
  }

  void forward(Backend& be, const Activations& act, const int32_t* ids, const int32_t* types,
               const SequenceLayout& L, AttentionKind attention,
               Outputs outputs) const override {
    const DType dt = dtype_;
    const ModelConfig& c = config_;
    const ModelWeights& w = weights_;
    const int M = L.rows, H = c.hidden_size, I = c.intermediate_size;
    const float eps = c.layer_norm_eps;
    const void* zero = zeros_.data();
    // The residual stream lives in act.hidden2; `a` is the normed input of the next sublayer.
    void* const x = act.hidden2;
    be.embed_layernorm(dt, ids, types, w.word_embeddings.data(), nullptr,
                       w.token_type_embeddings.data(), w.emb_ln_gamma.data(), zero, x, L, H,
                       c.vocab_size, c.type_vocab_size, eps, -1);
    // Rows past the tokens (a bucketed recording): attention never writes them in ctx.
    if (L.bounded) be.clear_rows_past_tokens(act.ctx, L, static_cast<size_t>(H) * dtype_size(dt));
    void* const out = act.output != nullptr ? act.output : act.hidden;
    const void* a = x;  // layer 0 has no pre-attention norm
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerWeights& l = w.layers[i];
      const bool last = i + 1 == c.num_layers;
      const bool global = c.global_layer(i);
      // qkv [M, 3H] = a · Wqkv, rotated; ctx = attention over the layer's window
      be.weight_gemm(dt, M, 3 * H, H, a, H, l.qkv_weight.data(), act.qkv, 3 * H);
      be.rotary_embedding(dt, act.qkv, (global ? global_rotary_ : local_rotary_).as<float>(), L,
                          c.num_heads, c.head_dim());
      AttentionOptions options;
      options.window = global ? 0 : c.local_window;
      run_attention(be, attention, dt, act.qkv, zero, act.ctx, act.attention_scratch, L,
                    c.num_heads, c.head_dim(), options);
      // x += ctx · Wo; m = LN_mlp(x) into ctx (read by the Wo GEMM already)
      be.weight_gemm(dt, M, H, H, act.ctx, H, l.attn_out_weight.data(), act.hidden, H);
      be.residual_add_layernorm(dt, x, act.hidden, nullptr, l.ffn_ln_gamma.data(), zero, act.ctx,
                                M, H, eps);
      // x += (act(m · Wi[:, :I]) · (m · Wi[:, I:])) · Wo; a = the next norm of x
      be.weight_gemm(dt, M, 2 * I, H, act.ctx, H, l.ffn_in_weight.data(), act.inter, 2 * I);
      be.gated_activation(dt, act.inter, act.gated, M, I, c.activation);
      be.weight_gemm(dt, M, H, I, act.gated, I, l.ffn_out_weight.data(), act.ctx, H);
      const void* gamma = last ? w.final_ln_gamma.data() : w.layers[i + 1].attn_ln_gamma.data();
      be.residual_add_layernorm(dt, x, act.ctx, nullptr, gamma, zero, last ? out : act.hidden, M,
                                H, eps, last ? act.nonfinite : nullptr);
      a = act.hidden;
    }
    if (outputs.logits && c.head.kind != HeadKind::kNone) head(be, act, out, L);
  }

 private:
  // transformers' ModernBertPredictionHead then the classifier: x = LN(act(x · Wd + bd)) on token
  // 0 or the mean of the tokens (sequence head, classifier_pooling "cls" or "mean") or on every
  // token, logits = x · Wout + bout.
  void head(Backend& be, const Activations& act, const void* hidden,
            const SequenceLayout& L) const {
    const DType dt = dtype_;
    const ModelWeights& w = weights_;
    const HeadConfig& hc = config_.head;
    const int H = config_.hidden_size, N = hc.num_labels;
    const float eps = config_.layer_norm_eps;
    if (hc.kind == HeadKind::kSequence) {
      const int B = L.batch;
      blocks::sequence_head_dense(be, dt, config_, w, act, hidden, L);
      be.residual_add_layernorm(dt, act.head_hidden, nullptr, nullptr, w.head_ln_gamma.data(),
                                zeros_.data(), act.pooled, B, H, eps);
      be.gemm(dt, false, false, B, N, H, act.pooled, H, w.head_out_weight.data(), N, act.logits, N);
      be.add_bias_activation(dt, act.logits, w.head_out_bias.data(), B, N, Activation::kIdentity);
      return;
    }
    // A per-token head reads every final hidden state in a GEMM (model.h: not act.output).
    FTBERT_CHECK(act.output == nullptr,
                 "forward: a per-token head reads the final hidden states in a GEMM, so they cannot "
                 "go to act.output");
    const int M = L.rows;
    be.gemm(dt, false, false, M, H, H, hidden, H, w.head_dense_weight.data(), H, act.ctx, H);
    be.add_bias_activation(dt, act.ctx, w.head_dense_bias.data(), M, H, hc.dense_activation);
    be.residual_add_layernorm(dt, act.ctx, nullptr, nullptr, w.head_ln_gamma.data(), zeros_.data(),
                              act.hidden2, M, H, eps);
    be.gemm(dt, false, false, M, N, H, act.hidden2, H, w.head_out_weight.data(), N, act.logits, N);
    be.add_bias_activation(dt, act.logits, w.head_out_bias.data(), M, N, Activation::kIdentity);
  }

 public:
  size_t weight_bytes() const override {
    return weights_.bytes + global_rotary_.bytes() + local_rotary_.bytes() + zeros_.bytes();
  }

 private:
  ModelWeights weights_;
  DeviceBuffer global_rotary_;  // [P, d] float32
  DeviceBuffer local_rotary_;   // [P, d] float32
  DeviceBuffer zeros_;          // [3H] in the compute dtype: the absent biases and betas
};

}  // namespace

std::unique_ptr<Model> create_modernbert(const ModelConfig& config, const HostWeights& weights,
                                         Backend* backend, DType compute) {
  FTBERT_CHECK_INPUT(config.gated_mlp && config.rotary_theta > 0 && config.local_rotary_theta > 0,
                     "config: a ModernBERT model needs its \"layer\" settings (rotary thetas, "
                     "windows)");
  FTBERT_CHECK_INPUT(!config.has_pooler, "config: ModernBERT has no pooler");
  FTBERT_CHECK_INPUT(config.rotary_scale == 1.0f && !config.rotary_dynamic(),
                     "config: ModernBERT runs no rope scaling (rotary_scale "
                         << config.rotary_scale << ", rotary_dynamic_factor "
                         << config.rotary_dynamic_factor << ")");
  FTBERT_CHECK_INPUT(config.head.kind == HeadKind::kNone || (config.head.has_dense() && config.head.norm),
                     "config: a ModernBERT head has a dense, an activation and a norm of its own");
  return std::make_unique<ModernBertModel>(config, weights, backend, compute);
}

}  // namespace ftbert
