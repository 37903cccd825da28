// Embeddings on the CPU: word + position + token-type lookup, then LayerNorm, one row per token;
// or the word row alone and its RMSNorm (pre-RMSNorm models).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace ftbert {

using cpu::parallel_for;

void CpuBackend::embed_layernorm(DType dt, const int32_t* input_ids,  // [B, S]; [T] ids_packed
                                 const int32_t* token_type_ids,       // as input_ids
                                 const void* word,                    // [V, H]
                                 const void* position,                // [P, H]
                                 const void* token_type,              // [T, H]
                                 const void* gamma, const void* beta,  // [H]
                                 void* out,                            // [rows, H]
                                 const SequenceLayout& l, int hidden, int vocab, int type_vocab,
                                 float eps, int position_pad_id, void* out_codes) {
  FTBERT_CHECK(out_codes == nullptr, "embed_layernorm: the CPU writes no quantized rows");
  require_cpu_dtype(dt, "embed_layernorm");
  const int64_t seq = l.max_seq;
  // The position of every input first (a running count per sequence), so that the parallel rows
  // below need no prefix scans and packing cannot change a position. Inputs are indexed by their
  // padded position b·S + s, or by their row when they came packed.
  const auto first = [&](int64_t b) { return l.ids_packed ? l.cu_seqlens[b] : b * seq; };
  const auto length = [&](int64_t b) { return l.ids_packed ? l.cu_seqlens[b + 1] - l.cu_seqlens[b] : seq; };
  std::vector<int64_t> pos(l.ids_packed ? l.cu_seqlens[l.batch] : l.batch * seq);
  for (int64_t b = 0; b < l.batch; ++b) {
    int64_t counted = 0;
    for (int64_t s = 0; s < length(b); ++s) {
      const int64_t i = first(b) + s;
      if (position_pad_id < 0) {
        pos[i] = s;
      } else {
        const bool real = input_ids[i] != position_pad_id;
        counted += real;
        pos[i] = real ? position_pad_id + counted : position_pad_id;
      }
    }
  }
  const int64_t rows = l.rows;
  const cpu::Floats g(dt, gamma, hidden), be(dt, beta, hidden);
  const std::vector<float> no_position(position == nullptr ? hidden : 0, 0.0f);
  const auto kernel = cpu::kernels().sum3_layernorm;
  parallel_for(rows, rows * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(4, hidden);  // the three table rows and the output
    for (int64_t r = begin; r < end; ++r) {
      const int64_t token = l.packed() ? l.token_index[r] : r;
      if (token < 0) {  // a row past the tokens of a packed batch: zeros (all bits clear in any dtype)
        std::memset(cpu::element(dt, out, r * hidden), 0, hidden * dtype_size(dt));
        continue;
      }
      const int64_t i = l.ids_packed ? r : token;
      // Values are checked by the Python API; clamping keeps any other caller memory-safe.
      const int64_t id = std::min<int64_t>(std::max<int32_t>(input_ids[i], 0), vocab - 1);
      const int64_t tt = std::min<int64_t>(std::max<int32_t>(token_type_ids[i], 0), type_vocab - 1);
      const int64_t s = pos[i];
      float* o = cpu::out_row(dt, out, r, hidden, buf + 3 * hidden);
      kernel(cpu::load_row(dt, word, id, hidden, buf),
             position != nullptr ? cpu::load_row(dt, position, s, hidden, buf + hidden)
                                 : no_position.data(),
             cpu::load_row(dt, token_type, tt, hidden, buf + 2 * hidden), g.data(), be.data(), o,
             hidden, eps);
      cpu::store_row(dt, out, r, hidden, o);
    }
  });
}

void CpuBackend::embed_rmsnorm(DType dt, const int32_t* input_ids,  // [B, S]; [T] ids_packed
                               const void* word,                    // [V, H]
                               const void* gamma,                   // [H]
                               void* embedded,                      // [rows, H]
                               void* out,                           // [rows, H]
                               const SequenceLayout& l, int hidden, int vocab, float eps) {
  require_cpu_dtype(dt, "embed_rmsnorm");
  const int64_t rows = l.rows;
  const size_t row_bytes = hidden * dtype_size(dt);
  const cpu::Floats g(dt, gamma, hidden);
  parallel_for(rows, rows * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(2, hidden);  // the word row and the output
    for (int64_t r = begin; r < end; ++r) {
      const int64_t token = l.packed() ? l.token_index[r] : r;
      if (token < 0) {  // as embed_layernorm: a row past the tokens of a packed batch is zeros
        std::memset(cpu::element(dt, embedded, r * hidden), 0, row_bytes);
        std::memset(cpu::element(dt, out, r * hidden), 0, row_bytes);
        continue;
      }
      const int64_t i = l.ids_packed ? r : token;
      // Values are checked by the Python API; clamping keeps any other caller memory-safe.
      const int64_t id = std::min<int64_t>(std::max<int32_t>(input_ids[i], 0), vocab - 1);
      // The table's row bit for bit: the residual stream starts from it.
      std::memcpy(cpu::element(dt, embedded, r * hidden),
                  static_cast<const unsigned char*>(word) + id * row_bytes, row_bytes);
      float* o = cpu::out_row(dt, out, r, hidden, buf + hidden);
      cpu::rmsnorm_row(cpu::load_row(dt, word, id, hidden, buf), g.data(), o, hidden, eps);
      cpu::store_row(dt, out, r, hidden, o);
    }
  });
}

}  // namespace ftbert
