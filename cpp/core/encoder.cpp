// The Encoder: checks a forward's inputs, picks the attention kernel, and runs the forward in a
// session of its pool. No backend-specific code lives here.
#include "ftbert/encoder.h"

#include <algorithm>
#include <cstdint>

#include "ftbert/check.h"

namespace ftbert {

Encoder::Encoder(const ModelConfig& config, const HostWeights& weights, const std::string& device,
                 DType compute, Quantization quantization)
    : device_(device) {
  backend_ = create_backend(device);
  const std::string why = backend_->quantization_unsupported_reason(quantization, compute);
  FTBERT_CHECK_INPUT(why.empty(), why);
  backend_->set_quantization(quantization);
  model_ = create_model(config, weights, backend_.get(), compute);
  constexpr size_t kWords = sizeof(BadInputValue) / sizeof(int32_t);
  int32_t* words = backend_->allocate_host_flag(kWords);
  bad_input_host_ = reinterpret_cast<BadInputValue*>(words);
  try {
    bad_input_device_ = reinterpret_cast<BadInputValue*>(backend_->host_flag_device_address(words));
  } catch (...) {
    backend_->free_host_flag(words);
    throw;
  }
}

Encoder::~Encoder() {
  // Sessions first: they synchronize their streams, and slot 0 runs on backend_.
  for (auto& slot : slots_) slot->session.reset();
  backend_->free_host_flag(reinterpret_cast<int32_t*>(bad_input_host_));
}

BadInputValue Encoder::take_bad_input() {
  BadInputValue out;
  BadInputValue* b = bad_input_host_;
  out.field = __atomic_load_n(&b->field, __ATOMIC_ACQUIRE);
  if (out.field == BadInputValue::kNone) return out;
  out.value = __atomic_load_n(&b->value, __ATOMIC_ACQUIRE);
  // Field first: a writer that finds the claim free again records a new field after this clear.
  __atomic_store_n(&b->field, BadInputValue::kNone, __ATOMIC_RELEASE);
  __atomic_store_n(&b->claim, 0, __ATOMIC_RELEASE);
  return out;
}

void Encoder::synchronize() {
  for (Slot* s : slots()) {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->session) s->session->backend().synchronize();
  }
}

void Encoder::set_attention(AttentionMode mode) {
  // Forcing flash where it cannot run fails now, not at the next forward.
  const AttentionKind kind = select_attention(mode, *backend_, dtype(), config().head_dim(), 1, 1);
  if (batch_invariant_) {
    const std::string why = backend_->batch_invariant_unsupported_reason(dtype(), kind);
    FTBERT_CHECK_INPUT(why.empty(), "attention='" << attention_mode_name(mode)
                                                  << "' with batch_invariant=True: " << why);
  }
  attention_mode_ = mode;
}

AttentionKind Encoder::attention_for(int batch, int seq) const {
  return select_attention(attention_mode_, *backend_, dtype(), config().head_dim(), batch, seq);
}

// The padding-free rule. `auto` packs where packing pays (packing_pays: enough padding) and the
// token count is known on the host (host inputs, or packed callers), and never where packing
// would change a first-token output. Device inputs are counted on the device instead, where the
// batch is large enough for the read back to pay (auto_counts_on_device). See docs/api.md
// (`padding_free`).
bool Encoder::padding_free_for(int batch, int seq, int64_t tokens, bool first_token_differs) const {
  // Dynamic rope scaling turns each sequence by the angles of its own length, which the packed
  // layout's offsets give the rotary op.
  if (batch_invariant_ || config().rotary_dynamic()) return true;
  switch (padding_free_.load()) {
    case PaddingFree::kOff: return false;
    case PaddingFree::kOn: return true;
    case PaddingFree::kAuto: break;
  }
  return !first_token_differs && packing_pays(batch, seq, tokens);
}

bool Encoder::auto_counts_on_device(int batch, int seq) const {
  return padding_free_.load() == PaddingFree::kAuto && batch >= 2 &&
         static_cast<int64_t>(batch) * seq >= kAutoDeviceCountMinPositions;
}

// ---- the session pool ---------------------------------------------------------------------------

