// The BERT encoder, written once over the Backend interface:
//   embeddings+LN -> L x [QKV GEMM -> attention -> out GEMM -> bias+residual+LN
//                         -> FFN GEMM -> bias+act -> FFN GEMM -> bias+residual+LN] -> pooler
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
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
  // The stream to run on (Backend::set_stream), set under the forward's lock so that concurrent
  // callers on different streams cannot switch each other's stream mid-forward.
  std::optional<uintptr_t> stream;
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

  // Replaying repeated shapes (CUDA graphs). When on (the default), the second forward of a
  // shape (batch, seq, attention kernel, pooler or not) records the model's ops with
  // Backend::record, and it and later forwards of that shape replay them as one launch: the
  // 8 (flash) to 12 (unfused) launches per layer cost one. Inputs are then copied into the
  // encoder's own buffers first. At most kMaxRecordings shapes are kept (the least recently used
  // goes); a workspace that grows drops them all. Backends that do not record (the CPU) run every
  // forward op by op.
  void set_graphs(bool on);
  bool graphs() const { return graphs_; }
  size_t recorded_shapes() const;  // recordings held now
  static constexpr size_t kMaxRecordings = 32;

  // TF32 for float32 GEMMs (see Backend::set_allow_tf32); drops the recordings, which hold the
  // GEMMs as recorded.
  void set_allow_tf32(bool allow);

 private:
  // What a recording is specific to, besides the buffers.
  struct ShapeKey {
    int batch, seq;
    AttentionKind attention;
    bool pool;
    bool operator<(const ShapeKey& o) const {
      return std::tie(batch, seq, attention, pool) < std::tie(o.batch, o.seq, o.attention, o.pool);
    }
  };
  struct Recording {
    std::unique_ptr<RecordedOps> ops;
    uint64_t last_use = 0;
  };
  // The recording for `key`: the held one, or a new one of `enqueue` on the key's second
  // forward; null when the forward should run op by op.
  const RecordedOps* recording_for(const ShapeKey& key, const std::function<void()>& enqueue);
  void drop_recordings();

  void ensure_workspace(int batch, int seq);
  void validate_host_inputs(const ForwardArgs& args) const;
  // Embeddings, layers and pooler, from device ids/mask/types into hidden_ (and pooled_).
  void run_model(const int32_t* ids, const int32_t* mask, const int32_t* types, int batch,
                 int seq, AttentionKind attention, bool pool);
  void run_layer(const LayerWeights& w, const int32_t* mask, int batch, int seq,
                 AttentionKind attention);
  void ensure_attention_scratch(size_t bytes);

  ModelConfig config_;
  DType dtype_;
  std::unique_ptr<Backend> backend_;
  ModelWeights weights_;
  AttentionMode attention_mode_ = AttentionMode::kAuto;
  mutable std::mutex mutex_;

  bool graphs_ = true;
  bool backend_records_ = true;  // false once the backend declined to record
  std::map<ShapeKey, Recording> recordings_;
  std::set<ShapeKey> seen_once_;  // shapes run once, op by op
  uint64_t forwards_ = 0;         // the clock of Recording::last_use

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
