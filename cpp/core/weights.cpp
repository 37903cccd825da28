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

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
      {"embeddings.word", {c.vocab_size, H}},
      {"embeddings.position", {c.max_position_embeddings, H}},
      {"embeddings.token_type", {c.type_vocab_size, H}},
      {"embeddings.ln_gamma", {H}},
      {"embeddings.ln_beta", {H}},
  };
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    t.push_back({p + "qkv_weight", {H, 3 * H}});
    t.push_back({p + "qkv_bias", {3 * H}});
    t.push_back({p + "attn_out_weight", {H, H}});
    t.push_back({p + "attn_out_bias", {H}});
    t.push_back({p + "attn_ln_gamma", {H}});
    t.push_back({p + "attn_ln_beta", {H}});
    t.push_back({p + "ffn_in_weight", {H, I}});
    t.push_back({p + "ffn_in_bias", {I}});
    t.push_back({p + "ffn_out_weight", {I, H}});
    t.push_back({p + "ffn_out_bias", {H}});
    t.push_back({p + "ffn_ln_gamma", {H}});
    t.push_back({p + "ffn_ln_beta", {H}});
  }
  if (c.has_pooler) {
    t.push_back({"pooler.weight", {H, H}});
    t.push_back({"pooler.bias", {H}});
  }
  return t;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Looks up, checks and uploads one tensor in the compute dtype.
DeviceBuffer upload_one(Backend* backend, const HostWeights& host, const std::string& name,
                        const std::vector<int64_t>& shape, DType compute) {
  const auto it = host.find(name);
  FTBERT_CHECK(it != host.end(), "weights: missing tensor '" << name << "'");
  const HostTensor& t = it->second;
  FTBERT_CHECK(t.shape == shape, "weights: tensor '" << name << "' has shape " << shape_str(t.shape)
                                                     << ", expected " << shape_str(shape));
  FTBERT_CHECK(t.data != nullptr || t.numel() == 0, "weights: tensor '" << name << "' has no data");
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> f32(n);
  convert_host(t.data, t.dtype, f32.data(), DType::kFloat32, n);
  // A NaN/inf weight, or one float16 cannot hold, poisons every output: refuse it here, by name.
  for (size_t i = 0; i < n; ++i) {
    FTBERT_CHECK(std::isfinite(f32[i]), "weights: tensor '" << name << "' holds a non-finite value");
    FTBERT_CHECK(compute != DType::kFloat16 || std::fabs(f32[i]) <= 65504.0f,
                 "weights: tensor '" << name << "' holds " << f32[i]
                                     << ", beyond float16's range; use bfloat16 or float32");
  }
  std::vector<unsigned char> converted(n * dtype_size(compute));
  convert_host(f32.data(), DType::kFloat32, converted.data(), compute, n);
  DeviceBuffer buf(backend, converted.size());
  backend->copy_to_device(buf.data(), converted.data(), converted.size());
  return buf;
}

}  // namespace

ModelWeights upload_weights(Backend* backend, const ModelConfig& config, const HostWeights& host,
                            DType compute) {
  const auto expected = expected_tensors(config);
  for (const auto& [name, tensor] : host) {
    bool known = false;
    for (const auto& e : expected) known = known || e.first == name;
    FTBERT_CHECK(known, "weights: unexpected tensor '" << name << "' for this config");
  }
  std::size_t next = 0;
  auto up = [&](void) {
    const auto& e = expected[next++];
    return upload_one(backend, host, e.first, e.second, compute);
  };
  // The order below is expected_tensors' order.
  ModelWeights w;
  w.word_embeddings = up();
  w.position_embeddings = up();
  w.token_type_embeddings = up();
  w.emb_ln_gamma = up();
  w.emb_ln_beta = up();
  w.layers.resize(config.num_layers);
  for (auto& l : w.layers) {
    l.qkv_weight = up();
    l.qkv_bias = up();
    l.attn_out_weight = up();
    l.attn_out_bias = up();
    l.attn_ln_gamma = up();
    l.attn_ln_beta = up();
    l.ffn_in_weight = up();
    l.ffn_in_bias = up();
    l.ffn_out_weight = up();
    l.ffn_out_bias = up();
    l.ffn_ln_gamma = up();
    l.ffn_ln_beta = up();
  }
  if (config.has_pooler) {
    w.pooler_weight = up();
    w.pooler_bias = up();
  }
  backend->synchronize();  // the host staging buffers are gone after this function
  return w;
}

}  // namespace ftbert