std::vector<Encoder::Slot*> Encoder::slots() const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  std::vector<Slot*> out;
  for (const auto& s : slots_) out.push_back(s.get());
  return out;
}

Encoder::Slot& Encoder::acquire(uintptr_t stream) {
  std::unique_lock<std::mutex> lock(pool_mutex_);
  for (;;) {
    const size_t usable = std::min<size_t>(slots_.size(), concurrency_);
    Slot* pick = nullptr;
    for (size_t i = 0; i < usable; ++i) {
      Slot& s = *slots_[i];
      if (s.busy) continue;
      // The same stream needs no cross-stream wait, and a session that exists has its buffers
      // and recordings already.
      if (s.session && s.last_stream == stream) {
        pick = &s;
        break;
      }
      if (pick == nullptr || (!pick->session && s.session)) pick = &s;
    }
    if (pick == nullptr && slots_.size() < static_cast<size_t>(concurrency_)) {
      slots_.push_back(std::make_unique<Slot>(slots_.size()));
      pick = slots_.back().get();
    }
    if (pick != nullptr) {
      pick->busy = true;
      return *pick;
    }
    slot_freed_.wait(lock);
  }
}

void Encoder::release(Slot& slot, uintptr_t stream) {
  bool trimmed;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    slot.busy = false;
    slot.last_stream = stream;
    trimmed = slot.index >= static_cast<size_t>(concurrency_.load());
  }
  slot_freed_.notify_one();
  // set_concurrency lowered the count while this forward ran (it may even have freed the
  // session before the forward made a new one): free what the slot holds now, unless the count
  // went back up and another forward took the slot meanwhile.
  if (trimmed) {
    std::lock_guard<std::mutex> hold(slot.mutex);
    bool still_trimmed;
    {
      std::lock_guard<std::mutex> lock(pool_mutex_);
      still_trimmed = !slot.busy && slot.index >= static_cast<size_t>(concurrency_.load());
    }
    if (still_trimmed) slot.session.reset();
  }
}

void Encoder::set_concurrency(int sessions) {
  FTBERT_CHECK_INPUT(sessions >= 1 && sessions <= kMaxConcurrency,
                     "concurrency must be between 1 and " << kMaxConcurrency << ", got "
                                                          << sessions);
  std::vector<Slot*> trim;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    concurrency_ = sessions;
    for (size_t i = sessions; i < slots_.size(); ++i) trim.push_back(slots_[i].get());
  }
  slot_freed_.notify_all();
  // Slots past the count get no new forwards; wait for the one running in each, then free it.
  for (Slot* s : trim) {
    std::lock_guard<std::mutex> lock(s->mutex);
    s->session.reset();
  }
}

// ---- settings that reach every session ---------------------------------------------------------

void Encoder::set_graphs(bool on) {
  graphs_ = on;
  if (on) return;
  for (Slot* s : slots()) {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->session) s->session->drop_recordings();
  }
}

size_t Encoder::recorded_shapes() const {
  size_t n = 0;
  for (Slot* s : slots()) {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->session) n += s->session->recorded_shapes();
  }
  return n;
}

std::tuple<uint64_t, uint64_t, uint64_t> Encoder::graph_counts() const {
  constexpr auto relaxed = std::memory_order_relaxed;
  return {graph_counts_.replayed.load(relaxed), graph_counts_.recorded.load(relaxed),
          graph_counts_.op_by_op.load(relaxed)};
}

size_t Encoder::workspace_bytes() const {
  size_t n = 0;
  for (Slot* s : slots()) {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->session) n += s->session->workspace_bytes();
  }
  return n;
}

void Encoder::set_allow_tf32(bool allow) {
  allow_tf32_ = allow;
  for (Slot* s : slots()) {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (!s->session) continue;
    s->session->drop_recordings();
    s->session->backend().set_allow_tf32(allow);
  }
}

void Encoder::set_batch_invariant(bool on) {
  if (on) {
    const std::string why =
        backend_->batch_invariant_unsupported_reason(dtype(), attention_for(1, 1));
    FTBERT_CHECK_INPUT(why.empty(), "batch_invariant=True: " << why);
  }
  batch_invariant_ = on;  // each session's backend takes it at its next forward
}

