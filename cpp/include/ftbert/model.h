// A model: an encoder architecture's math over the Backend ops, with its weights. Each
// architecture is one unit, cpp/core/models/<architecture>.cpp, which ModelConfig::architecture
// names (the family tables in weights_tools/families.py say which one each family runs), made by
// create_model. A Model holds the weights and nothing that changes per call; it is read-only after
// construction, so any number of sessions (cpp/core/session.h) run it at once on their own
// buffers. Buffers, recordings, locks and streams are the session's business.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

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
  void* inter = nullptr;              // [M, I], or [M, 2I] with a gated MLP
  void* gated = nullptr;              // [M, I]  a gated MLP's activation (else null)
  void* first_tokens = nullptr;       // [B, H]  the first tokens, gathered (packed, or `output`)
  void* pooled = nullptr;             // [B, H]
  void* head_hidden = nullptr;        // [B, H]  a sequence head's own dense (else null)
  void* logits = nullptr;             // [B, N] or [M, N] (else null)
  void* attention_scratch = nullptr;  // attention_workspace_bytes(...)
  void* dense_workspace = nullptr;    // dense_workspace_bytes bytes for dense_residual_layernorm
  size_t dense_workspace_bytes = 0;   //   (at least the backend's ask for M rows, or 0)
  // Backend::gemm_input_codes_bytes(M, H) bytes (null where that is 0): a LayerNorm output's rows
  // as the weight GEMM after it reads them, written by the LayerNorm (blocks.h says which).
  void* gemm_codes = nullptr;
  int32_t* nonfinite = nullptr;       // set to 1 when the output holds a NaN or Inf; may be null
  // [M, H] where the last layer writes the final hidden states (null: `hidden`). After the last
  // layer it is read only through Backend::first_tokens, never as a GEMM operand, so that a
  // recording may redirect it to each caller's tensor (Device::record); the per-token head,
  // whose GEMM reads every row, takes no output here.
  void* output = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

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
  virtual void forward(Backend& be, const Activations& act,
                       const int32_t* ids,    // [B, S]
                       const int32_t* types,  // [B, S]
                       const SequenceLayout& layout, AttentionKind attention,
                       Outputs outputs) const = 0;

  // Bytes of backend memory the weights take: the uploaded tensors, in the layout each is kept in
  // (e4m3 or int8 panels where quantized), and what the architecture derives from them at load.
  virtual size_t weight_bytes() const = 0;

  // Bytes of Activations::attention_scratch a forward of B sequences up to `seq` long over `rows`
  // rows needs: run_attention's own, and whatever the architecture computes beside it.
  virtual size_t attention_scratch_bytes(AttentionKind kind, int batch, int seq,
                                         int64_t rows) const;

  // Whether the fused attention computes DeBERTa's disentangled terms itself
  // (Backend::flash_computes_terms), with no term tables and none of their products; false for
  // models without such terms.
  virtual bool terms_in_attention() const { return false; }

 protected:
  // Checks the config and that `backend` computes in `compute`.
  Model(const ModelConfig& config, const Backend& backend, DType compute);

  ModelConfig config_;
  DType dtype_;
};

// The model of config.architecture: its weights checked (every tensor the config implies, with
// its exact shape) and uploaded through `backend` (which must outlive the model) in `compute`.
std::unique_ptr<Model> create_model(const ModelConfig& config, const HostWeights& weights,
                                    Backend* backend, DType compute);
// The architectures create_model knows, by the names ModelConfig::architecture takes.
std::vector<std::string> model_architectures();

}  // namespace ftbert
