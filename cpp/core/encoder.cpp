// The BERT encoder, written once over the Backend ops. No backend-specific code lives here.
#include "ftbert/encoder.h"

#include <algorithm>
#include <utility>

#include "ftbert/check.h"

namespace ftbert {

Encoder::Encoder(const ModelConfig& config, const HostWeights& weights, const std::string& device,
                 DType compute)
    : config_(config), dtype_(compute) {
  config_.validate();
  backend_ = create_backend(device);
  FTBERT_CHECK(backend_->supports_dtype(compute),
               "the " << backend_->name() << " backend does not compute in " << dtype_name(compute)
                      << (backend_->name() == "cpu" ? " (the CPU backend is float32 only)" : ""));
  weights_ = upload_weights(backend_.get(), config_, weights, compute);
}

Encoder::~Encoder() {
  // Work may still be queued on the stream that reads the buffers freed below.
  try {
    backend_->synchronize();
  } catch (...) {
  }
}

void Encoder::set_attention(AttentionMode mode) {
  // Forcing flash where it cannot run fails now, not at the next forward.
  select_attention(mode, *backend_, dtype_, config_.head_dim(), 1, 1);
  attention_mode_ = mode;
}

AttentionKind Encoder::attention_for(int batch, int seq) const {
  return select_attention(attention_mode_, *backend_, dtype_, config_.head_dim(), batch, seq);
}

void Encoder::set_graphs(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  graphs_ = on;
  if (!on) {
    backend_->synchronize();  // a replay may still be running
    drop_recordings();
    seen_once_.clear();
  }
}

size_t Encoder::recorded_shapes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recordings_.size();
}

void Encoder::set_allow_tf32(bool allow) {
  std::lock_guard<std::mutex> lock(mutex_);
  backend_->synchronize();
  drop_recordings();
  backend_->set_allow_tf32(allow);
}

void Encoder::drop_recordings() { recordings_.clear(); }

const RecordedOps* Encoder::recording_for(const ShapeKey& key,
                                          const std::function<void()>& enqueue) {
  if (!graphs_ || !backend_records_) return nullptr;
  ++forwards_;
  if (auto it = recordings_.find(key); it != recordings_.end()) {
    it->second.last_use = forwards_;
    return it->second.ops.get();
  }
  // A shape seen once may never come back (e.g. sorted text batches): record from the second
  // time on. The first run, op by op, also does one-time setup (kernel attributes, cuBLAS
  // heuristics) outside any recording.
  if (seen_once_.insert(key).second) {
    if (seen_once_.size() > 64 * kMaxRecordings) seen_once_ = {key};
    return nullptr;
  }
  std::unique_ptr<RecordedOps> ops;
  try {
    ops = backend_->record(enqueue);
  } catch (const Error& e) {
    FTBERT_FAIL("recording the forward for replay (CUDA graph) failed: "
                << e.what() << "; cuda_graphs=False runs the forward op by op");
  }
  if (!ops) {
    backend_records_ = false;
    return nullptr;
  }
  if (recordings_.size() >= kMaxRecordings) {
    auto lru = std::min_element(recordings_.begin(), recordings_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    recordings_.erase(lru);
  }
  Recording& r = recordings_[key];
  r.ops = std::move(ops);
  r.last_use = forwards_;
  return r.ops.get();
}

size_t Encoder::workspace_bytes() const {
  return ids_.bytes() + mask_.bytes() + types_.bytes() + hidden_.bytes() + hidden2_.bytes() +
         qkv_.bytes() + ctx_.bytes() + inter_.bytes() + pooled_.bytes() +
         attention_scratch_.bytes();
}

void Encoder::ensure_workspace(int batch, int seq) {
  const int64_t tokens = static_cast<int64_t>(batch) * seq;
  const size_t es = dtype_size(dtype_);
  const size_t H = config_.hidden_size, I = config_.intermediate_size;
  Backend* b = backend_.get();
  if (batch > capacity_batch_) {  // the pooler's rows: more sequences of fewer tokens
    backend_->synchronize();
    drop_recordings();  // they hold the old buffers
    pooled_ = DeviceBuffer(b, static_cast<size_t>(batch) * H * es);
    capacity_batch_ = batch;
  }
  if (tokens <= capacity_tokens_) return;
  // Queued work may still use the old buffers.
  backend_->synchronize();
  drop_recordings();
  ids_ = DeviceBuffer(b, tokens * sizeof(int32_t));
  mask_ = DeviceBuffer(b, tokens * sizeof(int32_t));
  types_ = DeviceBuffer(b, tokens * sizeof(int32_t));
  hidden_ = DeviceBuffer(b, tokens * H * es);
  hidden2_ = DeviceBuffer(b, tokens * H * es);
  qkv_ = DeviceBuffer(b, tokens * 3 * H * es);
  ctx_ = DeviceBuffer(b, tokens * H * es);
  inter_ = DeviceBuffer(b, tokens * I * es);
  capacity_tokens_ = tokens;
}

void Encoder::ensure_attention_scratch(size_t bytes) {
  if (bytes <= attention_scratch_.bytes()) return;
  backend_->synchronize();
  drop_recordings();
  attention_scratch_ = DeviceBuffer(backend_.get(), bytes);
}

void Encoder::validate_host_inputs(const ForwardArgs& a) const {
  const int64_t n = static_cast<int64_t>(a.batch) * a.seq;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = a.input_ids[i];
    FTBERT_CHECK_INPUT(id >= 0 && id < config_.vocab_size,
                 "input_ids[" << i / a.seq << ", " << i % a.seq << "] = " << id
                              << " is out of range for vocab_size " << config_.vocab_size);
    const int32_t tt = a.token_type_ids[i];
    FTBERT_CHECK_INPUT(tt >= 0 && tt < config_.type_vocab_size,
                 "token_type_ids[" << i / a.seq << ", " << i % a.seq << "] = " << tt
                                   << " is out of range for type_vocab_size "
                                   << config_.type_vocab_size);
    const int32_t m = a.attention_mask[i];
    FTBERT_CHECK_INPUT(m == 0 || m == 1, "attention_mask[" << i / a.seq << ", " << i % a.seq << "] = "
                                                     << m << "; expected 0 or 1");
  }
}

