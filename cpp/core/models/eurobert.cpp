// EuroBERT's architecture (transformers' EuroBertModel; weights_tools/families.py's EUROBERT): a
// Llama-style bidirectional encoder.
//   word embeddings (no norm) -> L x [RMSNorm -> QKV GEMM -> rotary -> attention -> out GEMM
//   + residual -> RMSNorm -> FFN-in GEMM [gate | up] -> act(gate) · up -> FFN-out GEMM
//   + residual] -> final RMSNorm -> task head.
// No biases (the converter refuses attention_bias / mlp_bias).
#include "core/models/blocks.h"
#include "core/models/models.h"
#include "ftbert/attention.h"
#include "ftbert/check.h"

namespace ftbert {
namespace {

class EuroBertModel final : public Model {
 public:
  EuroBertModel(const ModelConfig& config, const HostWeights& weights, Backend* backend,
                DType compute)
      : Model(config, *backend, compute),
        weights_(upload_weights(backend, config_, weights, compute)),
        rotary_(blocks::upload_floats(backend, blocks::rotary_table(config_.max_seq(),
                                                                    config_.head_dim(),
                                                                    config_.rotary_theta,
                                                                    config_.rotary_scale))),
        zeros_(blocks::zeros(backend, 3 * static_cast<size_t>(config_.hidden_size) *
                                          dtype_size(compute))) {
    backend->synchronize();  // the host table is gone after this
  }

  void forward(Backend& be, const Activations& act, const int32_t* ids, const int32_t* types,
               const SequenceLayout& L, AttentionKind attention,
               Outputs outputs) const override {
    (void)types;  // no token types: the inputs' check admits type 0 only
    const DType dt = dtype_;
    const ModelConfig& c = config_;
    const ModelWeights& w = weights_;
    const int M = L.rows, H = c.hidden_size, I = c.intermediate_size;
    const float eps = c.layer_norm_eps;
    // The residual stream lives in act.hidden2; act.hidden holds the normed input of a sublayer.
    void* const x = act.hidden2;
    be.embed_rmsnorm(dt, ids, w.word_embeddings.data(), w.layers[0].attn_ln_gamma.data(), x,
                     act.hidden, L, H, c.vocab_size, eps);
    // Rows past the tokens (a bucketed recording): attention never writes them in ctx.
    if (L.bounded) be.clear_rows_past_tokens(act.ctx, L, static_cast<size_t>(H) * dtype_size(dt));
    void* const out = act.output != nullptr ? act.output : act.hidden;
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerWeights& l = w.layers[i];
      const bool last = i + 1 == c.num_layers;
      // qkv [M, 3H] = a · Wqkv, rotated; ctx = attention
      be.weight_gemm(dt, M, 3 * H, H, act.hidden, H, l.qkv_weight.data(), act.qkv, 3 * H);
      be.rotary_embedding(dt, act.qkv, rotary_.as<float>(), L, c.num_heads, c.head_dim());
      run_attention(be, attention, dt, act.qkv, zeros_.data(), act.ctx, act.attention_scratch, L,
                    c.num_heads, c.head_dim(), AttentionOptions{});
      // x += ctx · Wo; m = RMSNorm(x) into ctx (read by the Wo GEMM already)
      be.weight_gemm(dt, M, H, H, act.ctx, H, l.attn_out_weight.data(), act.hidden, H);
      be.residual_add_rmsnorm(dt, x, act.hidden, nullptr, l.ffn_ln_gamma.data(), act.ctx, M, H,
                              eps);
      // x += (act(m · Wg) · (m · Wu)) · Wd; the next sublayer's input = RMSNorm(x)
      be.weight_gemm(dt, M, 2 * I, H, act.ctx, H, l.ffn_in_weight.data(), act.inter, 2 * I);
      be.gated_activation(dt, act.inter, act.gated, M, I, c.activation);
      be.weight_gemm(dt, M, H, I, act.gated, I, l.ffn_out_weight.data(), act.ctx, H);
      const void* gamma = last ? w.final_ln_gamma.data() : w.layers[i + 1].attn_ln_gamma.data();
      be.residual_add_rmsnorm(dt, x, act.ctx, nullptr, gamma, last ? out : act.hidden, M, H, eps,
                              last ? act.nonfinite : nullptr);
    }
    blocks::pooler_and_head(be, dt, c, w, act, out, L, outputs);
  }

  size_t weight_bytes() const override { return weights_.bytes + rotary_.bytes() + zeros_.bytes(); }

 private:
  ModelWeights weights_;
  DeviceBuffer rotary_;  // [P, d] float32
  DeviceBuffer zeros_;   // [3H] in the compute dtype: attention's QKV bias (there is none)
};

}  // namespace

std::unique_ptr<Model> create_eurobert(const ModelConfig& config, const HostWeights& weights,
                                       Backend* backend, DType compute) {
  FTBERT_CHECK_INPUT(config.rotary_theta > 0 && config.local_window == 0 && config.gated_mlp,
                     "config: architecture 'eurobert' needs a \"layer\" with a rotary_theta, a "
                     "gated MLP and no sliding window");
  FTBERT_CHECK_INPUT(!config.has_pooler, "config: EuroBERT has no pooler");
  FTBERT_CHECK_INPUT(!config.rotary_dynamic(), "config: architecture 'eurobert' runs no dynamic rope "
                                               "scaling (rotary_dynamic_factor "
                                                   << config.rotary_dynamic_factor << ")");
  FTBERT_CHECK_INPUT(!config.head.norm && !config.head.token_dense,
                     "config: a EuroBERT head has no norm and no token dense");
  return std::make_unique<EuroBertModel>(config, weights, backend, compute);
}

}  // namespace ftbert
