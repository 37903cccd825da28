// The rotary post-LayerNorm architecture (transformers' NomicBertModel, GteModel,
// JinaEmbeddingsV3Model; weights_tools/families.py's NOMIC_BERT, GTE, JINA_EMBEDDINGS_V3):
//   embeddings (word + token type, LN; no position table) -> L x [QKV GEMM -> + Q, K bias and
//   rotary -> attention (+ V bias) -> out GEMM + bias + residual -> LN -> FFN -> + residual -> LN]
//   -> pooler / head.
// BERT's layer with rotary positions in place of the position table, and an FFN that is BERT's
// act(x · W1 + b1) or a gated one, act(gate) · up from FFN-in [gate | up]. Biases a checkpoint
// lacks are zeros from the converter.
#include <algorithm>
#include <string>
#include <vector>

#include "core/models/blocks.h"
#include "core/models/models.h"
#include "ftbert/attention.h"
#include "ftbert/check.h"
#include "ftbert/host_convert.h"

namespace ftbert {
namespace {

// Per layer, [3H] in the compute dtype: zeros, zeros, then the V part of the layer's QKV bias.
// The rotary op adds the Q and K parts; attention adds this one, so V's costs no pass either.
std::vector<DeviceBuffer> v_biases(Backend* backend, const ModelConfig& c, const HostWeights& host,
                                   DType compute) {
  const int64_t H = c.hidden_size;
  std::vector<DeviceBuffer> out;
  for (int i = 0; i < c.num_layers; ++i) {
    std::vector<float> b = host_tensor(host, "layers." + std::to_string(i) + ".qkv_bias", {3 * H});
    std::fill(b.begin(), b.begin() + 2 * H, 0.0f);
    std::vector<unsigned char> bytes(b.size() * dtype_size(compute));
    convert_host(b.data(), DType::kFloat32, bytes.data(), compute, b.size());
    DeviceBuffer buf(backend, bytes.size());
    backend->copy_to_device(buf.data(), bytes.data(), bytes.size());
    out.push_back(std::move(buf));
  }
  return out;
}

// Per layer, whether a gated FFN-in has a bias that is not all zeros (NomicBERT's and GTE's are
// zeros from the converter: their pass over [M, 2I] is skipped).
std::vector<char> gate_biases(const ModelConfig& c, const HostWeights& host) {
  std::vector<char> out;
  for (int i = 0; i < c.num_layers && c.gated_mlp; ++i) {
    const std::vector<float> b = host_tensor(host, "layers." + std::to_string(i) + ".ffn_in_bias",
                                             {2 * int64_t{c.intermediate_size}});
    out.push_back(std::any_of(b.begin(), b.end(), [](float v) { return v != 0.0f; }));
  }
  return out;
}

class RotaryBertModel final : public Model {
 public:
  RotaryBertModel(const ModelConfig& config, const HostWeights& weights, Backend* backend,
                  DType compute)
      : Model(config, *backend, compute),
        weights_(upload_weights(backend, config_, weights, compute)),
        rotary_(blocks::upload_floats(backend, blocks::rotary_table(config_.max_seq(),
                                                                    config_.head_dim(),
                                                                    config_.rotary_theta,
                                                                    config_.rotary_scale))),
        dynamic_frequencies_(config_.rotary_dynamic()
                                 ? blocks::upload_floats(
                                       backend, blocks::rotary_dynamic_frequencies(
                                                    config_.max_seq(), config_.rotary_original_positions,
                                                    config_.head_dim(), config_.rotary_theta,
                                                    config_.rotary_dynamic_factor))
                                 : DeviceBuffer()),
        v_bias_(v_biases(backend, config_, weights, compute)),
        gate_bias_(gate_biases(config_, weights)) {
    backend->synchronize();  // the host tables are gone after this
  }

