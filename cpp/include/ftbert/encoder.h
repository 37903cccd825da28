// The Encoder: a Model (the weights and the math, model.h) and a small pool of Sessions that run
// it (workspace, recordings, staging; session.h). This is what the Python binding holds.
//
// Concurrency contract: forward() may be called from any number of threads, each on its own
// stream or the same one; every result equals the one-at-a-time result. Each forward runs in a
// session of its own for its duration. Up to concurrency() sessions exist (created on demand),
// so that many forwards run on the device at once, each in its own buffers; beyond that,
// callers wait for a free session. A session reused from another stream is ordered after its
// last work there (Backend::set_stream), so no two streams ever race on a session's buffers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "ftbert/attention.h"
#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/model.h"
#include "ftbert/session.h"
#include "ftbert/weights.h"

namespace ftbert {

class Encoder {
 public:
  // quantization: how the backend keeps the weights (Backend::set_quantization); refused, naming
  // why, where the backend cannot.
  Encoder(const ModelConfig& config, const HostWeights& weights, const std::string& device,
          DType compute, Quantization quantization = Quantization::kNone);
  ~Encoder();

  // Runs the model. Sizes are checked here (batch, sequence length against the position table).
  // Host input values are the caller's to check (the Python API does, python/ftbert/inputs.py);
  // device inputs are checked as they are staged (Backend::stage_inputs: a bad value is stored as
  // 0 and recorded for take_bad_input), and the embedding kernels clamp ids and token types into
  // their tables besides, so no value reads out of bounds. Returns once host outputs are written,
  // or after enqueueing when outputs are on the device.
  ForwardResult forward(const ForwardArgs& args);

  // The first bad value of device inputs that a forward's staging found (Backend::stage_inputs),
  // cleared as it is taken; field kNone when there is none. Read without waiting: a forward
  // still running on the device may record one later.
  BadInputValue take_bad_input();
  // Waits for the work of every session (each on the stream it last ran on).
  void synchronize();

  const ModelConfig& config() const { return model_->config(); }
  DType dtype() const { return model_->dtype(); }
  Quantization quantization() const { return backend_->quantization(); }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }

  // Padding-free execution (sequences.h): kOn packs every batch, kOff never, kAuto by
  // padding_free_for's rule; a call with ForwardArgs::padded runs padded whatever it says. A
  // model with dynamic rope scaling (ModelConfig::rotary_dynamic) packs every forward whatever the
  // mode (padding_free_for says so), and refuses ForwardArgs::padded.
  enum class PaddingFree : int { kAuto = 0, kOff = 1, kOn = 2 };
  void set_padding_free(PaddingFree mode) { padding_free_ = mode; }
  PaddingFree padding_free() const { return padding_free_; }
  // Whether a batch of `tokens` attended tokens in [batch, seq] runs packed (tokens < 0: not known
  // on the host, as for device inputs, where auto stays padded rather than wait for a count).
  // `first_token_differs`: a first-token output (pooler, sequence head) is asked for and some
  // sequence's position 0 is padding (left padding, an empty row): padded, the first token is that
  // padding position, as in transformers; packed, it is the sequence's first real token. Auto then
  // stays padded, so that it never changes a result.
  bool padding_free_for(int batch, int seq, int64_t tokens, bool first_token_differs = false) const;
  // Whether auto counts a batch of device inputs on the device (one read back of the count, a
  // wait for the caller's stream up to the inputs) and packs it where packing pays: from
  // kAutoDeviceCountMinPositions positions and 2 sequences, where the saving outweighs the wait.
  bool auto_counts_on_device(int batch, int seq) const;
  static constexpr int64_t kAutoDeviceCountMinPositions = 4096;

  void set_attention(AttentionMode mode);
  AttentionMode attention_mode() const { return attention_mode_; }
  // The kernel the selector picks for this batch shape.
  AttentionKind attention_for(int batch, int seq) const;

  // How many forwards may run at once, each in a session (workspace, recordings, stream and
  // cuBLAS handle) of its own. Lowering it frees the sessions beyond the new count once idle.
  void set_concurrency(int sessions);
  int concurrency() const { return concurrency_; }
  static constexpr int kMaxConcurrency = 64;

  // Bytes of activation workspace held now, over all sessions (each grows to the largest
  // batch x seq it ran, then stays).
  size_t workspace_bytes() const;
  // Grows the workspace of the session a host caller's next forward takes to what a forward of
  // `batch` sequences of up to `seq` positions over `rows` rows (B * S, or fewer packed) takes,
  // running nothing: growing it later, under traffic, costs that forward the allocation (and, on
  // the GPU, drops every recording made before). Where forwards are recorded, packed inputs run
  // at their recorded shape (recorded_packed_shape), which is the one to reserve.
  void reserve_workspace(int batch, int seq, int64_t rows);
  // Bytes of backend memory the weights take (Model::weight_bytes).
  size_t weight_bytes() const { return model_->weight_bytes(); }
  // Model::terms_in_attention: DeBERTa's terms computed inside the fused attention.
  bool terms_in_attention() const { return model_->terms_in_attention(); }

