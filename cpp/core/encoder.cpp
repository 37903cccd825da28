// The Encoder: checks a forward's inputs, picks the attention kernel, and runs the forward in its
// session. No backend-specific code lives here.
#include "ftbert/encoder.h"

#include "ftbert/check.h"

namespace ftbert {

Encoder::Encoder(const ModelConfig& config, const HostWeights& weights, const std::string& device,
                 DType compute) {
  backend_ = create_backend(device);
  model_ = std::make_unique<Model>(config, weights, backend_.get(), compute);
  session_ = std::make_unique<Session>(*model_, backend_.get());
}

Encoder::~Encoder() = default;

void Encoder::set_attention(AttentionMode mode) {
  // Forcing flash where it cannot run fails now, not at the next forward.
  select_attention(mode, *backend_, dtype(), config().head_dim(), 1, 1);
  attention_mode_ = mode;
}

AttentionKind Encoder::attention_for(int batch, int seq) const {
  return select_attention(attention_mode_, *backend_, dtype(), config().head_dim(), batch, seq);
}

void Encoder::set_graphs(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  graphs_ = on;
  if (!on) session_->drop_recordings();
}

size_t Encoder::recorded_shapes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return session_->recorded_shapes();
}

size_t Encoder::workspace_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return session_->workspace_bytes();
}

void Encoder::set_allow_tf32(bool allow) {
  std::lock_guard<std::mutex> lock(mutex_);
  session_->drop_recordings();
  session_->backend().set_allow_tf32(allow);
}

void Encoder::validate(const ForwardArgs& a) const {
  FTBERT_CHECK_INPUT(a.batch > 0, "empty batch: batch size must be at least 1");
  FTBERT_CHECK_INPUT(a.seq > 0, "empty sequences: sequence length must be at least 1");
  FTBERT_CHECK_INPUT(a.seq <= config().max_position_embeddings,
                     "sequence length " << a.seq << " exceeds max_position_embeddings "
                                        << config().max_position_embeddings);
  FTBERT_CHECK_INPUT(
      a.input_ids && a.attention_mask && a.token_type_ids && a.last_hidden_state,
      "forward: input_ids, attention_mask, token_type_ids and the output are required");
  if (!a.inputs_on_device) validate_host_inputs(a);
}

void Encoder::validate_host_inputs(const ForwardArgs& a) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(a.batch) * a.seq;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = a.input_ids[i];
    FTBERT_CHECK_INPUT(id >= 0 && id < c.vocab_size,
                       "input_ids[" << i / a.seq << ", " << i % a.seq << "] = " << id
                                    << " is out of range for vocab_size " << c.vocab_size);
    const int32_t tt = a.token_type_ids[i];
    FTBERT_CHECK_INPUT(tt >= 0 && tt < c.type_vocab_size,
                       "token_type_ids[" << i / a.seq << ", " << i % a.seq << "] = " << tt
                                         << " is out of range for type_vocab_size "
                                         << c.type_vocab_size);
    const int32_t m = a.attention_mask[i];
    FTBERT_CHECK_INPUT(m == 0 || m == 1, "attention_mask[" << i / a.seq << ", " << i % a.seq
                                                           << "] = " << m
                                                           << "; expected 0 or 1");
  }
}

void Encoder::forward(const ForwardArgs& a) {
  validate(a);
  const AttentionKind attention = attention_for(a.batch, a.seq);
  std::lock_guard<std::mutex> lock(mutex_);
  session_->forward(a, attention, graphs_);
}

}  // namespace ftbert