void Encoder::forward(const ForwardArgs& a) {
  std::lock_guard<std::mutex> lock(mutex_);  // one forward at a time: the workspace is shared
  if (a.stream) backend_->set_stream(*a.stream);
  FTBERT_CHECK_INPUT(a.batch > 0, "empty batch: batch size must be at least 1");
  FTBERT_CHECK_INPUT(a.seq > 0, "empty sequences: sequence length must be at least 1");
  FTBERT_CHECK_INPUT(a.seq <= config_.max_position_embeddings,
               "sequence length " << a.seq << " exceeds max_position_embeddings "
                                  << config_.max_position_embeddings);
  FTBERT_CHECK_INPUT(a.input_ids && a.attention_mask && a.token_type_ids && a.last_hidden_state,
               "forward: input_ids, attention_mask, token_type_ids and the output are required");
  const int B = a.batch, S = a.seq, H = config_.hidden_size;
  const int64_t M = static_cast<int64_t>(B) * S;

  const AttentionKind attention = attention_for(B, S);
  ensure_workspace(B, S);
  ensure_attention_scratch(attention_workspace_bytes(attention, dtype_, B, S, config_.num_heads,
                                                     config_.head_dim()));
  const bool pool = config_.has_pooler && a.pooler_output != nullptr;
  if (!a.inputs_on_device) validate_host_inputs(a);

  // A recording reads the inputs from the encoder's buffers; op by op, device inputs are read
  // where they are.
  int32_t *own_ids = ids_.as<int32_t>(), *own_mask = mask_.as<int32_t>(),
          *own_types = types_.as<int32_t>();
  const RecordedOps* recording =
      recording_for({B, S, attention, pool},
                    [&] { run_model(own_ids, own_mask, own_types, B, S, attention, pool); });
  const int32_t *ids = a.input_ids, *mask = a.attention_mask, *types = a.token_type_ids;
  if (!a.inputs_on_device || recording != nullptr) {
    const size_t bytes = M * sizeof(int32_t);
    if (a.inputs_on_device) {
      backend_->copy_on_device(own_ids, ids, bytes);
      backend_->copy_on_device(own_mask, mask, bytes);
      backend_->copy_on_device(own_types, types, bytes);
    } else {
      backend_->copy_to_device(own_ids, ids, bytes);
      backend_->copy_to_device(own_mask, mask, bytes);
      backend_->copy_to_device(own_types, types, bytes);
    }
    ids = own_ids;
    mask = own_mask;
    types = own_types;
  }
  if (recording != nullptr) {
    backend_->replay(*recording);
  } else {
    run_model(ids, mask, types, B, S, attention, pool);
  }

  const size_t es = dtype_size(dtype_);
  if (a.outputs_on_device) {
    backend_->copy_on_device(a.last_hidden_state, hidden_.data(), M * H * es);
    if (pool) backend_->copy_on_device(a.pooler_output, pooled_.data(), B * H * es);
  } else {
    backend_->copy_to_host(a.last_hidden_state, hidden_.data(), M * H * es);
    if (pool) backend_->copy_to_host(a.pooler_output, pooled_.data(), B * H * es);
    backend_->synchronize();
  }
}

