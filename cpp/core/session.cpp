// The run-time side of a forward: workspace growth, recordings of repeated shapes, input staging
// and output copies, on the session's backend. The math is Model::forward.
#include "ftbert/session.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "ftbert/attention.h"
#include "ftbert/check.h"

namespace ftbert {

Session::Session(const Model& model, Backend* backend, std::unique_ptr<Backend> owned)
    : model_(model), owned_backend_(std::move(owned)), backend_(backend) {
  nonfinite_host_ = backend_->allocate_host_flag();
  try {
    nonfinite_device_ = backend_->host_flag_device_address(nonfinite_host_);
  } catch (...) {
    backend_->free_host_flag(nonfinite_host_);
    throw;
  }
}

Session::~Session() {
  // Work may still be queued on the stream that reads the buffers freed below.
  try {
    backend_->synchronize();
  } catch (...) {
  }
  backend_->free_host_flag(nonfinite_host_);
}

bool Session::take_nonfinite() {
  // Atomic: the device may set the word while the host clears it; a set that lands later stays.
  return __atomic_exchange_n(nonfinite_host_, 0, __ATOMIC_ACQ_REL) != 0;
}

size_t Session::workspace_bytes() const {
  return ids_.bytes() + mask_.bytes() + types_.bytes() + cu_seqlens_.bytes() +
         token_index_.bytes() + first_tokens_.bytes() + hidden_.bytes() + hidden2_.bytes() +
         embedded_.bytes() + recorded_output_.bytes() +
         qkv_.bytes() + ctx_.bytes() + inter_.bytes() + pooled_.bytes() + head_hidden_.bytes() +
         logits_.bytes() + attention_scratch_.bytes() + dense_workspace_.bytes() +
         gemm_codes_.bytes();
}

void Session::drop_recordings() {
  backend_->synchronize();  // a replay may still be running
  recordings_.clear();
  seen_once_.clear();
}

Activations Session::activations() const {
  Activations a;
  a.hidden = hidden_.data();
  a.hidden2 = hidden2_.data();
  a.embedded = embedded_.data();
  a.qkv = qkv_.data();
  a.ctx = ctx_.data();
  a.inter = inter_.data();
  if (model_.config().gated_mlp) {
    a.gated = static_cast<char*>(inter_.data()) +
              static_cast<size_t>(capacity_rows_) * 2 * model_.config().intermediate_size *
                  dtype_size(model_.dtype());
  }
  a.first_tokens = first_tokens_.data();
  a.pooled = pooled_.data();
  a.head_hidden = head_hidden_.data();
  a.logits = logits_.data();
  a.attention_scratch = attention_scratch_.data();
  a.dense_workspace = dense_workspace_.data();
  a.dense_workspace_bytes = dense_workspace_.bytes();
  a.gemm_codes = gemm_codes_.data();
  a.nonfinite = nonfinite_device_;
  return a;
}

void Session::count(std::atomic<uint64_t> GraphCounts::* what) {
  if (graph_counts_ != nullptr) (graph_counts_->*what).fetch_add(1, std::memory_order_relaxed);
}

const RecordedOps* Session::recording_for(const ShapeKey& key,
                                          const std::function<void()>& enqueue,
                                          const void* redirectable) {
  if (!backend_records_ || !backend_->records()) return nullptr;
  ++forwards_;
  if (auto it = recordings_.find(key); it != recordings_.end()) {
    it->second.last_use = forwards_;
    count(&GraphCounts::replayed);
    return it->second.ops.get();
  }
  // A shape seen once may never come back (e.g. sorted text batches): record from the second
  // time on. The first run, op by op, also does one-time setup (kernel attributes, cuBLAS
  // heuristics) outside any recording.
  if (seen_once_.insert(key).second) {
    if (seen_once_.size() > 64 * kMaxRecordings) seen_once_ = {key};
    count(&GraphCounts::op_by_op);
    return nullptr;
  }
  std::unique_ptr<RecordedOps> ops;
  try {
    std::vector<const void*> addresses;
    if (redirectable != nullptr) addresses.push_back(redirectable);
    ops = backend_->record(enqueue, addresses);
  } catch (const Error& e) {
    FTBERT_FAIL("recording the forward for replay (CUDA graph) failed: "
                << e.what() << "; cuda_graphs=False runs the forward op by op");
  }
  if (!ops) {
    backend_records_ = false;
    count(&GraphCounts::op_by_op);
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
  count(&GraphCounts::recorded);
  return r.ops.get();
}

void Session::ensure_workspace(int batch, int seq, int64_t rows, size_t attention_bytes) {
  const ModelConfig& c = model_.config();
  const int64_t positions = static_cast<int64_t>(batch) * seq;
  const size_t es = dtype_size(model_.dtype());
  const size_t H = c.hidden_size, I = c.intermediate_size, N = c.head.num_labels;
  const bool token_head = c.head.kind == HeadKind::kToken;
  Backend* b = backend_;
  // Growing frees buffers that queued work and the recordings still use: wait, then drop them.
  if (batch > capacity_batch_) {  // the pooler's rows: more sequences of fewer tokens
    drop_recordings();
    pooled_ = DeviceBuffer(b, static_cast<size_t>(batch) * H * es);
    first_tokens_ = DeviceBuffer(b, static_cast<size_t>(batch) * H * es);
    cu_seqlens_ = DeviceBuffer(b, (static_cast<size_t>(batch) + 2) * sizeof(int32_t));
    if (c.head.has_dense()) head_hidden_ = DeviceBuffer(b, static_cast<size_t>(batch) * H * es);
    if (c.head.kind == HeadKind::kSequence) logits_ = DeviceBuffer(b, static_cast<size_t>(batch) * N * es);
    capacity_batch_ = batch;
  }
  // The inputs and the packing index are per padded position.
  if (positions > capacity_positions_) {
    drop_recordings();
    ids_ = DeviceBuffer(b, positions * sizeof(int32_t));
    mask_ = DeviceBuffer(b, positions * sizeof(int32_t));
    types_ = DeviceBuffer(b, positions * sizeof(int32_t));
    token_index_ = DeviceBuffer(b, positions * sizeof(int32_t));
    capacity_positions_ = positions;
  }
  if (rows > capacity_rows_) {
    drop_recordings();
    hidden_ = DeviceBuffer(b, rows * H * es);
    hidden2_ = DeviceBuffer(b, rows * H * es);
    if (c.has_projection()) embedded_ = DeviceBuffer(b, rows * c.embedding_size * es);
    qkv_ = DeviceBuffer(b, rows * 3 * H * es);
    ctx_ = DeviceBuffer(b, rows * H * es);
    // A gated MLP: the FFN-in product [M, 2I], then its activation [M, I] after it.
    inter_ = DeviceBuffer(b, rows * (c.gated_mlp ? 3 * I : I) * es);
    if (token_head) logits_ = DeviceBuffer(b, rows * N * es);
    const size_t dense_bytes = b->dense_residual_layernorm_workspace_bytes(
        static_cast<int>(std::min<int64_t>(rows, INT32_MAX)), static_cast<int>(H));
    dense_workspace_ = dense_bytes > 0 ? DeviceBuffer(b, dense_bytes) : DeviceBuffer();
    const size_t codes_bytes = b->gemm_input_codes_bytes(rows, static_cast<int>(H));
    gemm_codes_ = codes_bytes > 0 ? DeviceBuffer(b, codes_bytes) : DeviceBuffer();
    capacity_rows_ = rows;
  }
  if (attention_bytes > attention_scratch_.bytes()) {
    drop_recordings();
    attention_scratch_ = DeviceBuffer(b, attention_bytes);
  }
}

void Session::reserve(int batch, int seq, int64_t rows, AttentionKind attention) {
  ensure_workspace(batch, seq, rows, model_.attention_scratch_bytes(attention, batch, seq, rows));
}

void Session::stage_inputs(const ForwardArgs& a) {
  const int64_t n = a.cu_seqlens != nullptr ? a.tokens : static_cast<int64_t>(a.batch) * a.seq;
  int32_t *ids = ids_.as<int32_t>(), *mask = mask_.as<int32_t>(), *types = types_.as<int32_t>();
  if (a.inputs_on_device) {
    const ModelConfig& c = model_.config();
    backend_->stage_inputs(a.input_ids, a.ids_bytes, a.attention_mask, a.mask_bytes,
                           a.token_type_ids, a.types_bytes, n, ids, mask, types, c.vocab_size,
                           c.type_vocab_size, a.bad_input);
    return;
  }
  const size_t bytes = n * sizeof(int32_t);
  backend_->copy_to_device(ids, a.input_ids, bytes);
  if (a.attention_mask != nullptr) backend_->copy_to_device(mask, a.attention_mask, bytes);
  backend_->copy_to_device(types, a.token_type_ids, bytes);
}

int64_t Session::pack(const ForwardArgs& a, bool unfused) {
  const int B = a.batch, S = a.seq;
  const int64_t padded = static_cast<int64_t>(B) * S;
  if (a.cu_seqlens != nullptr) {
    host_token_index_.resize(padded);
    if (unfused) host_mask_.resize(padded);
    const int64_t t = index_packed_host(a.cu_seqlens, B, S, host_token_index_.data(), padded,
                                        unfused ? host_mask_.data() : nullptr);
    backend_->copy_to_device(cu_seqlens_.data(), a.cu_seqlens, (B + 1) * sizeof(int32_t));
    backend_->copy_to_device(token_index_.data(), host_token_index_.data(), padded * sizeof(int32_t));
    if (unfused) backend_->copy_to_device(mask_.data(), host_mask_.data(), padded * sizeof(int32_t));
    return t;
  }
  if (!a.inputs_on_device) {
    host_cu_seqlens_.resize(B + 1);
    host_token_index_.resize(padded);
    const int64_t t = pack_sequences_host(a.attention_mask, B, S, host_cu_seqlens_.data(),
                                          host_token_index_.data(), padded);
    backend_->copy_to_device(cu_seqlens_.data(), host_cu_seqlens_.data(), (B + 1) * sizeof(int32_t));
    backend_->copy_to_device(token_index_.data(), host_token_index_.data(), padded * sizeof(int32_t));
    return t;
  }
  // cu_seqlens_ holds B + 2 words: the offsets, then whether a first position is padding.
  int32_t* const first_unattended = cu_seqlens_.as<int32_t>() + B + 1;
  backend_->pack_sequences(mask_.as<int32_t>(), B, S, cu_seqlens_.as<int32_t>(),
                           token_index_.as<int32_t>(), padded,
                           a.pack_if_it_pays ? first_unattended : nullptr);
  if (a.tokens >= 0 && !a.pack_if_it_pays) return a.tokens;
  if (a.packed_over_all_rows) return -1;  // T stays on the device
  // T decides the GEMMs' sizes, which the host sets: read it back once, with the flag (this waits
  // for the caller's stream up to the packing).
  backend_->copy_to_host(tally_, cu_seqlens_.as<int32_t>() + B, sizeof(tally_));
  backend_->synchronize();
  return tally_[0];
}

ForwardResult Session::forward(const ForwardArgs& in, AttentionKind attention, bool graphs) {
  const ModelConfig& c = model_.config();
  // Inputs that come packed run, where forwards may be recorded (graphs on or off, for the same
  // GEMM sizes and so the same bits either way), at their recorded shape: empty sequences after
  // the caller's, up to more positions, over T's bucket of rows. The fused attention skips what
  // is empty; the unfused one would compute B x S x S scores, so it keeps the exact shape. The
  // caller's outputs are `in`'s.
  ForwardArgs widened;
  int64_t widened_rows = -1;
  if (in.cu_seqlens != nullptr && attention != AttentionKind::kUnfused && backend_->records()) {
    const PackedShape shape = recorded_packed_shape(in.batch, in.seq, in.tokens, c.max_seq());
    widened = in;
    widened.batch = shape.batch;
    widened.seq = shape.seq;
    widened_cu_seqlens_.assign(in.cu_seqlens, in.cu_seqlens + in.batch + 1);
    widened_cu_seqlens_.resize(shape.batch + 1, in.cu_seqlens[in.batch]);
    widened.cu_seqlens = widened_cu_seqlens_.data();
    widened_rows = shape.rows;
  }
  const ForwardArgs& a = widened_rows >= 0 ? widened : in;
  const int B = a.batch, S = a.seq;
  if (a.stream) backend_->set_stream(*a.stream);
  // The backend's measured picks hold still until every forward enqueuing now is done; the
  // recordings made before they last changed run kernels no forward runs now.
  const uint64_t picks = backend_->begin_forward();
  struct ForwardEnds {
    Backend* backend;
    ~ForwardEnds() { backend->end_forward(); }
  } ends{backend_};
  if (picks != picks_generation_) {
    drop_recordings();
    picks_generation_ = picks;
  }
  ForwardResult result;
  // An exact check reads the flag once this forward is done; what earlier forwards set must be
  // taken out first, once they are done too.
  const bool exact = !a.outputs_on_device || a.wait_for_finite_check;
  if (exact) {
    if (unfinished_) backend_->synchronize();
    result.earlier_nonfinite = take_nonfinite();
  }

  // Inputs that come packed need rows for their T only (its bucket, as the layout below takes).
  const int64_t rows = widened_rows >= 0      ? widened_rows
                       : a.cu_seqlens != nullptr ? packed_rows_bucket(std::max<int64_t>(a.tokens, 1), B, S)
                                                 : static_cast<int64_t>(B) * S;
  ensure_workspace(B, S, rows, model_.attention_scratch_bytes(attention, B, S, rows));
  Model::Outputs outputs;
  outputs.pooled = c.has_pooler && a.pooler_output != nullptr;
  outputs.logits = c.head.kind != HeadKind::kNone && a.logits != nullptr;
  const Activations act = activations();
  stage_inputs(a);

  // The layout: padded, or packed over T rows (or T's bucket, rows past T zeros). Device inputs
  // under padding_free="auto" are packed first, then kept so where packing pays.
  SequenceLayout layout = SequenceLayout::padded(B, S, mask_.as<int32_t>());
  int64_t tokens = static_cast<int64_t>(B) * S;
  bool packed = a.packed;
  int64_t counted = -1;
  if (a.pack_if_it_pays) {
    counted = pack(a, attention == AttentionKind::kUnfused);
    const bool first_token_output =
        outputs.pooled || (outputs.logits && c.head.kind == HeadKind::kSequence);
    packed = packing_pays(B, S, counted) && !(first_token_output && tally_[1] != 0);
  }
  if (packed) {
    tokens = counted >= 0 ? counted : pack(a, attention == AttentionKind::kUnfused);
    layout.cu_seqlens = cu_seqlens_.as<int32_t>();
    layout.token_index = token_index_.as<int32_t>();
    layout.ids_packed = a.cu_seqlens != nullptr;
    // Where forwards may be recorded, rows are always the bucket's, graphs on or off: the GEMMs
    // then have the same sizes (so the same algorithms and the same results) either way. T
    // unknown on the host (packed_over_all_rows): every position is a row.
    layout.bounded = backend_->records() || tokens < 0;
    layout.rows = static_cast<int>(tokens < 0           ? static_cast<int64_t>(B) * S
                                   : widened_rows >= 0 ? widened_rows
                                   : layout.bounded    ? packed_rows_bucket(tokens, B, S)
                                                       : tokens);
  }

  // The final hidden states go straight to their destination where nothing after the last layer
  // reads them in a GEMM (no head whose GEMM reads every token) and they have the caller's layout (padded): to the
  // caller's tensor when it is on the device, which saves the copy. Recordings write them to
  // recorded_output_, which each replay redirects. Their kernels chose vector widths for that
  // aligned buffer: a caller's tensor not 16-byte aligned (the widest vector) gets hidden_ and
  // the copy instead.
  const bool direct = !layout.packed() && !(outputs.logits && c.head.gemm_reads_every_token());
  const bool aligned = reinterpret_cast<uintptr_t>(a.last_hidden_state) % 16 == 0;
  void* const destination =
      direct && a.outputs_on_device && aligned ? a.last_hidden_state : hidden_.data();
  Activations now = act;
  Activations recorded = act;
  if (direct) {
    now.output = destination;
    if (recorded_output_.bytes() == 0) recorded_output_ = DeviceBuffer(backend_, 256);
    recorded.output = recorded_output_.data();
  }
  const int32_t *ids = ids_.as<int32_t>(), *types = types_.as<int32_t>();
  const auto run = [&](const Activations& to) {
    model_.forward(*backend_, to, ids, types, layout, attention, outputs);
  };
  const RecordedOps* recording =
      graphs ? recording_for({B, S, layout.rows, packed, layout.ids_packed, attention, outputs},
                             [&] { run(recorded); }, recorded.output)
             : nullptr;
  if (recording != nullptr) {
    redirects_.clear();  // kept across forwards: no allocation per replay
    if (direct) redirects_.push_back({recorded.output, destination});
    backend_->replay(*recording, redirects_);
  } else {
    run(now);
  }
  copy_outputs(in, layout, tokens, outputs, destination == a.last_hidden_state);
  if (exact) {
    backend_->synchronize();
    result.nonfinite = take_nonfinite();
    if (a.packed && !a.outputs_on_device && !a.packed_outputs) {
      // The packed rows landed at the start of the caller's arrays: spread them out in place.
      const size_t es = dtype_size(model_.dtype());
      const int64_t padded = static_cast<int64_t>(B) * S;
      unpack_rows_host_in_place(a.last_hidden_state, host_token_index_.data(), tokens, padded,
                                c.hidden_size * es);
      if (outputs.logits && c.head.kind == HeadKind::kToken) {
        unpack_rows_host_in_place(a.logits, host_token_index_.data(), tokens, padded,
                                  c.head.num_labels * es);
      }
    }
  } else {
    result.earlier_nonfinite = take_nonfinite();
  }
  unfinished_ = !exact;
  return result;
}

void Session::copy_outputs(const ForwardArgs& a, const SequenceLayout& layout, int64_t tokens,
                           Model::Outputs outputs, bool hidden_delivered) {
  const ModelConfig& c = model_.config();
  const int B = a.batch, H = c.hidden_size, N = c.head.num_labels;
  const size_t es = dtype_size(model_.dtype());
  const bool token_logits = outputs.logits && c.head.kind == HeadKind::kToken;
  // Per-token outputs: packed rows as they are (host outputs are scattered once they land), or
  // spread back over the padding on the device.
  const int64_t rows = layout.packed() ? tokens : layout.rows;
  if (a.outputs_on_device) {
    if (layout.packed() && !a.packed_outputs) {
      backend_->unpack_rows(hidden_.data(), layout, a.last_hidden_state, H * es);
      if (token_logits) backend_->unpack_rows(logits_.data(), layout, a.logits, N * es);
    } else {
      if (!hidden_delivered) {
        backend_->copy_on_device(a.last_hidden_state, hidden_.data(), rows * H * es);
      }
      if (token_logits) backend_->copy_on_device(a.logits, logits_.data(), rows * N * es);
    }
    if (outputs.pooled) backend_->copy_on_device(a.pooler_output, pooled_.data(), B * H * es);
    if (outputs.logits && !token_logits) {
      backend_->copy_on_device(a.logits, logits_.data(), B * N * es);
    }
  } else {
    backend_->copy_to_host(a.last_hidden_state, hidden_.data(), rows * H * es);
    if (token_logits) backend_->copy_to_host(a.logits, logits_.data(), rows * N * es);
    if (outputs.pooled) backend_->copy_to_host(a.pooler_output, pooled_.data(), B * H * es);
    if (outputs.logits && !token_logits) backend_->copy_to_host(a.logits, logits_.data(), B * N * es);
  }
}

}  // namespace ftbert
