// The BERT encoder's math, written once over the Backend ops:
//   embeddings+LN -> L x [QKV GEMM -> attention -> out GEMM -> bias+residual+LN
//                         -> FFN GEMM -> bias+act -> FFN GEMM -> bias+residual+LN]
//   -> pooler -> task head (sequence: token 0's dense + act, or the pooler; token: every token)
// A Model holds the weights and nothing that changes per call; it is read-only after
// construction, so any number of sessions (cpp/core/session.h) run it at once on their own
// buffers. Buffers, recordings, locks and streams are the session's business.
#pragma once

#include <cstdint>
#include <tuple>

#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/sequences.h"
#include "ftbert/weights.h"

namespace ftbert {

// The activation buffers of one forward, in the compute dtype unless noted; sized by the caller
// for at least the layout's rows (M: B·S padded, T packed) and B sequences.
struct Activations {
  void* hidden = nullptr;             // [M, H]  input of a layer and its output
  void* embedded = nullptr;           // [M, E]  the embeddings before a projection (else null)
  void* hidden2 = nullptr;            // [M, H]  after attention
  void* qkv = nullptr;                // [M, 3H]
  void* ctx = nullptr;                // [M, H]
  void* inter = nullptr;              // [M, I]
  void* first_tokens = nullptr;       // [B, H]  the first tokens, gathered (packed, or `output`)
  void* pooled = nullptr;             // [B, H]
  void* head_hidden = nullptr;        // [B, H]  a sequence head's own dense (else null)
  void* logits = nullptr;             // [B, N] or [M, N] (else null)
  void* attention_scratch = nullptr;  // attention_workspace_bytes(...)
  void* dense_workspace = nullptr;    // dense_workspace_bytes bytes for dense_residual_layernorm
  size_t dense_workspace_bytes = 0;   //   (at least the backend's ask for M rows, or 0)
  int32_t* nonfinite = nullptr;       // set to 1 when the output holds a NaN or Inf; may be null
  // [M, H] where the last layer writes the final hidden states (null: `hidden`). After the last
  // layer it is read only through Backend::first_tokens, never as a GEMM operand, so that a
  // recording may redirect it to each caller's tensor (Backend::record); the per-token head,
  // whose GEMM reads every row, takes no output here.
  void* output = nullptr;
};

class Model {
 public:
  // Checks the config and every weight, and uploads the weights through `backend` (which must
  // outlive the model) in the `compute` dtype.
  Model(const ModelConfig& config, const HostWeights& weights, Backend* backend, DType compute);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

  // What a forward computes besides act.hidden.
  struct Outputs {
    bool pooled = false;  // act.pooled
    bool logits = false;  // act.logits (a model with a head)
    bool operator<(const Outputs& o) const {
      return std::tie(pooled, logits) < std::tie(o.pooled, o.logits);
    }
  };

  // Enqueues embeddings, layers, and the pooler and head as `outputs` asks, on `be`, from device
  // ids and token types into act.output or act.hidden (and act.pooled, act.logits), one row per
  // layout row.
  void forward(Backend& be, const Activations& act,
               const int32_t* ids,    // [B, S]
               const int32_t* types,  // [B, S]
               const SequenceLayout& layout, AttentionKind attention, Outputs outputs) const;

 private:
  // One post-LN layer: reads its input in act.hidden and writes its output to `out`.
  // `nonfinite`: given to the layer's last LayerNorm (the last layer's is the model's output).
  void layer(Backend& be, const Activations& act, const LayerWeights& w,
             const SequenceLayout& layout, AttentionKind attention, void* out,
             int32_t* nonfinite) const;
  // The task head: the final hidden states `hidden` (and act.pooled for a head on the pooler)
  // -> act.logits.
  void head(Backend& be, const Activations& act, const void* hidden,
            const SequenceLayout& layout) const;

  ModelConfig config_;
  DType dtype_;
  ModelWeights weights_;
};

}  // namespace ftbert
