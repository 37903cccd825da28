// MPNet's architecture (weights_tools/families.py's MPNET): BERT's post-LayerNorm layers with a
// relative position bias added to every layer's attention scores, one [buckets, heads] table shared
// by all layers (transformers' MPNetEncoder.compute_position_bias), RoBERTa's position ids and no
// token types. At load the table is expanded into a bias by distance, [heads, 2·span − 1] float32
// (span: the longest sequence), which the attention kernels read (AttentionOptions).
#include <cmath>
#include <vector>

#include "core/models/blocks.h"
#include "core/models/models.h"

namespace ftbert {

int relative_position_bucket(int distance) {
  // transformers computes n = −distance; the upper half of the buckets is for n < 0 (keys after
  // the query), the log part in float32 as torch does it.
  constexpr int kHalf = kRelativeBuckets / 2, kExact = kHalf / 2;
  const int n = -distance;
  const int base = n < 0 ? kHalf : 0;
  const int a = n < 0 ? -n : n;
  if (a < kExact) return base + a;
  const float ratio = static_cast<float>(a) / static_cast<float>(kExact);
  const auto log_span = static_cast<float>(std::log(static_cast<double>(kRelativeMaxDistance) / kExact));
  const int large = kExact + static_cast<int>(std::log(ratio) / log_span *
                                               static_cast<float>(kHalf - kExact));
  return base + (large < kHalf - 1 ? large : kHalf - 1);
}

namespace {

class MpnetModel final : public Model {
 public:
  MpnetModel(const ModelConfig& config, const HostWeights& weights, Backend* backend,
             DType compute)
      : Model(config, *backend, compute),
        weights_(upload_weights(backend, config_, weights, compute)),
        span_(config_.max_seq()),
        bias_(upload_bias(backend, bias_by_distance(config_, weights, span_))) {}

  void forward(Backend& be, const Activations& act, const int32_t* ids, const int32_t* types,
               const SequenceLayout& layout, AttentionKind attention,
               Outputs outputs) const override {
    AttentionOptions options;
    options.relative_bias = bias_.as<float>();
    options.relative_span = span_;
    const void* codes =
        blocks::embeddings(be, dtype_, config_, weights_, act, ids, types, layout, true);
    const void* out = blocks::post_ln_layers(be, dtype_, config_, weights_, act, layout,
                                             attention, options, codes);
    blocks::pooler_and_head(be, dtype_, config_, weights_, act, out, layout, outputs);
  }

 private:
  // [heads, 2·span − 1]: the bias of head h at distance j − i = k − (span − 1).
  static std::vector<float> bias_by_distance(const ModelConfig& c, const HostWeights& weights,
                                             int span) {
    const int heads = c.num_heads, width = 2 * span - 1;
    const std::vector<float> table = host_tensor(  // [buckets, heads]
        weights, "encoder.relative_attention_bias", {c.relative_attention_buckets, heads});
    std::vector<float> out(static_cast<size_t>(heads) * width);
    for (int k = 0; k < width; ++k) {
      const int bucket = relative_position_bucket(k - (span - 1));
      for (int h = 0; h < heads; ++h) out[static_cast<size_t>(h) * width + k] = table[bucket * heads + h];
    }
    return out;
  }

  static DeviceBuffer upload_bias(Backend* backend, const std::vector<float>& bias) {
    DeviceBuffer buf(backend, bias.size() * sizeof(float));
    backend->copy_to_device(buf.data(), bias.data(), bias.size() * sizeof(float));
    backend->synchronize();  // `bias` is gone after this
    return buf;
  }

 public:
  size_t weight_bytes() const override { return weights_.bytes + bias_.bytes(); }

 private:
  ModelWeights weights_;
  int span_;
  DeviceBuffer bias_;  // [heads, 2·span − 1] float32
};

}  // namespace

std::unique_ptr<Model> create_mpnet(const ModelConfig& config, const HostWeights& weights,
                                    Backend* backend, DType compute) {
  FTBERT_CHECK_INPUT(config.relative_attention_buckets > 0,
               "config: an MPNet model needs its relative_attention_num_buckets (got 0)");
  FTBERT_CHECK_INPUT(!config.head.norm && !config.head.token_dense,
                     "config: architecture 'mpnet' runs BERT's heads: no head norm, no token dense");
  FTBERT_CHECK_INPUT(!config.gated_mlp && config.rotary_theta == 0,
                     "config: architecture 'mpnet' runs BERT's post-LayerNorm layer, not the "
                     "\"layer\" the config describes");
  return std::make_unique<MpnetModel>(config, weights, backend, compute);
}

}  // namespace ftbert
