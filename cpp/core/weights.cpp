// Weight checks and upload: every tensor the config implies must be there with its exact shape;
// each is converted to the compute dtype on the host and uploaded once.
#include "ftbert/weights.h"

#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "ftbert/check.h"
#include "ftbert/host_convert.h"

namespace ftbert {

DeviceBuffer::DeviceBuffer(Backend* backend, size_t bytes)
    : backend_(backend), ptr_(backend->allocate(bytes)), bytes_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  if (backend_ && ptr_) backend_->deallocate(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (backend_ && ptr_) backend_->deallocate(ptr_);
    backend_ = std::exchange(other.backend_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

namespace {

// One row per tensor a config implies: its name in the converted file, its shape, and where
// upload_weights puts it. The one table both expected_tensors and upload_weights read.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DeviceBuffer* dest;
  bool gemm_weight = false;  // read only by Backend::weight_gemm: uploaded in its layout
  bool table = false;        // a lookup table (ExpectedTensor::table)
};

// Checked like the others but not uploaded: the architecture reads it from the host weights
// (MPNet's relative bias table, expanded at load into a table by distance).
constexpr DeviceBuffer* kHostOnly = nullptr;

std::vector<TensorSpec> pre_norm_tensor_table(const ModelConfig& c, ModelWeights* w,
                                              bool embedding_norm);

// The head's tensors, after the model's: its own dense, its norm, its output Linear.
void append_head(std::vector<TensorSpec>& t, const ModelConfig& c, ModelWeights* w) {
  const int64_t H = c.hidden_size;
  auto at = [&](DeviceBuffer ModelWeights::*m) { return w ? &(w->*m) : nullptr; };
  if (c.head.has_dense()) {
    t.push_back({"classifier.dense_weight", {H, H}, at(&ModelWeights::head_dense_weight)});
    t.push_back({"classifier.dense_bias", {H}, at(&ModelWeights::head_dense_bias)});
  }
  if (c.head.norm) t.push_back({"classifier.norm_gamma", {H}, at(&ModelWeights::head_ln_gamma)});
  if (c.head.kind != HeadKind::kNone) {
    const int64_t N = c.head.num_labels;
    t.push_back({"classifier.out_weight", {H, N}, at(&ModelWeights::head_out_weight)});
    t.push_back({"classifier.out_bias", {N}, at(&ModelWeights::head_out_bias)});
  }
}

// `w` may be null (the destinations are then null too): the names and shapes alone.
std::vector<TensorSpec> tensor_table(const ModelConfig& c, ModelWeights* w) {
  if (c.architecture == "modernbert") return pre_norm_tensor_table(c, w, true);
  if (c.architecture == "eurobert") return pre_norm_tensor_table(c, w, false);
  // BERT's tensors; rotary positions (rotary_bert) replace the position table, and a gated MLP
  // doubles the FFN-in width.
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.embedding_size;
  const int64_t F = c.ffn_in_width();
  auto at = [&](DeviceBuffer ModelWeights::*m) { return w ? &(w->*m) : nullptr; };
  std::vector<TensorSpec> t = {
      {"embeddings.word", {c.vocab_size, E}, at(&ModelWeights::word_embeddings), false, true},
      {"embeddings.token_type", {c.type_vocab_size, E}, at(&ModelWeights::token_type_embeddings),
       false, true},
      {"embeddings.ln_gamma", {E}, at(&ModelWeights::emb_ln_gamma)},
      {"embeddings.ln_beta", {E}, at(&ModelWeights::emb_ln_beta)},
  };
  if (c.has_position_table()) {
    t.insert(t.begin() + 1, {"embeddings.position", {c.max_position_embeddings, E},
                             at(&ModelWeights::position_embeddings), false, true});
  }
  if (c.has_projection()) {
    t.push_back({"embeddings.project_weight", {E, H}, at(&ModelWeights::project_weight)});
    t.push_back({"embeddings.project_bias", {H}, at(&ModelWeights::project_bias)});
  }
  if (c.relative_attention_buckets > 0) {
    t.push_back({"encoder.relative_attention_bias", {c.relative_attention_buckets, c.num_heads},
                 kHostOnly, false, true});
  }
  if (c.disentangled.on) {
    t.push_back({"encoder.rel_embeddings", {2 * int64_t{c.disentangled.span()}, H}, kHostOnly,
                 false, true});
    if (c.disentangled.norm) {
      t.push_back({"encoder.rel_ln_gamma", {H}, kHostOnly});
      t.push_back({"encoder.rel_ln_beta", {H}, kHostOnly});
    }
  }
  if (w) w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights* l = w ? &w->layers[i] : nullptr;
    auto in = [&](DeviceBuffer LayerWeights::*m) { return l ? &(l->*m) : nullptr; };
    t.push_back({p + "qkv_weight", {H, 3 * H}, in(&LayerWeights::qkv_weight), true});
    t.push_back({p + "qkv_bias", {3 * H}, in(&LayerWeights::qkv_bias)});
    t.push_back({p + "attn_out_weight", {H, H}, in(&LayerWeights::attn_out_weight), true});
    t.push_back({p + "attn_out_bias", {H}, in(&LayerWeights::attn_out_bias)});
    t.push_back({p + "attn_ln_gamma", {H}, in(&LayerWeights::attn_ln_gamma)});
    t.push_back({p + "attn_ln_beta", {H}, in(&LayerWeights::attn_ln_beta)});
    t.push_back({p + "ffn_in_weight", {H, F}, in(&LayerWeights::ffn_in_weight), true});
    t.push_back({p + "ffn_in_bias", {F}, in(&LayerWeights::ffn_in_bias)});
    t.push_back({p + "ffn_out_weight", {I, H}, in(&LayerWeights::ffn_out_weight), true});
    t.push_back({p + "ffn_out_bias", {H}, in(&LayerWeights::ffn_out_bias)});
    t.push_back({p + "ffn_ln_gamma", {H}, in(&LayerWeights::ffn_ln_gamma)});
    t.push_back({p + "ffn_ln_beta", {H}, in(&LayerWeights::ffn_ln_beta)});
  }
  if (c.has_pooler) {
    t.push_back({"pooler.weight", {H, H}, at(&ModelWeights::pooler_weight)});
    t.push_back({"pooler.bias", {H}, at(&ModelWeights::pooler_bias)});
  }
  append_head(t, c, w);
  return t;
}

// The pre-norm layers (ModernBERT's, EuroBERT's): no position table, a norm before attention and
// one before the MLP, fused QKV and [input | gate] FFN-in weights without biases, a final norm; no
// norm betas (the models supply zeros). ModernBERT norms its embeddings and its layer 0 reads that
// norm (no pre-attention norm of its own); EuroBERT's embeddings have none and every layer has its
// pre-attention norm.
std::vector<TensorSpec> pre_norm_tensor_table(const ModelConfig& c, ModelWeights* w,
                                              bool embedding_norm) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  auto at = [&](DeviceBuffer ModelWeights::*m) { return w ? &(w->*m) : nullptr; };
  std::vector<TensorSpec> t = {
      {"embeddings.word", {c.vocab_size, H}, at(&ModelWeights::word_embeddings), false, true},
      {"embeddings.token_type", {c.type_vocab_size, H}, at(&ModelWeights::token_type_embeddings),
       false, true},
  };
  if (embedding_norm) t.push_back({"embeddings.ln_gamma", {H}, at(&ModelWeights::emb_ln_gamma)});
  if (w) w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights* l = w ? &w->layers[i] : nullptr;
    auto in = [&](DeviceBuffer LayerWeights::*m) { return l ? &(l->*m) : nullptr; };
    if (i > 0 || !embedding_norm) {
      t.push_back({p + "attn_ln_gamma", {H}, in(&LayerWeights::attn_ln_gamma)});
    }
    t.push_back({p + "qkv_weight", {H, 3 * H}, in(&LayerWeights::qkv_weight), true});
    t.push_back({p + "attn_out_weight", {H, H}, in(&LayerWeights::attn_out_weight), true});
    t.push_back({p + "ffn_ln_gamma", {H}, in(&LayerWeights::ffn_ln_gamma)});
    t.push_back({p + "ffn_in_weight", {H, 2 * I}, in(&LayerWeights::ffn_in_weight), true});
    t.push_back({p + "ffn_out_weight", {I, H}, in(&LayerWeights::ffn_out_weight), true});
  }
  t.push_back({"final_norm.gamma", {H}, at(&ModelWeights::final_ln_gamma)});
  append_head(t, c, w);
  return t;
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  for (TensorSpec& t : tensor_table(c, nullptr)) {
    out.push_back({std::move(t.name), std::move(t.shape), t.table, t.gemm_weight});
  }
  return out;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

}  // namespace

