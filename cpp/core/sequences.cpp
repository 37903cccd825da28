// Packing on the host: the reference for Backend::pack_sequences and the path host inputs take
// (their mask is on the host already, so T is known without asking the device).
#include "ftbert/sequences.h"

#include <algorithm>
#include <cstring>

#include "ftbert/check.h"

namespace ftbert {

int64_t pack_sequences_host(const int32_t* mask, int batch, int seq, int32_t* cu_seqlens,
                            int32_t* token_index, int64_t capacity) {
  int64_t t = 0;
  cu_seqlens[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t i = b * seq + s;
      if (mask[i] == 0) continue;
      FTBERT_CHECK(t < capacity, "pack_sequences: more tokens than the " << capacity << " rows given");
      token_index[t++] = static_cast<int32_t>(i);
    }
    cu_seqlens[b + 1] = static_cast<int32_t>(t);
  }
  std::fill(token_index + t, token_index + capacity, -1);
  return t;
}

int64_t index_packed_host(const int32_t* cu_seqlens, int batch, int seq, int32_t* token_index,
                          int64_t capacity, int32_t* mask) {
  const int64_t tokens = cu_seqlens[batch];
  FTBERT_CHECK(tokens <= capacity, "index_packed: more tokens than the " << capacity << " rows given");
  if (mask != nullptr) std::fill(mask, mask + static_cast<int64_t>(batch) * seq, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cu_seqlens[b + 1] - cu_seqlens[b];
    FTBERT_CHECK(length >= 0 && length <= seq,
                 "index_packed: sequence " << b << " has " << length << " tokens, not 0.." << seq);
    for (int64_t s = 0; s < length; ++s) {
      token_index[cu_seqlens[b] + s] = static_cast<int32_t>(b * seq + s);
      if (mask != nullptr) mask[b * seq + s] = 1;
    }
  }
  std::fill(token_index + tokens, token_index + capacity, -1);
  return tokens;
}

void unpack_rows_host_in_place(void* data, const int32_t* token_index, int64_t tokens,
                               int64_t padded_rows, size_t row_bytes) {
  auto* base = static_cast<unsigned char*>(data);
  // Row r goes to token_index[r] >= r (indices grow with r and skip padding), so moving the last
  // row first never overwrites a row still to be moved.
  int64_t next = padded_rows;  // padded rows at or past `next` are done
  for (int64_t r = tokens - 1; r >= 0; --r) {
    const int64_t dst = token_index[r];
    if (dst + 1 < next) {
      std::memset(base + (dst + 1) * row_bytes, 0, (next - dst - 1) * row_bytes);
    }
    if (dst != r) std::memmove(base + dst * row_bytes, base + r * row_bytes, row_bytes);
    next = dst;
  }
  if (next > 0) std::memset(base, 0, next * row_bytes);
}

int64_t packed_rows_bucket(int64_t tokens, int batch, int seq) {
  const int64_t padded = static_cast<int64_t>(batch) * seq;
  const int64_t step = std::max<int64_t>(64, (padded / 64 + 63) / 64 * 64);
  return std::min(padded, std::max<int64_t>(1, (tokens + step - 1) / step) * step);
}

PackedShape recorded_packed_shape(int batch, int seq, int64_t tokens, int max_seq) {
  const auto power_of_two = [](int64_t n) {
    int64_t p = 1;
    while (p < n) p *= 2;
    return p;
  };
  PackedShape s;
  s.batch = static_cast<int>(power_of_two(batch));
  s.seq = static_cast<int>(std::max<int64_t>(seq, std::min<int64_t>(power_of_two(seq), max_seq)));
  const int64_t t = std::max<int64_t>(tokens, 1);
  const int64_t step = std::max<int64_t>(64, power_of_two(t + 1) / 32);  // 1/16 of T's octave
  s.rows = std::min(static_cast<int64_t>(s.batch) * s.seq, (t + step - 1) / step * step);
  return s;
}

}  // namespace ftbert
