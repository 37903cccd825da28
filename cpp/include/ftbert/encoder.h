// The BERT encoder, written once over the Backend interface:
//   embeddings+LN -> L x [QKV GEMM -> attention -> out GEMM -> bias+residual+LN
//                         -> FFN GEMM -> bias+act -> FFN GEMM -> bias+residual+LN] -> pooler
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ftbert/attention.h"
#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/weights.h"

namespace ftbert {

// One forward's inputs and outputs. All pointers are host memory unless the matching *_on_device
// flag says they are the backend's memory (e.g. torch CUDA tensors).
struct ForwardArgs {
  const int32_t* input_ids = nullptr;       // [B, S]
  const int32_t* attention_mask = nullptr;  // [B, S] 1/0
  const int32_t* token_type_ids = nullptr;  // [B, S]
  int batch = 0;
  int seq = 0;
  bool inputs_on_device = false;
  void* last_hidden_state = nullptr;        // [B, S, H] in the compute dtype
  void* pooler_output = nullptr;            // [B, H] in the compute dtype, or null
  bool outputs_on_device = false;
};

class Encoder {
 public:
  Encoder(const ModelConfig& config, const HostWeights& weights, const std::string& device,
          DType compute);
  ~Encoder();

  // Runs the model. Host inputs are validated here (id ranges, mask values, sizes); the call
  // returns once host outputs are written, or after enqueueing when outputs are on the device.
  void forward(const ForwardArgs& args);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }

  void set_attention(AttentionMode mode);
  AttentionMode attention_mode() const { return attention_mode_; }
  // The kernel the selector picks for this batch shape.
  AttentionKind attention_for(int batch, int seq) const;

  // Bytes of activation workspace held now (grows to the largest batch x seq seen, then stays).
  size_t workspace_bytes() const;

 private:
  void ensure_workspace(int batch, int seq);
  void validate_host_inputs(const ForwardArgs& args) const;
  void run_layer(const LayerWeights& w, const int32_t* mask, int batch, int seq,
                 AttentionKind attention);
  void ensure_attention_scratch(size_t bytes);

  ModelConfig config_;
  DType dtype_;
  std::unique_ptr<Backend> backend_;
  ModelWeights weights_;
  AttentionMode attention_mode_ = AttentionMode::kAuto;
  std::mutex mutex_;

  // Workspace, sized for the largest B*S and the largest B seen (attention scratch: the
  // largest it needed).
  int64_t capacity_tokens_ = 0;
  int capacity_batch_ = 0;
  DeviceBuffer ids_, mask_, types_;   // [B, S] int32
  DeviceBuffer hidden_, hidden2_;     // [B, S, H]
  DeviceBuffer qkv_;                  // [B, S, 3H]
  DeviceBuffer ctx_;                  // [B, S, H]
  DeviceBuffer inter_;                // [B, S, I]
  DeviceBuffer pooled_;               // [B, H]
  DeviceBuffer attention_scratch_;    // run_attention's workspace (unfused: q, k, v, scores)
};

}  // namespace ftbert