  // Replaying repeated shapes (CUDA graphs). When on (the default), the second forward of a
  // shape (batch, seq, packed or not and its token-count bucket, attention kernel, outputs) in a
  // session records the model's ops
  // with Backend::record, and it and later forwards of that shape replay them as one launch:
  // the 8 (flash) to 12 (unfused) launches per layer cost one. Recordings read the inputs from
  // the session's own buffers, where every forward stages them first (Session::stage_inputs).
  // At most Session::kMaxRecordings shapes are kept per session (the least recently used goes);
  // a workspace that grows drops them all. Backends that do not record (the CPU) run every
  // forward op by op.
  void set_graphs(bool on);
  bool graphs() const { return graphs_; }
  size_t recorded_shapes() const;  // recordings held now, over all sessions
  // Forwards since the encoder was made, over all its sessions: {replayed, recorded, op by op}.
  std::tuple<uint64_t, uint64_t, uint64_t> graph_counts() const;

  // TF32 for float32 GEMMs (see Backend::set_allow_tf32); drops the recordings, which hold the
  // GEMMs as recorded.
  void set_allow_tf32(bool allow);

  // Batch invariance (Backend::set_batch_invariant): on, every batch runs packed (so a sequence
  // is laid out the same whatever its padding; a first-token output is its first real token) on
  // the backend's invariant kernels, and each sequence's outputs are the same bits whatever else
  // is in its batch. A call with ForwardArgs::padded runs padded on those kernels: the same bits
  // whatever else is in its batch too, for a sequence of the same padded length and mask, but
  // not a packed forward's. Refused, naming why, where the backend cannot keep this dtype and
  // attention invariant; set_attention is refused likewise while it is on. Drops the recordings.
  void set_batch_invariant(bool on);
  bool batch_invariant() const { return batch_invariant_; }

 private:
  // A place in the pool. `mutex` is held by the forward running in it and by setting changes;
  // the other fields are guarded by pool_mutex_.
  struct Slot {
    explicit Slot(size_t i) : index(i) {}
    const size_t index;                // slot 0 runs on the backend that holds the weights
    std::unique_ptr<Session> session;  // null until first used, or after being trimmed
    std::mutex mutex;
    bool busy = false;
    uintptr_t last_stream = 0;
  };
  // Takes an idle slot (one last used on `stream` if there is one), waiting while every slot
  // is busy; returns it marked busy. release() gives it back.
  Slot& acquire(uintptr_t stream);
  void release(Slot& slot, uintptr_t stream);
  // Gives an acquired slot back, marked last used on `stream`, however the scope ends. Declare
  // it before the lock_guard on slot.mutex: release() may take that mutex to trim the slot.
  class Lease {
   public:
    Lease(Encoder* encoder, Slot& slot, uintptr_t stream)
        : encoder_(encoder), slot_(slot), stream_(stream) {}
    ~Lease() { encoder_->release(slot_, stream_); }
    Lease(const Lease&) = delete;  // one release per acquire
    Lease& operator=(const Lease&) = delete;

   private:
    Encoder* const encoder_;
    Slot& slot_;
    const uintptr_t stream_;
  };
  // The slot's session, made on first use. The caller holds slot.mutex.
  Session& session_of(Slot& slot);
  // The slots that exist now (stable pointers; slots are never removed).
  std::vector<Slot*> slots() const;
  void validate(const ForwardArgs& args) const;

  std::string device_;
  std::unique_ptr<Backend> backend_;  // holds the weights and runs slot 0; destroyed last
  std::unique_ptr<Model> model_;
  std::atomic<AttentionMode> attention_mode_{AttentionMode::kAuto};
  std::atomic<PaddingFree> padding_free_{PaddingFree::kAuto};
  std::atomic<bool> graphs_{true};
  std::atomic<bool> allow_tf32_{false};
  std::atomic<bool> batch_invariant_{false};
  std::atomic<int> concurrency_{1};
  // Where stage_inputs records bad device input values: host memory the device writes, shared by
  // the sessions (the first bad value of any forward).
  BadInputValue* bad_input_host_ = nullptr;
  BadInputValue* bad_input_device_ = nullptr;

  mutable std::mutex pool_mutex_;
  Session::GraphCounts graph_counts_;  // every session's forwards (Session::count_graphs_into)
  std::condition_variable slot_freed_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace ftbert
