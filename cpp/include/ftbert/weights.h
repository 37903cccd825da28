// Model weights: the host-side tensors handed to the engine (from the converted file), and their
// device copies in the compute dtype. Names and layouts are those of weights_tools/FORMAT.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/dtype.h"

namespace ftbert {

// A read-only view of a host tensor (e.g. a numpy array) with its stored dtype and shape.
struct HostTensor {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

using HostWeights = std::map<std::string, HostTensor>;

// A tensor a converted checkpoint holds: its name, shape, and whether it is a lookup table (an
// embedding, MPNet's relative bias: rows kept as HuggingFace stores them) rather than a Linear's
// matrix ([in, out], the transpose of nn.Linear's) or a vector.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool table = false;
  bool gemm_weight = false;  // multiplied only by Backend::weight_gemm (what quantization applies to)
};

// The tensors a converted checkpoint must hold for `config`, in file order: the one definition
// the loader and the converter (weights_tools/schema.py, through the binding) both read.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// A buffer in a backend's memory, freed with it. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct LayerWeights {
  // The four matrices are in Backend::weight_gemm's layout (upload_weight).
  DeviceBuffer qkv_weight;      // [H, 3H]  Q|K|V fused, (in, out)
  DeviceBuffer qkv_bias;        // [3H]
  DeviceBuffer attn_out_weight; // [H, H]
  DeviceBuffer attn_out_bias;   // [H]
  DeviceBuffer attn_ln_gamma;   // [H]
  DeviceBuffer attn_ln_beta;    // [H]
  DeviceBuffer ffn_in_weight;   // [H, I]
  DeviceBuffer ffn_in_bias;     // [I]
  DeviceBuffer ffn_out_weight;  // [I, H]
  DeviceBuffer ffn_out_bias;    // [H]
  DeviceBuffer ffn_ln_gamma;    // [H]
  DeviceBuffer ffn_ln_beta;     // [H]
};

struct ModelWeights {
  DeviceBuffer word_embeddings;        // [V, E]  (E = H without a projection)
  DeviceBuffer position_embeddings;    // [P, E]
  DeviceBuffer token_type_embeddings;  // [T, E]
  DeviceBuffer emb_ln_gamma;           // [E]
  DeviceBuffer emb_ln_beta;            // [E]
  DeviceBuffer project_weight;         // [E, H] (empty without a projection)
  DeviceBuffer project_bias;           // [H]
  std::vector<LayerWeights> layers;
  DeviceBuffer final_ln_gamma;         // [H] a pre-LayerNorm model's final norm (else empty)
  DeviceBuffer pooler_weight;          // [H, H] (empty without a pooler)
  DeviceBuffer pooler_bias;            // [H]
  DeviceBuffer head_dense_weight;      // [H, H] (a sequence head's own dense; else empty)
  DeviceBuffer head_dense_bias;        // [H]
  DeviceBuffer head_ln_gamma;          // [H] (a head with a norm; else empty)
  DeviceBuffer head_out_weight;        // [H, N] (empty without a head)
  DeviceBuffer head_out_bias;          // [N]
  size_t bytes = 0;                    // backend memory of all of the above
};

// Backend memory of buffers an architecture derives from its weights at load.
inline size_t bytes_of(const std::vector<DeviceBuffer>& buffers) {
  size_t n = 0;
  for (const DeviceBuffer& b : buffers) n += b.bytes();
  return n;
}

// A host tensor checked (present, of `shape`, finite) and widened to float32: for what an
// architecture computes from at load rather than uploads.
std::vector<float> host_tensor(const HostWeights& host, const std::string& name,
                               const std::vector<int64_t>& shape);

// Checks every expected tensor (present, shape, finite dtype) and uploads it in `compute` dtype.
ModelWeights upload_weights(Backend* backend, const ModelConfig& config, const HostWeights& host,
                            DType compute);

}  // namespace ftbert