void Encoder::run_model(const int32_t* ids, const int32_t* mask, const int32_t* types, int B,
                        int S, AttentionKind attention, bool pool) {
  const ModelWeights& w = weights_;
  const int H = config_.hidden_size;
  backend_->embed_layernorm(dtype_, ids, types, w.word_embeddings.data(),
                            w.position_embeddings.data(), w.token_type_embeddings.data(),
                            w.emb_ln_gamma.data(), w.emb_ln_beta.data(), hidden_.data(), B, S, H,
                            config_.vocab_size, config_.type_vocab_size, config_.layer_norm_eps);
  for (const LayerWeights& layer : w.layers) run_layer(layer, mask, B, S, attention);
  if (pool) {
    backend_->pooler(dtype_, hidden_.data(), w.pooler_weight.data(), w.pooler_bias.data(),
                     pooled_.data(), B, S, H);
  }
}

// One post-LN BERT layer; reads and leaves the layer's input/output in hidden_.
void Encoder::run_layer(const LayerWeights& w, const int32_t* mask, int B, int S,
                        AttentionKind attention) {
  Backend& be = *backend_;
  const DType dt = dtype_;
  const int M = B * S, H = config_.hidden_size, I = config_.intermediate_size;
  const float eps = config_.layer_norm_eps;

  // qkv [M, 3H] = hidden [M, H] · Wqkv [H, 3H]   (bias added inside attention)
  be.gemm(dt, false, false, M, 3 * H, H, hidden_.data(), H, w.qkv_weight.data(), 3 * H,
          qkv_.data(), 3 * H);
  run_attention(be, attention, dt, qkv_.data(), w.qkv_bias.data(), mask, ctx_.data(),
                attention_scratch_.data(), B, S, config_.num_heads, config_.head_dim());
  // hidden2 = LN(ctx · Wo + bo + hidden)
  be.gemm(dt, false, false, M, H, H, ctx_.data(), H, w.attn_out_weight.data(), H, hidden2_.data(),
          H);
  be.add_bias_residual_layernorm(dt, hidden2_.data(), hidden_.data(), w.attn_out_bias.data(),
                                 w.attn_ln_gamma.data(), w.attn_ln_beta.data(), M, H, eps);
  // inter = act(hidden2 · W1 + b1)
  be.gemm(dt, false, false, M, I, H, hidden2_.data(), H, w.ffn_in_weight.data(), I, inter_.data(),
          I);
  be.add_bias_activation(dt, inter_.data(), w.ffn_in_bias.data(), M, I, config_.activation);
  // hidden = LN(inter · W2 + b2 + hidden2)
  be.gemm(dt, false, false, M, H, I, inter_.data(), I, w.ffn_out_weight.data(), H, hidden_.data(),
          H);
  be.add_bias_residual_layernorm(dt, hidden_.data(), hidden2_.data(), w.ffn_out_bias.data(),
                                 w.ffn_ln_gamma.data(), w.ffn_ln_beta.data(), M, H, eps);
}

}  // namespace ftbert
