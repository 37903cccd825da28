// BERT's architecture, the post-LayerNorm encoder of BERT, RoBERTa, XLM-R, CamemBERT, DistilBERT
// and ELECTRA (weights_tools/families.py), over the Backend ops:
//   embeddings+LN (-> projection) -> L x [QKV GEMM -> attention -> out GEMM -> bias+residual+LN
//                                         -> FFN GEMM -> bias+act -> FFN GEMM -> bias+residual+LN]
//   -> pooler -> task head (sequence: token 0's dense + act, or the pooler; token: every token)
// No backend-specific code and no run-time state (buffers, recordings, locks) lives here.
#include "core/models/blocks.h"
#include "core/models/models.h"

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
               Outputs outputs) const override {
    const void* codes =
        blocks::embeddings(be, dtype_, config_, weights_, act, ids, types, layout, true);
    const void* out =
        blocks::post_ln_layers(be, dtype_, config_, weights_, act, layout, attention, {}, codes);
    blocks::pooler_and_head(be, dtype_, config_, weights_, act, out, layout, outputs);
  }

  size_t weight_bytes() const override { return weights_.bytes; }

 private:
  ModelWeights weights_;
};

}  // namespace

std::unique_ptr<Model> create_bert(const ModelConfig& config, const HostWeights& weights,
                                   Backend* backend, DType compute) {
  // Running a model with a relative position bias here would drop the bias without a word.
  FTBERT_CHECK_INPUT(config.relative_attention_buckets == 0,
                     "config: architecture 'bert' adds no relative position bias, but "
                     "relative_attention_num_buckets is "
                         << config.relative_attention_buckets << " (MPNet's runs as 'mpnet')");
  FTBERT_CHECK_INPUT(!config.head.norm && !config.head.token_dense,
                     "config: architecture 'bert' runs BERT's heads: no head norm, no token dense");
  FTBERT_CHECK_INPUT(!config.gated_mlp && config.rotary_theta == 0,
                     "config: architecture 'bert' runs BERT's post-LayerNorm layer, not the "
                     "\"layer\" the config describes");
  return std::make_unique<BertModel>(config, weights, backend, compute);
}

}  // namespace ftbert
