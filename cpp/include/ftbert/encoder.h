// The Encoder: a Model (the weights and the math, model.h) and the Session that runs it
// (workspace, recordings, staging; session.h), behind one lock. This is what the Python binding
// holds.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "ftbert/attention.h"
#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/model.h"
#include "ftbert/session.h"
#include "ftbert/weights.h"

namespace ftbert {

class Encoder {
 public:
  Encoder(const ModelConfig& config, const HostWeights& weights, const std::string& device,
          DType compute);
  ~Encoder();

  // Runs the model. Host inputs are validated here (id ranges, mask values, sizes); the call
  // returns once host outputs are written, or after enqueueing when outputs are on the device.
  void forward(const ForwardArgs& args);

  const ModelConfig& config() const { return model_->config(); }
  DType dtype() const { return model_->dtype(); }
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
  // session's own buffers first. At most Session::kMaxRecordings shapes are kept (the least
  // recently used goes); a workspace that grows drops them all. Backends that do not record
  // (the CPU) run every forward op by op.
  void set_graphs(bool on);
  bool graphs() const { return graphs_; }
  size_t recorded_shapes() const;  // recordings held now

  // TF32 for float32 GEMMs (see Backend::set_allow_tf32); drops the recordings, which hold the
  // GEMMs as recorded.
  void set_allow_tf32(bool allow);

 private:
  void validate(const ForwardArgs& args) const;
  void validate_host_inputs(const ForwardArgs& args) const;

  std::unique_ptr<Backend> backend_;  // holds the weights; declared first, destroyed last
  std::unique_ptr<Model> model_;
  std::unique_ptr<Session> session_;
  std::atomic<AttentionMode> attention_mode_{AttentionMode::kAuto};
  std::atomic<bool> graphs_{true};
  mutable std::mutex mutex_;  // one forward at a time: the session's workspace is shared
};

}  // namespace ftbert
