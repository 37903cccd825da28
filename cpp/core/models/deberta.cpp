// DeBERTa-v2/v3 (transformers' DebertaV2Model; weights_tools/families.py's DEBERTA_V2): BERT's
// post-LayerNorm layers whose attention is disentangled (DisentangledConfig), no absolute
// positions unless position_biased_input, token types only where the checkpoint has them.
//   embeddings (word (+ position) (+ token type), LN) -> L x [QKV GEMM + bias -> c2p and p2c terms
//   -> attention -> out GEMM + bias + residual -> LN -> FFN -> + residual -> LN] -> head
// The relative embeddings and their norm are weights: each layer's relative queries and keys
// (the norm's output through that layer's Q|K|V projection) are computed once, at load, on the
// backend, as the layer's own GEMM computes its tokens'.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/models/blocks.h"
#include "core/models/models.h"
#include "ftbert/attention.h"
#include "ftbert/check.h"
#include "ftbert/host_convert.h"

namespace ftbert {

namespace {

// transformers' make_log_bucket_position for one distance: exact inside ±bucket_size/2, then
// ceil(log(|δ| / mid) / log((max_position − 1) / mid) · (mid − 1)) + mid with δ's sign, in float32.
int log_bucket(int distance, int bucket_size, int max_position) {
  const int mid = bucket_size / 2;
  const int a = distance < 0 ? -distance : distance;
  if (a <= mid) return distance;
  const auto reach = static_cast<float>(static_cast<double>(max_position - 1) / mid);
  const float scaled = std::log(static_cast<float>(a) / static_cast<float>(mid)) / std::log(reach) *
                       static_cast<float>(mid - 1);
  const int bucket = static_cast<int>(std::ceil(scaled)) + mid;
  return distance < 0 ? -bucket : bucket;
}

}  // namespace

int disentangled_column(const DisentangledConfig& d, int distance) {
  const int span = d.span();
  const int bucket = d.position_buckets > 0
                         ? log_bucket(distance, d.position_buckets, d.max_relative_positions)
                         : distance;
  return std::clamp(bucket + span, 0, 2 * span - 1);
}

namespace {

// [2·P − 1]: the column of every distance −(P − 1) .. P − 1.
std::vector<int32_t> columns(const DisentangledConfig& d, int positions) {
  std::vector<int32_t> out(2 * static_cast<size_t>(positions) - 1);
  for (int i = 0; i < static_cast<int>(out.size()); ++i) {
    out[i] = disentangled_column(d, i - (positions - 1));
  }
  return out;
}

// Rows of the relative tables: 2·span, padded to a multiple of 8 (DisentangledAttention::width).
int position_rows(const ModelConfig& c) { return (2 * c.disentangled.span() + 7) / 8 * 8; }

// [position_rows, H] in the compute dtype: the relative embeddings, LayerNorm'd in float32 where
// the model norms them (as torch's LayerNorm computes a half-precision input); zero padding rows.
DeviceBuffer relative_embeddings(Backend* backend, const ModelConfig& c, const HostWeights& host,
                                 DType compute) {
  const int64_t rows = 2 * int64_t{c.disentangled.span()}, H = c.hidden_size;
  std::vector<float> e = host_tensor(host, "encoder.rel_embeddings", {rows, H});
  e.resize(static_cast<size_t>(position_rows(c)) * H, 0.0f);
  if (c.disentangled.norm) {
    const std::vector<float> gamma = host_tensor(host, "encoder.rel_ln_gamma", {H});
    const std::vector<float> beta = host_tensor(host, "encoder.rel_ln_beta", {H});
    for (int64_t r = 0; r < rows; ++r) {
      float* x = e.data() + r * H;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < H; ++i) mean += x[i];
      mean /= static_cast<double>(H);
      for (int64_t i = 0; i < H; ++i) var += (x[i] - mean) * (x[i] - mean);
      var /= static_cast<double>(H);
      const double inv = 1.0 / std::sqrt(var + c.layer_norm_eps);
      for (int64_t i = 0; i < H; ++i) {
        x[i] = static_cast<float>((x[i] - mean) * inv) * gamma[i] + beta[i];
      }
    }
  }
  std::vector<unsigned char> bytes(e.size() * dtype_size(compute));
  convert_host(e.data(), DType::kFloat32, bytes.data(), compute, e.size());
  DeviceBuffer buf(backend, bytes.size());
  backend->copy_to_device(buf.data(), bytes.data(), bytes.size());
  backend->synchronize();  // `bytes` is gone after this
  return buf;
}

// Whether each distance's row is the previous distance's or the next one, as the fused kernel's
// inline terms assume (a tile's distances then reach no more rows than there are distances): true
// of DeBERTa's log buckets, which grow slower than the distance.
bool unit_steps(const std::vector<int32_t>& columns) {
  for (size_t i = 1; i < columns.size(); ++i) {
    const int32_t step = columns[i] - columns[i - 1];
    if (step < 0 || step > 1) return false;
  }
  return true;
}

class DebertaModel final : public Model {
 public:
  DebertaModel(const ModelConfig& config, const HostWeights& weights, Backend* backend,
               DType compute)
      : Model(config, *backend, compute),
        weights_(upload_weights(backend, config_, weights, compute)),
        zero_bias_(blocks::zeros(backend, 3 * static_cast<size_t>(config_.hidden_size) *
                                              dtype_size(compute))),
        host_columns_(columns(config_.disentangled, config_.max_seq())),
        columns_(blocks::upload_ints(backend, host_columns_)),
        inline_terms_(backend->flash_computes_terms(compute, config_.head_dim()) &&
                      unit_steps(host_columns_)) {
    const ModelConfig& c = config_;
    const int rows = position_rows(c), H = c.hidden_size;
    const DeviceBuffer rel = relative_embeddings(backend, c, weights, compute);
    for (const LayerWeights& l : weights_.layers) {
      // [position_rows, 3H] = rel · Wqkv + b: the relative queries | keys | (unused) values.
      DeviceBuffer p(backend, static_cast<size_t>(rows) * 3 * H * dtype_size(compute));
      backend->weight_gemm(compute, rows, 3 * H, H, rel.data(), H, l.qkv_weight.data(), p.data(),
                           3 * H, l.qkv_bias.data(), Activation::kIdentity);
      positions_.push_back(std::move(p));
    }
    backend->synchronize();  // `rel` and the host tables are gone after this
  }