  void forward(Backend& be, const Activations& act, const int32_t* ids, const int32_t* types,
               const SequenceLayout& L, AttentionKind attention,
               Outputs outputs) const override {
    const DType dt = dtype_;
    const ModelConfig& c = config_;
    const int M = L.rows, H = c.hidden_size, I = c.intermediate_size;
    const float eps = c.layer_norm_eps;
    blocks::embeddings(be, dt, c, weights_, act, ids, types, L);
    void* const out = act.output != nullptr ? act.output : act.hidden;
    RotaryDynamic dynamic;
    if (c.rotary_dynamic()) {
      dynamic.inv_freq = dynamic_frequencies_.as<float>();
      dynamic.original = c.rotary_original_positions;
    }
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerWeights& l = weights_.layers[i];
      const bool last = i + 1 == c.num_layers;
      void* const y = last ? out : act.hidden;
      // qkv [M, 3H] = hidden · Wqkv; the rotary op adds Q's and K's bias before rotating them,
      // attention adds V's.
      be.weight_gemm(dt, M, 3 * H, H, act.hidden, H, l.qkv_weight.data(), act.qkv, 3 * H);
      be.rotary_embedding(dt, act.qkv, rotary_.as<float>(), L, c.num_heads, c.head_dim(),
                          l.qkv_bias.data(), dynamic);
      run_attention(be, attention, dt, act.qkv, v_bias_[i].data(), act.ctx, act.attention_scratch,
                    L, c.num_heads, c.head_dim(), AttentionOptions{});
      // hidden2 = LN(ctx · Wo + bo + hidden)
      be.dense_residual_layernorm(dt, M, H, H, act.ctx, l.attn_out_weight.data(),
                                  l.attn_out_bias.data(), act.hidden, l.attn_ln_gamma.data(),
                                  l.attn_ln_beta.data(), act.hidden2, eps, act.dense_workspace,
                                  act.dense_workspace_bytes);
      // f [M, I] = act(hidden2 · W1 + b1), or act(gate) · up with [gate | up] = hidden2 · W1 + b1
      const void* f = act.inter;
      if (c.gated_mlp) {
        be.weight_gemm(dt, M, 2 * I, H, act.hidden2, H, l.ffn_in_weight.data(), act.inter, 2 * I,
                       gate_bias_[i] ? l.ffn_in_bias.data() : nullptr, Activation::kIdentity);
        be.gated_activation(dt, act.inter, act.gated, M, I, c.activation);
        f = act.gated;
      } else {
        be.weight_gemm(dt, M, I, H, act.hidden2, H, l.ffn_in_weight.data(), act.inter, I,
                       l.ffn_in_bias.data(), c.activation);
      }
      // y = LN(f · W2 + b2 + hidden2); into act.output only the LayerNorm writes (model.h): the
      // product goes to ctx, free once the attention output above has read it.
      be.dense_residual_layernorm(dt, M, H, I, f, l.ffn_out_weight.data(), l.ffn_out_bias.data(),
                                  act.hidden2, l.ffn_ln_gamma.data(), l.ffn_ln_beta.data(), y, eps,
                                  act.dense_workspace, act.dense_workspace_bytes,
                                  last ? act.nonfinite : nullptr,
                                  y == act.hidden ? nullptr : act.ctx);
    }
    blocks::pooler_and_head(be, dt, c, weights_, act, out, L, outputs);
  }

  size_t weight_bytes() const override {
    return weights_.bytes + rotary_.bytes() + dynamic_frequencies_.bytes() + bytes_of(v_bias_);
  }

 private:
  ModelWeights weights_;
  DeviceBuffer rotary_;               // [P, d] float32
  DeviceBuffer dynamic_frequencies_;  // [P − original, d/2] float32; empty without dynamic scaling
  std::vector<DeviceBuffer> v_bias_;  // per layer [3H]: 0 | 0 | V's bias (v_biases)
  std::vector<char> gate_bias_;       // per layer, gated MLPs: FFN-in bias not all zeros
};

}  // namespace

std::unique_ptr<Model> create_rotary_bert(const ModelConfig& config, const HostWeights& weights,
                                          Backend* backend, DType compute) {
  FTBERT_CHECK_INPUT(config.rotary_theta > 0 && config.local_window == 0,
                     "config: architecture 'rotary_bert' needs a \"layer\" with a rotary_theta and "
                     "no sliding window (local_window 0)");
  FTBERT_CHECK_INPUT(config.relative_attention_buckets == 0 && !config.has_projection(),
                     "config: architecture 'rotary_bert' has no relative bias and no embedding "
                     "projection");
  FTBERT_CHECK_INPUT(!config.head.norm && !config.head.token_dense,
                     "config: architecture 'rotary_bert' runs BERT's heads: no head norm, no "
                     "token dense");
  return std::make_unique<RotaryBertModel>(config, weights, backend, compute);
}

}  // namespace ftbert
