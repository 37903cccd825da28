// Attention on the CPU: the fused flash-style op, and the unfused path's element-wise ops (add
// Q|K|V bias and split heads, masked softmax, merge heads; its batched GEMMs are in gemm.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace ftbert {

using cpu::parallel_for;

void CpuBackend::add_qkv_bias_transpose(DType dt, const void* qkv,  // [rows, 3H]
                                        const void* bias,            // [3H]
                                        void* q, void* k, void* v,   // [B, heads, S, d]
                                        const SequenceLayout& l, int heads, int head_dim) {
  require_cpu_dtype(dt, "add_qkv_bias_transpose");
  void* outs[3] = {q, k, v};
  const int hidden = heads * head_dim;
  const cpu::Floats b(dt, bias, 3 * hidden);
  const int64_t seq = l.max_seq, padded = static_cast<int64_t>(l.batch) * seq;
  // Packed: row r goes to its padded position token_index[r]; padding stays zero (a masked key's
  // V is multiplied by a zero weight, which must not meet a NaN).
  const int64_t rows = l.packed() ? l.cu_seqlens[l.batch] : padded;
  if (l.packed()) {
    for (void* o : outs) std::memset(o, 0, padded * hidden * dtype_size(dt));
  }
  parallel_for(rows, rows * 3 * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(2, 3 * hidden);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = l.packed() ? l.token_index[r] : r;  // b * S + s
      const int64_t bi = t / seq, s = t % seq;
      const float* row = cpu::load_row(dt, qkv, r, 3 * hidden, buf);
      float* sum = buf + 3 * hidden;  // row + bias, whole, then cut into heads
      for (int c = 0; c < 3 * hidden; ++c) sum[c] = row[c] + b.data()[c];
      for (int part = 0; part < 3; ++part) {
        for (int h = 0; h < heads; ++h) {
          // Row (bi, h, s) of the [B, heads, S, d] output, head_dim wide.
          cpu::store_row(dt, outs[part], (bi * heads + h) * seq + s, head_dim,
                         sum + part * hidden + h * head_dim);
        }
      }
    }
  });
}

void CpuBackend::disentangled_scores(DType dt, void* scores,  // [B, heads, S, S]
                                     int batch, int heads, int seq, const DisentangledTerms& t) {
  require_cpu_dtype(dt, "disentangled_scores");
  FTBERT_CHECK(t.rows == seq && t.column != nullptr && (t.c2p != nullptr || t.p2c != nullptr),
               "disentangled_scores: terms for " << t.rows << " rows, expected one per position ("
                                                 << seq << ") and at least one table");
  const int64_t tables = int64_t{batch} * heads, n = tables * seq * t.width;
  const cpu::Floats c2p(dt, t.c2p, t.c2p != nullptr ? n : 0);
  const cpu::Floats p2c(dt, t.p2c, t.p2c != nullptr ? n : 0);
  const int32_t* column = t.column;
  parallel_for(tables * seq, tables * seq * seq, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(1, seq);
    for (int64_t r = begin; r < end; ++r) {  // score row r = (b·heads + h)·S + i
      const int64_t table = r / seq;
      const int i = static_cast<int>(r % seq);
      float* row = cpu::load_row(dt, scores, r, seq, buf);
      const float* q_terms = t.c2p != nullptr ? c2p.data() + r * t.width : nullptr;
      const float* k_terms = t.p2c != nullptr ? p2c.data() + table * seq * t.width : nullptr;
      for (int j = 0; j < seq; ++j) {
        const int col = column[i - j] - t.first;
        if (q_terms != nullptr) row[j] += q_terms[col];
        if (k_terms != nullptr) row[j] += k_terms[int64_t{j} * t.width + col];
      }
      cpu::store_row(dt, scores, r, seq, row);
    }
  });
}

