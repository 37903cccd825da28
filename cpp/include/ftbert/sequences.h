// How a batch's tokens lie in the activations, as the sequence-aware ops see it:
//   padded: every position of [B, S] is a row (B·S rows); the mask says which keys attend.
//   packed: only the attended tokens are rows, sequence after sequence ([T] rows, T = Σ lengths),
//           as FasterTransformer's EFF-FT and ByteTransformer run them; cu_seqlens are the prefix
//           sums of the lengths and token_index maps each row back to its padded position.
// Every per-token op (GEMMs, LayerNorm, activations) runs on `rows` rows either way; only the
// embeddings, attention, the first-token gather and the output scatter read the layout.
#pragma once

#include <cstddef>
#include <cstdint>

// The layout is read on the device too (kernels take it by value).
#ifdef __CUDACC__
#define FTBERT_HOST_DEVICE __host__ __device__
#else
#define FTBERT_HOST_DEVICE
#endif

namespace ftbert {

struct SequenceLayout {
  int batch = 0;    // B
  int max_seq = 0;  // S: the padded length (packed: the longest a sequence may be)
  // Rows of the per-token ops: B·S padded; packed, T, or a bound T <= rows <= B·S that a
  // recording was made for (rows past T then hold zeros, see `bounded`).
  int rows = 0;
  const int32_t* mask = nullptr;         // [B, S] 1 = token, 0 = padding (the caller's layout)
  const int32_t* cu_seqlens = nullptr;   // [B + 1] packed only: sequence b is rows cu[b]..cu[b+1]-1
  const int32_t* token_index = nullptr;  // [rows] packed only: b·S + s of each row; -1 past T
  // Packed with rows possibly above T (a recording for a token-count bucket): T is known on the
  // device only, and rows past it must be kept finite (Model::forward zeroes what attention
  // leaves unwritten there).
  bool bounded = false;
  // The inputs (ids, token types) lie one per row, in row order, as packed callers give them;
  // otherwise at their padded positions (row r's at token_index[r]).
  bool ids_packed = false;

  FTBERT_HOST_DEVICE bool packed() const { return cu_seqlens != nullptr; }
  // Packed: 1 + the padded position of the last token of the sequence that holds `token`
  // (b·S + s): its length where the padding is on the right.
  FTBERT_HOST_DEVICE int sequence_extent(int token) const {
    const int b = token / max_seq;
    return token_index[cu_seqlens[b + 1] - 1] - b * max_seq + 1;
  }
  static SequenceLayout padded(int batch, int seq, const int32_t* mask) {
    SequenceLayout l;
    l.batch = batch;
    l.max_seq = seq;
    l.rows = batch * seq;
    l.mask = mask;
    return l;
  }
};

// Whether packing a batch of `tokens` attended tokens in [batch, seq] pays: padding_free="auto"'s
// rule. Packing costs an upload or a count of the sequence offsets and a scatter of the outputs;
// it pays once padding is at least kAutoPackedPadding of the batch's positions.
constexpr double kAutoPackedPadding = 0.1;
inline bool packing_pays(int batch, int seq, int64_t tokens) {
  const double padded = static_cast<double>(batch) * seq;
  return tokens >= 0 && padded - static_cast<double>(tokens) >= kAutoPackedPadding * padded;
}

// The host side of packing, the reference for Backend::pack_sequences: from the mask [B, S],
// cu_seqlens [B + 1] and token_index [capacity] (attended positions in order; -1 from T on).
// Returns T. A sequence keeps its tokens' order, wherever its padding is (left, right, inside).
int64_t pack_sequences_host(const int32_t* mask, int batch, int seq, int32_t* cu_seqlens,
                            int32_t* token_index, int64_t capacity);

// The layout of inputs that come packed: from cu_seqlens [B + 1] (sequence b is rows
// cu[b]..cu[b+1]-1, each at most `seq` long), token_index [capacity] (b·S + s of each row; -1 from
// T on) and, when `mask` is given, the padded mask [B, S] the unfused attention reads. Returns T.
int64_t index_packed_host(const int32_t* cu_seqlens, int batch, int seq, int32_t* token_index,
                          int64_t capacity, int32_t* mask = nullptr);

// Scatters packed rows back to the padded layout, in place: `data` holds T rows of `row_bytes`
// at its start and receives [B·S] rows, padding zeroed. Host memory.
void unpack_rows_host_in_place(void* data, const int32_t* token_index, int64_t tokens,
                               int64_t padded_rows, size_t row_bytes);

// The token-count bucket a packed recording is made for: T rounded up to a step of 1/64 of B·S
// (at least 64 rows), at most B·S; so a (B, S) shape has at most 64 packed recordings and a
// replay computes at most 1/64 of B·S rows more than it needs (at 16 x 512, half a step was
// ~5% of a typical ragged batch's rows).
int64_t packed_rows_bucket(int64_t tokens, int batch, int seq);

// The shape a recording of inputs that come packed is made for (Session::forward): the batch and
// the longest sequence each rounded up to a power of two (the sequence at most `max_seq`, the
// extra sequences empty) and T rounded up to one of sixteen buckets an octave (at least 64 rows).
// Ragged traffic, whose exact (B, S, T) rarely repeat, then meets a few recordings, each replayed
// often, for at most 1/16 more GEMM rows than T.
struct PackedShape {
  int batch, seq;
  int64_t rows;
};
PackedShape recorded_packed_shape(int batch, int seq, int64_t tokens, int max_seq);

}  // namespace ftbert