std::vector<float> host_tensor(const HostWeights& host, const std::string& name,
                               const std::vector<int64_t>& shape) {
  const auto it = host.find(name);
  FTBERT_CHECK(it != host.end(), "weights: missing tensor '" << name << "'");
  const HostTensor& t = it->second;
  FTBERT_CHECK(t.shape == shape, "weights: tensor '" << name << "' has shape " << shape_str(t.shape)
                                                     << ", expected " << shape_str(shape));
  FTBERT_CHECK(t.data != nullptr || t.numel() == 0, "weights: tensor '" << name << "' has no data");
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> f32(n);
  convert_host(t.data, t.dtype, f32.data(), DType::kFloat32, n);
  // A NaN/inf weight poisons every output: refuse it here, by name.
  for (float v : f32) {
    FTBERT_CHECK(std::isfinite(v), "weights: tensor '" << name << "' holds a non-finite value");
  }
  return f32;
}

namespace {

// Looks up, checks and uploads one tensor in the compute dtype.
DeviceBuffer upload_one(Backend* backend, const HostWeights& host, const std::string& name,
                        const std::vector<int64_t>& shape, DType compute, bool gemm_weight) {
  const std::vector<float> f32 = host_tensor(host, name, shape);
  const size_t n = f32.size();
  // One float16 cannot hold poisons every output too.
  for (size_t i = 0; i < n; ++i) {
    FTBERT_CHECK(compute != DType::kFloat16 || std::fabs(f32[i]) <= 65504.0f,
                 "weights: tensor '" << name << "' holds " << f32[i]
                                     << ", beyond float16's range; use bfloat16 or float32");
  }
  std::vector<unsigned char> converted(n * dtype_size(compute));
  convert_host(f32.data(), DType::kFloat32, converted.data(), compute, n);
  if (gemm_weight) {
    const int k = static_cast<int>(shape[0]), cols = static_cast<int>(shape[1]);
    DeviceBuffer buf(backend, backend->weight_bytes(compute, k, cols));
    backend->upload_weight(compute, converted.data(), k, cols, buf.data());
    return buf;
  }
  DeviceBuffer buf(backend, converted.size());
  backend->copy_to_device(buf.data(), converted.data(), converted.size());
  return buf;
}

}  // namespace

ModelWeights upload_weights(Backend* backend, const ModelConfig& config, const HostWeights& host,
                            DType compute) {
  ModelWeights w;
  const std::vector<TensorSpec> table = tensor_table(config, &w);
  for (const auto& [name, tensor] : host) {
    bool known = false;
    for (const TensorSpec& t : table) known = known || t.name == name;
    FTBERT_CHECK(known, "weights: unexpected tensor '" << name << "' for this config");
  }
  for (const TensorSpec& t : table) {
    if (t.dest == kHostOnly) {
      host_tensor(host, t.name, t.shape);
      continue;
    }
    *t.dest = upload_one(backend, host, t.name, t.shape, compute, t.gemm_weight);
    w.bytes += t.dest->bytes();
  }
  backend->synchronize();  // the host staging buffers are gone after this function
  return w;
}

}  // namespace ftbert
