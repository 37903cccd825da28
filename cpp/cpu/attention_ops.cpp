// The unfused attention's element-wise ops on the CPU: add Q|K|V bias and split heads, masked
// softmax, merge heads. The batched GEMMs between them are in gemm.cpp.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"

namespace ftbert {

using cpu::parallel_for;

void CpuBackend::add_qkv_bias_transpose(DType dt, const void* qkv,  // [rows, 3H]
                                        const void* bias,            // [3H]
                                        void* q, void* k, void* v,   // [B, heads, S, d]
                                        const SequenceLayout& l, int heads, int head_dim) {
  require_cpu_float32(dt, "add_qkv_bias_transpose");
  const auto* in = static_cast<const float*>(qkv);
  const auto* b = static_cast<const float*>(bias);
  float* outs[3] = {static_cast<float*>(q), static_cast<float*>(k), static_cast<float*>(v)};
  const int hidden = heads * head_dim;
  const int64_t seq = l.max_seq, padded = static_cast<int64_t>(l.batch) * seq;
  // Packed: row r goes to its padded position token_index[r]; padding stays zero (a masked key's
  // V is multiplied by a zero weight, which must not meet a NaN).
  const int64_t rows = l.packed() ? l.cu_seqlens[l.batch] : padded;
  if (l.packed()) {
    for (float* o : outs) std::fill(o, o + padded * hidden, 0.0f);
  }
  parallel_for(rows, rows * 3 * hidden, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = l.packed() ? l.token_index[r] : r;  // b * S + s
      const int64_t bi = t / seq, s = t % seq;
      const float* row = in + r * 3 * hidden;
      for (int part = 0; part < 3; ++part) {
        for (int h = 0; h < heads; ++h) {
          float* dst = outs[part] + ((bi * heads + h) * seq + s) * head_dim;
          const int col = part * hidden + h * head_dim;
          for (int j = 0; j < head_dim; ++j) dst[j] = row[col + j] + b[col + j];
        }
      }
    }
  });
}

void CpuBackend::masked_softmax(DType dt, void* scores,  // [B, heads, S, S]
                                const SequenceLayout& l, int heads, float scale) {
  require_cpu_float32(dt, "masked_softmax");
  auto* x = static_cast<float*>(scores);
  const int seq = l.max_seq;
  const int64_t rows = static_cast<int64_t>(l.batch) * heads * seq;
  parallel_for(rows, rows * seq, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t bi = r / (static_cast<int64_t>(heads) * seq);
      const int32_t* m = l.mask + bi * seq;
      float* row = x + r * seq;
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < seq; ++j)
        if (m[j]) mx = std::max(mx, row[j] * scale);
      if (mx == -std::numeric_limits<float>::infinity()) {  // every key masked: zeros, not NaN
        std::fill(row, row + seq, 0.0f);
        continue;
      }
      double sum = 0.0;
      for (int j = 0; j < seq; ++j) {
        const float e = m[j] ? std::exp(row[j] * scale - mx) : 0.0f;
        row[j] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = 0; j < seq; ++j) row[j] *= inv;
    }
  });
}

void CpuBackend::transpose_heads(DType dt, const void* in,  // [B, heads, S, d]
                                 void* out,                  // [rows, H]
                                 const SequenceLayout& l, int heads, int head_dim) {
  require_cpu_float32(dt, "transpose_heads");
  const auto* src = static_cast<const float*>(in);
  auto* dst = static_cast<float*>(out);
  const int hidden = heads * head_dim;
  const int64_t seq = l.max_seq;
  // Packed: row r gathers its padded position token_index[r]; rows past T are left alone.
  const int64_t rows = l.packed() ? l.cu_seqlens[l.batch] : static_cast<int64_t>(l.batch) * seq;
  parallel_for(rows, rows * hidden, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = l.packed() ? l.token_index[r] : r;
      const int64_t bi = t / seq, s = t % seq;
      float* row = dst + r * hidden;
      for (int h = 0; h < heads; ++h) {
        const float* head = src + ((bi * heads + h) * seq + s) * head_dim;
        std::copy(head, head + head_dim, row + h * head_dim);
      }
    }
  });
}

}  // namespace ftbert