// ---- forward ------------------------------------------------------------------------------------

void Encoder::validate(const ForwardArgs& a) const {
  FTBERT_CHECK_INPUT(a.batch > 0, "empty batch: batch size must be at least 1");
  FTBERT_CHECK_INPUT(a.seq > 0, "empty sequences: sequence length must be at least 1");
  FTBERT_CHECK_INPUT(a.seq <= config().max_seq(),
                     "input_ids has sequence length " << a.seq << ", longer than the "
                                                      << config().max_seq()
                                                      << " positions the model has");
  if (a.cu_seqlens != nullptr) {
    FTBERT_CHECK_INPUT(a.input_ids && a.last_hidden_state && (a.token_type_ids || a.inputs_on_device),
                       "forward: packed inputs need input_ids, token_type_ids (on the device, "
                       "optional) and the output");
  } else {
    FTBERT_CHECK_INPUT(
        a.input_ids && a.attention_mask && a.token_type_ids && a.last_hidden_state,
        "forward: input_ids, attention_mask, token_type_ids and the output are required");
  }
  for (const int bytes : {a.ids_bytes, a.mask_bytes, a.types_bytes}) {
    FTBERT_CHECK_INPUT(bytes == 4 || (a.inputs_on_device && (bytes == 8 || bytes == 1)),
                       "forward: inputs hold 4-byte values (device inputs: 8 or 1 too), got "
                           << bytes);
  }
}

ForwardResult Encoder::forward(const ForwardArgs& in) {
  ForwardArgs args = in;
  if (args.cu_seqlens != nullptr) {
    // Packed inputs: T and the longest sequence from the offsets, which must be whole.
    const int32_t* cu = args.cu_seqlens;
    FTBERT_CHECK_INPUT(args.batch > 0, "empty batch: cu_seqlens needs at least 2 entries");
    FTBERT_CHECK_INPUT(cu[0] == 0, "cu_seqlens must start at 0, got " << cu[0]);
    int longest = 0;
    for (int b = 0; b < args.batch; ++b) {
      FTBERT_CHECK_INPUT(cu[b + 1] >= cu[b], "cu_seqlens must not decrease, but entry "
                                                 << b + 1 << " (" << cu[b + 1] << ") < entry " << b
                                                 << " (" << cu[b] << ")");
      longest = std::max(longest, cu[b + 1] - cu[b]);
    }
    args.seq = std::max(longest, 1);
    FTBERT_CHECK_INPUT(static_cast<int64_t>(args.batch) * args.seq <= INT32_MAX,
                       "packed inputs: " << args.batch << " sequences of up to " << args.seq
                                         << " tokens index more than 2^31 - 1 positions");
    args.tokens = cu[args.batch];
    args.packed_outputs = true;
  }
  validate(args);
  FTBERT_CHECK_INPUT(!args.padded || !args.packed_outputs,
                     "forward: padded=True asks for a padded forward, but the inputs or the "
                     "outputs come packed (cu_seqlens, packed_outputs)");
  FTBERT_CHECK_INPUT(!args.padded || !config().rotary_dynamic(),
                     "forward: padded=True asks for a padded forward, but this model scales its "
                     "rotary angles by each sequence's length (dynamic rope scaling), which runs "
                     "in packed forwards only");
  const bool invariant = batch_invariant_;
  // Host masks are counted here (for the rule and the GEMM sizes), with whether every sequence
  // starts with a token.
  bool first_positions_attended = true;
  if (!args.inputs_on_device && args.cu_seqlens == nullptr) {
    int64_t t = 0;
    for (int64_t b = 0; b < args.batch; ++b) {
      const int32_t* row = args.attention_mask + b * args.seq;
      first_positions_attended = first_positions_attended && row[0] != 0;
      for (int s = 0; s < args.seq; ++s) t += row[s] != 0;
    }
    args.tokens = t;
  }
  FTBERT_CHECK_INPUT(!args.packed_outputs || args.tokens >= 0,
                     "packed outputs need the token count");
  const HeadConfig& head = config().head;
  const bool first_token_output =
      (args.pooler_output != nullptr && config().has_pooler) ||
      (args.logits != nullptr && head.kind == HeadKind::kSequence);
  // Device inputs under auto are counted on the device (the session decides) or stay padded,
  // even when their caller counted them (a count read back with a value check serves
  // padding_free=True only), so auto's results for device inputs never depend on whether anyone
  // counted.
  const int64_t counted = args.inputs_on_device ? -1 : args.tokens;
  // A padded call under batch invariance stays padded, on the invariant kernels: the rows of
  // masked positions exist in no packed forward, and every op runs per row or per sequence on
  // kernels that never change with the row count or the grid, so a sequence's bits still do not
  // depend on the others in its batch or its place there (they are not a packed forward's bits,
  // though, nor promised across padded lengths).
  args.packed = !args.padded &&
                (args.packed_outputs || invariant ||
                 padding_free_for(args.batch, args.seq, counted,
                                  first_token_output && !first_positions_attended));
  args.pack_if_it_pays = !args.packed && !args.padded && args.inputs_on_device &&
                         args.outputs_on_device && auto_counts_on_device(args.batch, args.seq);
  // Batch invariance packs every forward; uncounted small batches of device inputs skip the read
  // back of the count (its wait for the inputs costs more than their padding's rows).
  args.packed_over_all_rows = args.packed && invariant && args.inputs_on_device &&
                              args.outputs_on_device && args.tokens < 0 && !args.packed_outputs &&
                              !auto_counts_on_device(args.batch, args.seq);
  const AttentionKind attention = attention_for(args.batch, args.seq);
  const uintptr_t stream = args.stream.value_or(0);
  Slot& slot = acquire(stream);
  Lease lease(this, slot, stream);  // gives the slot back however the forward ends
  std::lock_guard<std::mutex> lock(slot.mutex);
  Session& session = session_of(slot);
  // The setting as this forward read it (args.packed above): the session's recordings hold the
  // kernels of the other one.
  Backend& be = session.backend();
  if (be.batch_invariant() != invariant) {
    session.drop_recordings();
    be.set_batch_invariant(invariant);
  }
  ForwardArgs a = args;
  if (a.inputs_on_device) a.bad_input = bad_input_device_;
  // Host callers name no stream: the session's own one keeps them apart from each other.
  if (!a.stream) a.stream = be.own_stream();
  return session.forward(a, attention, graphs_);
}