  bool terms_in_attention() const override { return inline_terms_; }

  size_t attention_scratch_bytes(AttentionKind kind, int batch, int seq,
                                 int64_t rows) const override {
    const size_t own = Model::attention_scratch_bytes(kind, batch, seq, rows);
    if (kind == AttentionKind::kFlash && inline_terms_) return own;
    return own + disentangled_scratch_bytes(kind, dtype_, rows, batch, seq, config_.num_heads,
                                            attention(nullptr, nullptr));
  }

  void forward(Backend& be, const Activations& act, const int32_t* ids, const int32_t* types,
               const SequenceLayout& L, AttentionKind kind, Outputs outputs) const override {
    const DType dt = dtype_;
    const ModelConfig& c = config_;
    const int M = L.rows, H = c.hidden_size;
    // The terms' scratch follows run_attention's own.
    void* const scratch = static_cast<char*>(act.attention_scratch) +
                          Model::attention_scratch_bytes(kind, L.batch, L.max_seq, M);
    blocks::embeddings(be, dt, c, weights_, act, ids, types, L);
    void* const out = act.output != nullptr ? act.output : act.hidden;
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerWeights& l = weights_.layers[i];
      const bool last = i + 1 == c.num_layers;
      // qkv [M, 3H] = hidden · Wqkv + b: the terms read the biased q and k, so attention gets a
      // zero bias.
      be.weight_gemm(dt, M, 3 * H, H, act.hidden, H, l.qkv_weight.data(), act.qkv, 3 * H,
                     l.qkv_bias.data(), Activation::kIdentity);
      const DisentangledAttention da = attention(positions_[i].data(), scratch);
      AttentionOptions options;
      options.disentangled = &da;
      run_attention(be, kind, dt, act.qkv, zero_bias_.data(), act.ctx, act.attention_scratch, L,
                    c.num_heads, c.head_dim(), options);
      blocks::post_ln_output(be, dt, c, act, l, L, last ? out : act.hidden,
                             last ? act.nonfinite : nullptr);
    }
    blocks::pooler_and_head(be, dt, c, weights_, act, out, L, outputs);
  }

 private:
  DisentangledAttention attention(const void* positions, void* scratch) const {
    DisentangledAttention da;
    const int center = config_.max_seq() - 1;
    da.positions = positions;
    da.position_rows = position_rows(config_);
    da.column = columns_.as<int32_t>() + center;
    da.host_column = host_columns_.data() + center;
    da.max_distance = config_.max_seq();
    da.c2p = config_.disentangled.c2p;
    da.p2c = config_.disentangled.p2c;
    da.inline_terms = inline_terms_;
    da.scratch = scratch;
    return da;
  }

 public:
  size_t weight_bytes() const override {
    return weights_.bytes + zero_bias_.bytes() + columns_.bytes() + bytes_of(positions_);
  }

 private:
  ModelWeights weights_;
  DeviceBuffer zero_bias_;              // [3H]
  std::vector<int32_t> host_columns_;   // [2·P − 1] (columns)
  DeviceBuffer columns_;                // the same, in backend memory
  std::vector<DeviceBuffer> positions_;  // per layer [position_rows, 3H]
  bool inline_terms_;  // the fused attention computes the terms: no tables in its scratch
};

}  // namespace

std::unique_ptr<Model> create_deberta(const ModelConfig& config, const HostWeights& weights,
                                      Backend* backend, DType compute) {
  const DisentangledConfig& d = config.disentangled;
  FTBERT_CHECK_INPUT(d.on && (d.c2p || d.p2c),
                     "config: architecture 'deberta' needs a \"disentangled\" object with c2p or "
                     "p2c (DeBERTa without relative attention is not run)");
  FTBERT_CHECK_INPUT(d.position_buckets <= 0 || d.max_relative_positions > d.position_buckets / 2 + 1,
                     "config: disentangled.max_relative_positions "
                         << d.max_relative_positions << " must exceed position_buckets / 2 + 1 ("
                         << d.position_buckets / 2 + 1 << ") for the log buckets");
  FTBERT_CHECK_INPUT(!config.gated_mlp && config.rotary_theta == 0 &&
                         config.relative_attention_buckets == 0 && !config.has_projection(),
                     "config: architecture 'deberta' runs BERT's post-LayerNorm layer: no \"layer\", "
                     "no relative bias table, no embedding projection");
  FTBERT_CHECK_INPUT(!config.head.norm && !config.head.token_dense,
                     "config: architecture 'deberta' runs BERT's heads: no head norm, no token "
                     "dense");
  return std::make_unique<DebertaModel>(config, weights, backend, compute);
}

}  // namespace ftbert
