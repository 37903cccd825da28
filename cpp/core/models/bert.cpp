// BERT's architecture, the post-LayerNorm encoder of BERT, RoBERTa, XLM-R, CamemBERT, DistilBERT
// and ELECTRA (weights_tools/families.py), over the Backend ops:
//   embeddings+LN (-> projection) -> L x [QKV GEMM -> attention -> out GEMM -> bias+residual+LN
//                                         -> FFN GEMM -> bias+act -> FFN GEMM -> bias+residual+LN]
//   -> pooler -> task head (sequence: token 0's dense + act, or the pooler; token: every token)
// No backend-specific code and no run-time state (buffers, recordings, locks) lives here.
#include "core/models/models.h"
#include "ftbert/attention.h"
#include "ftbert/check.h"

namespace ftbert {
namespace {

class BertModel final : public Model {
 public:
  BertModel(const ModelConfig& config, const HostWeights& weights, Backend* backend,
            DType compute)
      : Model(config, *backend, compute),
        weights_(upload_weights(backend, config_, weights, compute)) {}

  void forward(Backend& be, const Activations& act, const int32_t* ids, const int32_t* types,
               const SequenceLayout& layout, AttentionKind attention,
               Outputs outputs) const override;

 private:
  // One post-LN layer: reads its input in act.hidden and writes its output to `out`.
  // `nonfinite`: given to the layer's last LayerNorm (the last layer's is the model's output).
  void layer(Backend& be, const Activations& act, const LayerWeights& w,
             const SequenceLayout& layout, AttentionKind attention, void* out,
             int32_t* nonfinite) const;
  // The task head: the final hidden states `hidden` (and act.pooled for a head on the pooler)
  // -> act.logits.
  void head(Backend& be, const Activations& act, const void* hidden,
            const SequenceLayout& layout) const;

  ModelWeights weights_;
};

void BertModel::forward(Backend& be, const Activations& act, const int32_t* ids,
                        const int32_t* types, const SequenceLayout& L, AttentionKind attention,
                        Outputs outputs) const {
  const ModelWeights& w = weights_;
  const int H = config_.hidden_size, E = config_.embedding_size, M = L.rows;
  const bool project = config_.has_projection();
  // embeddings [M, E] = LN(word + position + token type), then (ELECTRA) hidden = emb · Wp + bp
  be.embed_layernorm(dtype_, ids, types, w.word_embeddings.data(), w.position_embeddings.data(),
                     w.token_type_embeddings.data(), w.emb_ln_gamma.data(), w.emb_ln_beta.data(),
                     project ? act.embedded : act.hidden, L, E, config_.vocab_size,
                     config_.type_vocab_size, config_.layer_norm_eps, config_.position_pad_id);
  if (project) {
    be.gemm(dtype_, false, false, M, H, E, act.embedded, E, w.project_weight.data(), H,
            act.hidden, H);
    be.add_bias_activation(dtype_, act.hidden, w.project_bias.data(), M, H,
                           Activation::kIdentity);
  }
  // Rows past the tokens (a bucketed recording): the embeddings made them zeros and the per-row
  // ops keep them finite; attention never writes them, so its output there is zeroed once.
  if (L.bounded) be.clear_rows_past_tokens(act.ctx, L, static_cast<size_t>(H) * dtype_size(dtype_));
  void* const out = act.output != nullptr ? act.output : act.hidden;
  for (const LayerWeights& l : w.layers) {
    const bool last = &l == &w.layers.back();
    layer(be, act, l, L, attention, last ? out : act.hidden, last ? act.nonfinite : nullptr);
  }
  const HeadConfig& hc = config_.head;
  const bool logits = outputs.logits && hc.kind != HeadKind::kNone;
  // act.output is read through first_tokens only (model.h).
  const bool gather = act.output != nullptr;
  FTBERT_CHECK(!(logits && gather && hc.kind == HeadKind::kToken),
               "forward: a per-token head reads the final hidden states in a GEMM, so they cannot "
               "go to act.output");
  if (outputs.pooled || (logits && hc.reads_pooler)) {
    be.first_token_dense(dtype_, out, L, w.pooler_weight.data(), w.pooler_bias.data(),
                         act.pooled, act.first_tokens, H, H, Activation::kTanh, gather);
  }
  if (logits) head(be, act, out, L);
}

void BertModel::head(Backend& be, const Activations& act, const void* hidden,
                     const SequenceLayout& L) const {
  const ModelWeights& w = weights_;
  const HeadConfig& hc = config_.head;
  const int H = config_.hidden_size, N = hc.num_labels;
  // x [rows, H]: every token, the pooler output, or token 0 through the head's own dense.
  const void* x = hidden;
  int rows = L.rows;
  if (hc.kind == HeadKind::kSequence) {
    rows = L.batch;
    if (hc.reads_pooler) {
      x = act.pooled;
    } else {
      be.first_token_dense(dtype_, hidden, L, w.head_dense_weight.data(),
                           w.head_dense_bias.data(), act.head_hidden, act.first_tokens, H, H,
                           hc.dense_activation, act.output != nullptr);
      x = act.head_hidden;
    }
  }
  // logits [rows, N] = x · Wout + bout
  be.gemm(dtype_, false, false, rows, N, H, x, H, w.head_out_weight.data(), N, act.logits, N);
  be.add_bias_activation(dtype_, act.logits, w.head_out_bias.data(), rows, N,
                         Activation::kIdentity);
}

void BertModel::layer(Backend& be, const Activations& act, const LayerWeights& w,
                      const SequenceLayout& L, AttentionKind attention, void* out,
                      int32_t* nonfinite) const {
  const DType dt = dtype_;
  const int M = L.rows, H = config_.hidden_size, I = config_.intermediate_size;
  const float eps = config_.layer_norm_eps;

  // qkv [M, 3H] = hidden [M, H] · Wqkv [H, 3H]   (bias added inside attention)
  be.weight_gemm(dt, M, 3 * H, H, act.hidden, H, w.qkv_weight.data(), act.qkv, 3 * H);
  run_attention(be, attention, dt, act.qkv, w.qkv_bias.data(), act.ctx, act.attention_scratch, L,
                config_.num_heads, config_.head_dim());
  // hidden2 = LN(ctx · Wo + bo + hidden)
  be.dense_residual_layernorm(dt, M, H, H, act.ctx, w.attn_out_weight.data(),
                              w.attn_out_bias.data(), act.hidden, w.attn_ln_gamma.data(),
                              w.attn_ln_beta.data(), act.hidden2, eps, act.dense_workspace,
                              act.dense_workspace_bytes);
  // inter = act(hidden2 · W1 + b1)
  be.weight_gemm(dt, M, I, H, act.hidden2, H, w.ffn_in_weight.data(), act.inter, I,
                 w.ffn_in_bias.data(), config_.activation);
  // out = LN(inter · W2 + b2 + hidden2); into act.output, only the LayerNorm writes it (model.h):
  // the product goes to ctx, free once the attention output above has read it.
  be.dense_residual_layernorm(dt, M, H, I, act.inter, w.ffn_out_weight.data(),
                              w.ffn_out_bias.data(), act.hidden2, w.ffn_ln_gamma.data(),
                              w.ffn_ln_beta.data(), out, eps, act.dense_workspace,
                              act.dense_workspace_bytes, nonfinite,
                              out == act.hidden ? nullptr : act.ctx);
}

}  // namespace

std::unique_ptr<Model> create_bert(const ModelConfig& config, const HostWeights& weights,
                                   Backend* backend, DType compute) {
  return std::make_unique<BertModel>(config, weights, backend, compute);
}

}  // namespace ftbert