void CpuBackend::masked_softmax(DType dt, void* scores,  // [B, heads, S, S]
                                const SequenceLayout& l, int heads, float scale,
                                const AttentionOptions& options) {
  require_cpu_dtype(dt, "masked_softmax");
  const int seq = l.max_seq;
  FTBERT_CHECK(!options.has_relative_bias() || options.relative_span >= seq,
               "masked_softmax: relative bias span " << options.relative_span
                                                     << " is shorter than the sequence " << seq);
  const int64_t rows = static_cast<int64_t>(l.batch) * heads * seq;
  const int64_t width = 2 * static_cast<int64_t>(options.relative_span) - 1;
  const auto kernel = cpu::kernels().masked_softmax;
  parallel_for(rows, rows * seq, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(1, seq);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t bi = r / (static_cast<int64_t>(heads) * seq);
      float* row = cpu::load_row(dt, scores, r, seq, buf);
      float row_scale = scale;
      const int64_t i = r % seq;
      if (options.has_relative_bias()) {  // row = scale · row + bias, then a softmax of scale 1
        const int64_t h = (r / seq) % heads;
        const float* bias = options.relative_bias + h * width + options.relative_span - 1 - i;
        for (int j = 0; j < seq; ++j) row[j] = row[j] * scale + bias[j];
        row_scale = 1.0f;
      }
      const int32_t* keys = l.mask + bi * seq;
      if (options.window > 0) {  // the key mask, cut to the window: keys outside weigh exactly 0
        thread_local std::vector<int32_t> in_window;
        in_window.assign(keys, keys + seq);
        for (int64_t j = 0; j < seq; ++j) {
          if (j < i - options.window || j > i + options.window) in_window[j] = 0;
        }
        keys = in_window.data();
      }
      kernel(row, keys, seq, row_scale);
      cpu::store_row(dt, scores, r, seq, row);
    }
  });
}

void CpuBackend::transpose_heads(DType dt, const void* in,  // [B, heads, S, d]
                                 void* out,                  // [rows, H]
                                 const SequenceLayout& l, int heads, int head_dim) {
  require_cpu_dtype(dt, "transpose_heads");
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(out);
  const int hidden = heads * head_dim;
  const size_t e = dtype_size(dt), head_bytes = head_dim * e;
  const int64_t seq = l.max_seq;
  // Packed: row r gathers its padded position token_index[r]; rows past T are left alone.
  const int64_t rows = l.packed() ? l.cu_seqlens[l.batch] : static_cast<int64_t>(l.batch) * seq;
  parallel_for(rows, rows * hidden, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = l.packed() ? l.token_index[r] : r;
      const int64_t bi = t / seq, s = t % seq;
      unsigned char* row = dst + r * hidden * e;
      for (int h = 0; h < heads; ++h) {
        std::memcpy(row + h * head_bytes, src + ((bi * heads + h) * seq + s) * head_bytes,
                    head_bytes);
      }
    }
  });
}

// Rotates each head's (c, c + d/2) column pairs of Q and K by the angles of the row's position
// (transformers' rotate_half convention); V is read and written back unchanged.
void CpuBackend::rotary_embedding(DType dt, void* qkv,    // [rows, 3H]
                                  const float* rotary,     // [P, d]: cos | sin
                                  const SequenceLayout& l, int heads, int head_dim,
                                  const void* bias,  // [3H] or null
                                  const RotaryDynamic& dynamic) {
  require_cpu_dtype(dt, "rotary_embedding");
  FTBERT_CHECK(head_dim % 2 == 0, "rotary_embedding: head dim " << head_dim << " is odd");
  FTBERT_CHECK(!dynamic.on() || l.packed(),
               "rotary_embedding: dynamic rope scaling needs a packed layout");
  const int hidden = heads * head_dim, half = head_dim / 2;
  const cpu::Floats qk_bias(dt, bias, bias != nullptr ? 2 * hidden : 0);  // Q's and K's parts
  const int64_t seq = l.max_seq;
  const int64_t rows = l.packed() ? l.cu_seqlens[l.batch] : static_cast<int64_t>(l.batch) * seq;
  parallel_for(rows, rows * 2 * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(1, 3 * hidden + head_dim);
    float* turned = buf + 3 * hidden;  // a scaled sequence's cos | sin at this row's position
    for (int64_t r = begin; r < end; ++r) {
      const int64_t token = l.packed() ? l.token_index[r] : r;
      const int64_t pos = token % seq;
      const float* cos = rotary + pos * head_dim;
      if (dynamic.on()) {
        const int extent = l.sequence_extent(static_cast<int>(token));
        if (extent > dynamic.original) {
          const float* inv = dynamic.inv_freq + static_cast<int64_t>(extent - dynamic.original - 1) * half;
          for (int c = 0; c < half; ++c) {
            const float angle = static_cast<float>(pos) * inv[c];
            turned[c] = std::cos(angle);
            turned[half + c] = std::sin(angle);
          }
          cos = turned;
        }
      }
      const float* sin = cos + half;
      float* row = cpu::load_row(dt, qkv, r, 3 * hidden, buf);
      if (bias != nullptr) {
        for (int c = 0; c < 2 * hidden; ++c) row[c] += qk_bias.data()[c];
      }
      for (int h = 0; h < 2 * heads; ++h) {  // Q's heads, then K's
        float* x = row + h * head_dim;
        for (int c = 0; c < half; ++c) {
          const float x1 = x[c], x2 = x[c + half];
          x[c] = x1 * cos[c] - x2 * sin[c];
          x[c + half] = x2 * cos[c] + x1 * sin[c];
        }
      }
      cpu::store_row(dt, qkv, r, 3 * hidden, row);
    }
  });
}

