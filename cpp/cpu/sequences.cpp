// The sequence-layout ops on the CPU (packing itself is pack_sequences_host, cpp/core).
#include <algorithm>
#include <cstring>

#include "cpu/cpu_backend.h"

namespace ftbert {

void CpuBackend::first_tokens(DType dt, const void* x,  // [rows, H]
                              const SequenceLayout& l,
                              void* out,  // [B, H]
                              int hidden) {
  require_cpu_float32(dt, "first_tokens");
  const auto* src = static_cast<const float*>(x);
  auto* dst = static_cast<float*>(out);
  for (int64_t b = 0; b < l.batch; ++b) {
    float* row = dst + b * hidden;
    int64_t first = b * l.max_seq;
    if (l.packed()) {
      if (l.cu_seqlens[b + 1] == l.cu_seqlens[b]) {  // an empty sequence has no first token
        std::fill(row, row + hidden, 0.0f);
        continue;
      }
      first = l.cu_seqlens[b];
    }
    std::copy(src + first * hidden, src + (first + 1) * hidden, row);
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