Session& Encoder::session_of(Slot& slot) {
  if (!slot.session) {
    // Slot 0 runs on the backend that holds the weights; the others get a backend (stream,
    // cuBLAS handle) of their own, so that their work can overlap.
    const bool first = slot.index == 0;
    std::unique_ptr<Backend> own = first ? nullptr : create_backend(device_);
    Backend* be = first ? backend_.get() : own.get();
    be->set_allow_tf32(allow_tf32_);
    be->set_quantization(backend_->quantization());  // reads the weights backend_ uploaded
    slot.session = std::make_unique<Session>(*model_, be, std::move(own));
    slot.session->count_graphs_into(&graph_counts_);
  }
  return *slot.session;
}

void Encoder::reserve_workspace(int batch, int seq, int64_t rows) {
  FTBERT_CHECK_INPUT(batch >= 1 && seq >= 1 && seq <= config().max_seq(),
                     "reserve_workspace: " << batch << " sequences of up to " << seq
                                           << " positions; the model takes 1 to "
                                           << config().max_seq() << " positions");
  FTBERT_CHECK_INPUT(rows >= 1 && rows <= static_cast<int64_t>(batch) * seq && rows <= INT32_MAX,
                     "reserve_workspace: " << rows << " rows, but " << batch << " x " << seq
                                           << " positions hold 1 to "
                                           << static_cast<int64_t>(batch) * seq);
  const AttentionKind attention = attention_for(batch, seq);
  Slot& slot = acquire(0);  // the slot a host caller's next forward takes (stream 0 first)
  Lease lease(this, slot, 0);
  std::lock_guard<std::mutex> lock(slot.mutex);
  session_of(slot).reserve(batch, seq, rows, attention);
}

}  // namespace ftbert
