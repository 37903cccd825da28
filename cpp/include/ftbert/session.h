// A session runs the model at run time: it owns what one forward needs besides the weights —
// the activation workspace, the recordings (CUDA graphs) of repeated shapes, input staging and
// output copies — and the backend (stream, cuBLAS handle) its work is enqueued on. One forward
// runs in a session at a time; the Encoder (encoder.h) hands sessions to callers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "ftbert/backend.h"
#include "ftbert/model.h"
#include "ftbert/weights.h"

namespace ftbert {

// One forward's inputs and outputs. All pointers are host memory unless the matching *_on_device
// flag says they are the backend's memory (e.g. torch CUDA tensors).
struct ForwardArgs {
  const int32_t* input_ids = nullptr;       // [B, S]; [T] packed inputs
  const int32_t* attention_mask = nullptr;  // [B, S] 1/0; null for packed inputs
  const int32_t* token_type_ids = nullptr;  // [B, S]; [T] packed inputs; null on the device: 0s
  int batch = 0;
  int seq = 0;  // S; packed inputs: the longest sequence (the Encoder sets it)
  // Inputs that come packed, as Encoder.forward_packed takes them: [B + 1] offsets in host memory,
  // sequence b being inputs cu_seqlens[b]..cu_seqlens[b + 1]-1 (T = cu_seqlens[B] of them). Such
  // a forward runs packed and leaves its outputs packed; no padded batch is built.
  const int32_t* cu_seqlens = nullptr;
  bool inputs_on_device = false;
  // Device inputs: the bytes of each value of input_ids, attention_mask and token_type_ids (4:
  // int32, 8: int64, 1: uint8 / bool; the pointers then point at such values). They are staged
  // as int32 and checked on the device (Backend::stage_inputs); the first bad value is recorded
  // in `bad_input` (a device address; the Encoder sets it) for the host to read without waiting.
  int ids_bytes = 4, mask_bytes = 4, types_bytes = 4;
  BadInputValue* bad_input = nullptr;
  void* last_hidden_state = nullptr;        // [B, S, H] in the compute dtype
  void* pooler_output = nullptr;            // [B, H] in the compute dtype, or null
  void* logits = nullptr;                   // [B, N] / [B, S, N] (the head's), or null
  bool outputs_on_device = false;
  // The caller's stream (Backend::set_stream): the inputs are read and the outputs written in
  // its order. Unset: the session's own stream, and the call returns once outputs are written.
  std::optional<uintptr_t> stream;
  // Device outputs: wait for the forward to finish, so that ForwardResult::nonfinite is known.
  bool wait_for_finite_check = false;
  // Padding-free (sequences.h): only the attended tokens are computed; the outputs are the same
  // at every attended position and zeros at padding. The Encoder decides it.
  bool packed = false;
  // The caller's: run padded whatever padding_free and batch_invariant say, so that every
  // position's row is computed, a masked one's too (it attends to the attended keys, as
  // transformers computes it); a packed forward has no rows for masked positions. Not with inputs
  // or outputs that come packed. Batch invariance keeps its kernels (Encoder::forward).
  bool padded = false;
  // The attended tokens, when the caller knows them (host inputs: counted from the mask; packed
  // callers: their length; device inputs: counted by the caller); -1: counted on the device and
  // read back once, which waits for the inputs to be ready.
  int64_t tokens = -1;
  // Outputs left packed: last_hidden_state [T, H], token logits [T, N] (needs packed and tokens).
  bool packed_outputs = false;
  // Device inputs, not packed: count the attended tokens on the device (one small read back) and
  // pack where packing pays (packing_pays) and changes no first-token output asked for.
  bool pack_if_it_pays = false;
  // Packed device inputs not counted (tokens < 0): the per-token ops run over all B·S rows (a
  // bounded layout, rows past T zeros) instead of reading T back, so the host never waits for the
  // inputs. For batch-invariant forwards of small batches, whose GEMMs give a row the same bits at
  // any row count.
  bool packed_over_all_rows = false;
};

// What a forward reports besides its outputs.
struct ForwardResult {
  // last_hidden_state holds a NaN or Inf. Known when the outputs are on the host or
  // ForwardArgs::wait_for_finite_check is set; false otherwise.
  bool nonfinite = false;
  // A NaN or Inf not reported before, from an earlier forward of the session that the device has
  // finished by now (read without waiting; with device outputs it may be this forward's).
  bool earlier_nonfinite = false;
};

class Session {
 public:
  // Work is enqueued on `backend`, which must outlive the session; `owned`, when given, is that
  // backend and dies with the session.
  Session(const Model& model, Backend* backend, std::unique_ptr<Backend> owned = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs one forward of checked inputs. Host outputs are written when it returns; device
  // outputs are enqueued on the caller's stream. Not reentrant: the caller holds the session.
  ForwardResult forward(const ForwardArgs& args, AttentionKind attention, bool graphs);

  // Grows the workspace to what a forward of `batch` sequences of up to `seq` positions over
  // `rows` rows under `attention` takes, running nothing (a server readies its largest batches
  // before its first request). Not reentrant, as forward.
  void reserve(int batch, int seq, int64_t rows, AttentionKind attention);

  Backend& backend() { return *backend_; }
  // Bytes of activation workspace held (grows to the largest batch x seq seen, then stays).
  size_t workspace_bytes() const;
  size_t recorded_shapes() const { return recordings_.size(); }
  // Forwards that could replay a recording (graphs on, a backend that records), by what they did:
  // replayed a held recording, recorded a new one (a shape's second forward), or ran op by op.
  // Owned by whoever reads them (the Encoder, over all its sessions); read without a lock.
  struct GraphCounts {
    std::atomic<uint64_t> replayed{0}, recorded{0}, op_by_op{0};
  };
  // Adds this session's forwards to `counts` (which must outlive the session); null: none.
  void count_graphs_into(GraphCounts* counts) { graph_counts_ = counts; }
  // Waits for queued work, then frees the recordings (and forgets the shapes seen once).
  void drop_recordings();

  static constexpr size_t kMaxRecordings = 128;

 private:
  // What a recording is specific to, besides the buffers.
  struct ShapeKey {
    int batch, seq;
    int rows;  // B·S padded; the token-count bucket packed (inputs that come packed: B, S and
               // T as recorded_packed_shape rounds them)
    bool packed;
    bool ids_packed;  // the inputs came packed (SequenceLayout::ids_packed)
    AttentionKind attention;
    Model::Outputs outputs;
    bool operator<(const ShapeKey& o) const {
      return std::tie(batch, seq, rows, packed, ids_packed, attention, outputs) <
             std::tie(o.batch, o.seq, o.rows, o.packed, o.ids_packed, o.attention, o.outputs);
    }
  };
  struct Recording {
    std::unique_ptr<RecordedOps> ops;
    uint64_t last_use = 0;
  };
  // The recording for `key`: the held one, or a new one of `enqueue` on the key's second
  // forward; null when the forward should run op by op. `redirectable`: the one address
  // Backend::record may redirect, or null.
  const RecordedOps* recording_for(const ShapeKey& key, const std::function<void()>& enqueue,
                                   const void* redirectable);
  void count(std::atomic<uint64_t> GraphCounts::* what);
  // Grows the workspace to `batch` sequences of up to `seq` positions whose per-token buffers hold
  // `rows` rows (B * S, or fewer for inputs that come packed).
  void ensure_workspace(int batch, int seq, int64_t rows, size_t attention_bytes);
  // Puts the inputs into ids_ / mask_ / types_, where the ops (and recordings) read them: host
  // inputs copied, device inputs staged as int32 and checked (Backend::stage_inputs).
  void stage_inputs(const ForwardArgs& args);
  // Packs the inputs' sequences into cu_seqlens_ / token_index_ (on the host for host inputs, on
  // the device otherwise) and returns T, reading it back from the device when not given. Inputs
  // that came packed are indexed from their offsets on the host, and get the padded mask the
  // unfused attention reads when `unfused`.
  int64_t pack(const ForwardArgs& args, bool unfused);
  // Copies the outputs to the caller, scattering packed rows back to the padded layout unless the
  // caller asked for them packed; the hidden states not when they went to the caller's tensor.
  void copy_outputs(const ForwardArgs& args, const SequenceLayout& layout, int64_t tokens,
                    Model::Outputs outputs, bool hidden_delivered);
  Activations activations() const;
  // Reads and clears the non-finite flag.
  bool take_nonfinite();

  const Model& model_;
  std::unique_ptr<Backend> owned_backend_;
  Backend* backend_;

  bool backend_records_ = true;  // false once the backend declined to record
  std::map<ShapeKey, Recording> recordings_;
  std::set<ShapeKey> seen_once_;  // shapes run once, op by op
  uint64_t forwards_ = 0;         // the clock of Recording::last_use
  GraphCounts* graph_counts_ = nullptr;
  uint64_t picks_generation_ = 0;  // Backend::begin_forward's when the recordings were made

  // Set by the last LayerNorm when the output holds a NaN or Inf; host memory the device writes.
  int32_t* nonfinite_host_ = nullptr;
  int32_t* nonfinite_device_ = nullptr;  // the same word, as ops address it
  bool unfinished_ = false;  // forwards may still run on the device (device outputs, no wait)

  // Workspace, sized for the largest B * S positions, rows and B seen (attention scratch: the
  // largest it needed). Rows are B * S, except for inputs that come packed: the bucket of their T,
  // so that one long sequence among short ones does not size every row buffer at B x the longest.
  int64_t capacity_positions_ = 0;
  int64_t capacity_rows_ = 0;
  int capacity_batch_ = 0;
  DeviceBuffer ids_, mask_, types_;   // [B, S] int32
  DeviceBuffer cu_seqlens_;           // [B + 2] int32, packed forwards (+ pack's first_unattended)
  int32_t tally_[2] = {0, 0};         // T and first_unattended, read back by pack()
  DeviceBuffer token_index_;          // [B, S] int32, packed forwards
  DeviceBuffer first_tokens_;         // [B, H], the first tokens gathered for a pooler or head
  std::vector<int32_t> host_cu_seqlens_, host_token_index_;  // host inputs' packing
  std::vector<int32_t> host_mask_;  // packed inputs' padded mask, for the unfused attention
  std::vector<int32_t> widened_cu_seqlens_;  // packed inputs' offsets at their recorded shape
  DeviceBuffer hidden_, hidden2_;     // [rows, H]
  DeviceBuffer embedded_;             // [rows, E], only with a projection
  DeviceBuffer qkv_;                  // [rows, 3H]
  DeviceBuffer ctx_;                  // [rows, H]
  DeviceBuffer inter_;                // [rows, I], or [rows, 3I] with a gated MLP (model.h)
  DeviceBuffer pooled_;               // [B, H]
  DeviceBuffer head_hidden_;          // [B, H], only for a sequence head with its own dense
  DeviceBuffer logits_;               // [B, N] or [rows, N], only with a head
  DeviceBuffer attention_scratch_;    // run_attention's workspace (unfused: q, k, v, scores)
  DeviceBuffer dense_workspace_;      // dense_residual_layernorm's (the backend's ask; may be empty)
  DeviceBuffer gemm_codes_;           // [rows, H] as the weight GEMMs read them (may be empty)
  // Recordings write the final hidden states here, an address no op reads or writes: each replay
  // redirects it to the forward's own destination (the caller's device tensor, or hidden_).
  DeviceBuffer recorded_output_;
  std::vector<Redirect> redirects_;  // a replay's, reused
};

}  // namespace ftbert
