// The sequence-layout ops on the CPU (packing itself is pack_sequences_host, cpp/core).
#include <algorithm>
#include <cstring>

#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/rows.h"

namespace ftbert {

void CpuBackend::first_tokens(DType dt, const void* x,  // [rows, H]
                              const SequenceLayout& l,
                              void* out,  // [B, H]
                              int hidden) {
  require_cpu_dtype(dt, "first_tokens");
  const size_t row_bytes = hidden * dtype_size(dt);
  const auto* src = static_cast<const unsigned char*>(x);
  auto* dst = static_cast<unsigned char*>(out);
  for (int64_t b = 0; b < l.batch; ++b) {
    unsigned char* row = dst + b * row_bytes;
    int64_t first = b * l.max_seq;
    if (l.packed()) {
      if (l.cu_seqlens[b + 1] == l.cu_seqlens[b]) {  // an empty sequence has no first token
        std::memset(row, 0, row_bytes);
        continue;
      }
      first = l.cu_seqlens[b];
    }
    std::memcpy(row, src + first * row_bytes, row_bytes);
  }
}

void CpuBackend::mean_tokens(DType dt, const void* x,  // [rows, H]
                             const SequenceLayout& l,
                             void* out,  // [B, H]
                             int hidden) {
  require_cpu_dtype(dt, "mean_tokens");
  std::vector<float> sum(hidden), row_buf(hidden);
  for (int64_t b = 0; b < l.batch; ++b) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    const int64_t first = l.packed() ? l.cu_seqlens[b] : b * l.max_seq;
    const int64_t end = l.packed() ? l.cu_seqlens[b + 1] : first + l.max_seq;
    int64_t count = 0;
    for (int64_t r = first; r < end; ++r) {
      if (!l.packed() && l.mask[r] == 0) continue;
      const float* row = cpu::load_row(dt, x, r, hidden, row_buf.data());
      for (int c = 0; c < hidden; ++c) sum[c] += row[c];
      ++count;
    }
    float* o = cpu::out_row(dt, out, b, hidden, row_buf.data());
    for (int c = 0; c < hidden; ++c) o[c] = count > 0 ? sum[c] / static_cast<float>(count) : 0.0f;
    cpu::store_row(dt, out, b, hidden, o);
  }
}

void CpuBackend::unpack_rows(const void* in,  // [rows, row_bytes]
                             const SequenceLayout& l,
                             void* out,  // [B·S, row_bytes]
                             size_t row_bytes) {
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(out);
  std::memset(dst, 0, static_cast<size_t>(l.batch) * l.max_seq * row_bytes);
  const int64_t tokens = l.cu_seqlens[l.batch];
  for (int64_t r = 0; r < tokens; ++r) {
    std::memcpy(dst + l.token_index[r] * row_bytes, src + r * row_bytes, row_bytes);
  }
}

void CpuBackend::clear_rows_past_tokens(void* x, const SequenceLayout& l, size_t row_bytes) {
  const int64_t tokens = l.cu_seqlens[l.batch];
  if (tokens < l.rows) {
    std::memset(static_cast<unsigned char*>(x) + tokens * row_bytes, 0,
                (l.rows - tokens) * row_bytes);
  }
}

}  // namespace ftbert