// ---- fused ----------------------------------------------------------------------------------
namespace cpu {
int64_t attention_scratch_floats(int n_keys, int head_dim) {
  (void)n_keys;  // keys are taken in blocks of a fixed size
  // kernels_impl.h's layout: keys and values of a block, queries, one score tile, sums, max/sum.
  const int64_t d = head_dim, dp = (d + 31) / 32 * 32, keys = 256, q = kAttentionQueries;
  return d * keys + keys * dp + q * d + 64 * keys + q * dp + 2 * q;
}
}  // namespace cpu

bool CpuBackend::supports_attention(AttentionKind kind, DType dt, int head_dim) const {
  return attention_unsupported_reason(kind, dt, head_dim).empty();
}

std::string CpuBackend::attention_unsupported_reason(AttentionKind kind, DType dt,
                                                     int head_dim) const {
  const std::string dtype_reason = cpu_dtype_unsupported_reason(dt);
  if (!dtype_reason.empty()) return dtype_reason;
  if (head_dim < 1) return "head dim " + std::to_string(head_dim) + " is not positive";
  (void)kind;  // both kinds run every head dim
  return "";
}

// Tiles of (sequence, head, up to 256 queries), spread over the pool. Each tile reads its queries,
// keys and values straight from the QKV GEMM output (adding the bias as it reads them), keeps its
// scores in a [64, 256]-key tile and writes its rows of the merged-heads output. Padded,
// the keys are a sequence's attended positions and every position is a query (padding rows get
// the same attention over the real keys as the unfused path gives them); packed, a sequence's
// rows are both and no padding is touched.
void CpuBackend::flash_attention(DType dt, const void* qkv,  // [rows, 3H], bias not yet added
                                 const void* qkv_bias,        // [3H]
                                 void* out,                   // [rows, H]
                                 const SequenceLayout& l, int heads, int head_dim, float scale,
                                 const AttentionOptions& options) {
  require_cpu_dtype(dt, "flash_attention");
  FTBERT_CHECK(head_dim >= 1, "flash_attention: head dim " << head_dim << " is not positive");
  FTBERT_CHECK(!options.has_relative_bias() || options.relative_span >= l.max_seq,
               "flash_attention: relative bias span " << options.relative_span
                                                      << " is shorter than the sequence "
                                                      << l.max_seq);
  const int B = l.batch, S = l.max_seq, H = heads * head_dim;
  // bfloat16: the kernel reads the rows' bits, widening them as a tile gathers them, and rounds
  // each output row once; no float32 copy of Q|K|V or of the output.
  const bool bf16 = dt == DType::kBFloat16;
  const cpu::Floats bias(dt, qkv_bias, 3 * H);
  const auto* qkv16 = bf16 ? static_cast<const uint16_t*>(qkv) : nullptr;
  auto* out16 = bf16 ? static_cast<uint16_t*>(out) : nullptr;
  const float* in = bf16 ? nullptr : static_cast<const float*>(qkv);
  float* o = bf16 ? nullptr : static_cast<float*>(out);
  // Per sequence: its query rows (all of them) and its key rows, in qkv's row numbering, and
  // (with a relative bias or a window) their positions in the padded row.
  std::vector<int32_t> queries, keys, query_pos, key_pos;
  const bool positions = options.has_relative_bias() || options.window > 0 || options.has_terms();
  // The disentangled terms, widened to float32 where they are bfloat16.
  const DisentangledTerms& terms = options.terms;
  const int64_t term_elems = static_cast<int64_t>(heads) * terms.rows * terms.width;
  const cpu::Floats c2p(dt, terms.c2p, terms.c2p != nullptr ? term_elems : 0);
  const cpu::Floats p2c(dt, terms.p2c, terms.p2c != nullptr ? term_elems : 0);
  FTBERT_CHECK(!options.has_terms() || terms.rows == l.rows,
               "flash_attention: disentangled terms for " << terms.rows << " rows, the layout has "
                                                          << l.rows);
  std::vector<int64_t> q_begin(B + 1), k_begin(B + 1);
  queries.reserve(static_cast<size_t>(B) * S);
  keys.reserve(static_cast<size_t>(B) * S);
  for (int b = 0; b < B; ++b) {
    q_begin[b] = static_cast<int64_t>(queries.size());
    k_begin[b] = static_cast<int64_t>(keys.size());
    if (l.packed()) {
      for (int32_t r = l.cu_seqlens[b]; r < l.cu_seqlens[b + 1]; ++r) {
        queries.push_back(r);
        keys.push_back(r);
        if (positions) {
          query_pos.push_back(l.token_index[r] - b * S);
          key_pos.push_back(l.token_index[r] - b * S);
        }
      }
    } else {
      for (int s = 0; s < S; ++s) {
        const int32_t r = b * S + s;
        queries.push_back(r);
        if (l.mask[r] != 0) keys.push_back(r);
        if (positions) {
          query_pos.push_back(s);
          if (l.mask[r] != 0) key_pos.push_back(s);
        }
      }
    }
  }
  q_begin[B] = static_cast<int64_t>(queries.size());
  k_begin[B] = static_cast<int64_t>(keys.size());
  // Tiles: (b, h, query block) in that order.
  struct Tile { int b, h; int64_t q0; int nq; };
  std::vector<Tile> tiles;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int64_t q0 = q_begin[b]; q0 < q_begin[b + 1]; q0 += cpu::kAttentionQueries) {
        const int nq = static_cast<int>(std::min<int64_t>(cpu::kAttentionQueries, q_begin[b + 1] - q0));
        tiles.push_back({b, h, q0, nq});
      }
    }
  }
  const auto kernel = cpu::kernels().attention;
  const int64_t scratch_floats = cpu::attention_scratch_floats(S, head_dim);
  const int64_t work = static_cast<int64_t>(queries.size()) * S * H;
  cpu::parallel_for(static_cast<int64_t>(tiles.size()), work, [&](int64_t begin, int64_t end) {
    // Grown once per thread and kept: a forward allocates nothing here after the first.
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < scratch_floats) scratch.resize(scratch_floats);
    for (int64_t i = begin; i < end; ++i) {
      const Tile& t = tiles[i];
      const int hd = t.h * head_dim;
      cpu::AttentionTile a;
      if (bf16) {
        a.q16 = qkv16 + hd;
        a.k16 = qkv16 + H + hd;
        a.v16 = qkv16 + 2 * H + hd;
        a.out16 = out16 + hd;
      } else {
        a.q = in + hd;
        a.k = in + H + hd;
        a.v = in + 2 * H + hd;
        a.out = o + hd;
      }
      a.ld = 3 * H;
      a.q_bias = bias.data() + hd;
      a.k_bias = bias.data() + H + hd;
      a.v_bias = bias.data() + 2 * H + hd;
      a.query_rows = queries.data() + t.q0;
      a.key_rows = keys.data() + k_begin[t.b];
      a.n_queries = t.nq;
      a.n_keys = static_cast<int>(k_begin[t.b + 1] - k_begin[t.b]);
      a.head_dim = head_dim;
      a.scale = scale;
      a.ldo = H;
      if (positions) {
        a.query_pos = query_pos.data() + t.q0;
        a.key_pos = key_pos.data() + k_begin[t.b];
        a.window = options.window;
      }
      if (options.has_terms()) {
        const int64_t head = static_cast<int64_t>(t.h) * terms.rows * terms.width;
        if (terms.c2p != nullptr) a.c2p = c2p.data() + head;
        if (terms.p2c != nullptr) a.p2c = p2c.data() + head;
        a.term_width = terms.width;
        a.term_column = terms.column;
        a.term_first = terms.first;
      }
      if (options.has_relative_bias()) {
        a.relative_bias = options.relative_bias +
                          static_cast<int64_t>(t.h) * (2 * options.relative_span - 1) +
                          options.relative_span - 1;
      }
      kernel(a, scratch.data());
    }
  });
}

}  // namespace ftbert
