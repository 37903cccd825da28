// The CPU ops' inner loops, compiled once per instruction set (kernels_impl.h is included by
// kernels_baseline.cpp, kernels_avx2.cpp, kernels_avx512.cpp and kernels_avx512_bf16.cpp with
// different compiler flags)
// and picked at run time by kernels() from cpu::isa(). The ops in cpp/cpu/<family>.cpp do the
// layout and threading and call these on one row or one tile at a time.
#pragma once

#include <cstdint>

#include "ftbert/config.h"

namespace ftbert::cpu {

// One attention head over up to kAttentionQueries queries: out[i] = softmax(scale · q_i · Kᵀ) V
// over the listed keys, flash style (keys in blocks of 256, a running max and sum; no score matrix
// beyond one [64 queries, 256 keys] tile).
struct AttentionTile {
  const float* q;        // query row i at q + query_rows[i] * ld (this head's d columns)
  const float* k;        // key row j at k + key_rows[j] * ld
  const float* v;        // value row j at v + key_rows[j] * ld
  int64_t ld;            // row stride of q, k, v (3H)
  const float* q_bias;   // [d]
  const float* k_bias;   // [d]
  const float* v_bias;   // [d]
  const int32_t* query_rows;  // [n_queries]
  const int32_t* key_rows;    // [n_keys]
  int n_queries, n_keys, head_dim;
  float scale;
  float* out;            // query row i's output at out + query_rows[i] * ldo
  int64_t ldo;           // row stride of out (H)
  // A relative position bias (AttentionOptions): query i and key j's scaled score gets
  // relative_bias[key_pos[j] - query_pos[i]]; this head's row of the table, offset by span − 1.
  // Null: none.
  const float* relative_bias = nullptr;
  // > 0: key j attends query i only where |key_pos[j] − query_pos[i]| <= window.
  int window = 0;
  // DeBERTa's disentangled terms (DisentangledTerms, this head's tables): query row r and key
  // row r' at distance δ = query_pos − key_pos add, before the scale,
  // c2p[r · term_width + col] + p2c[r' · term_width + col], col = term_column[δ] − term_first.
  const float* c2p = nullptr;
  const float* p2c = nullptr;
  int term_width = 0;
  const int32_t* term_column = nullptr;
  int term_first = 0;
  // With a bias, a window or the terms: positions in the padded row, ascending (as the rows are).
  const int32_t* query_pos = nullptr;  // [n_queries]
  const int32_t* key_pos = nullptr;    // [n_keys]
  // bfloat16 rows (their bits) in place of q, k, v and out, where q16 is set: read widened
  // (exactly) as the tile gathers them, each output row rounded once, the sums float32. With
  // AVX512-BF16 and head dims a multiple of 16 (no bias table, window or terms) the two products
  // run on bfloat16 pairs instead: the biased, scaled query and the probabilities are rounded to
  // bfloat16 first (kernels_impl.h, attention_bf16_dots).
  const uint16_t* q16 = nullptr;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  uint16_t* out16 = nullptr;
};

// The width of a packed weight panel (CpuBackend::upload_weight): W [k, n] is kept as ceil(n / 16)
// panels of [k, 16] floats, each row of a panel contiguous, zeros past column n. The same on every
// instruction set, so the packing does not depend on the ISA picked at run time.
constexpr int kGemmPanel = 16;
// The int8 panels' k in groups of 4, padded to a multiple of this many groups (64 values: an AMX
// tile's row), and the rows of a panel_gemm_s8 input padded to a multiple of kS8RowPad (two AMX
// tiles of 16 rows).
constexpr int kS8KGroups = 16;
constexpr int kS8RowPad = 32;

struct Kernels {
  // x[c] = act(x[c] + bias[c]) for c < n.
  void (*bias_activation)(float* x, const float* bias, int n, Activation act);
  // out = LayerNorm(a + b + c) · gamma + beta over n values; out may be a.
  void (*sum3_layernorm)(const float* a, const float* b, const float* c, const float* gamma,
                         const float* beta, float* out, int n, float eps);
  // In place: row = softmax(scale · row) over the keys with mask[j] != 0 (mask may be null: all);
  // zeros when no key is attended.
  void (*masked_softmax)(float* row, const int32_t* mask, int n, float scale);
  // Runs one tile; `scratch` holds attention_scratch_floats(n_keys, head_dim) floats.
  void (*attention)(const AttentionTile& tile, float* scratch);
  // c[i, j] = act(Σ_p a[i, p] · panel[p, j] + bias[j]) for rows i < m and columns j < cols
  // (<= kGemmPanel) of one packed panel [k, kGemmPanel]; a's rows have stride lda, c's ldc. bias
  // (cols floats) may be null: no bias, no activation.
  void (*panel_gemm)(const float* a, int64_t lda, const float* panel, int k, float* c,
                     int64_t ldc, int m, int cols, const float* bias, Activation act);
  // n bfloat16 values (their bits) to float32, exactly; n float32 values to bfloat16, rounded to
  // nearest even (NaN stays NaN, values past bfloat16's range become ±inf).
  void (*widen_bf16)(const uint16_t* in, float* out, int n);
  void (*narrow_bf16)(const float* in, uint16_t* out, int n);
  // panel_gemm over bfloat16: a and c bfloat16, the panel in upload_weight's bfloat16 layout
  // ([ceil(k / 2), kGemmPanel, 2]: rows p and p + 1 interleaved, a zero row past an odd k),
  // float32 accumulation, bias (float32) and activation, c rounded once; cols may reach
  // 2·kGemmPanel, the columns past kGemmPanel then the next panel's (it follows at panel +
  // ceil(k / 2)·2·kGemmPanel). AMX-BF16's tiles where the CPU has them (k a multiple of 32), else
  // AVX512-BF16's dot product. Null where the instruction set has neither (every table but
  // avx512_bf16's).
  void (*panel_gemm_bf16)(const uint16_t* a, int64_t lda, const uint16_t* panel, int k,
                          uint16_t* c, int64_t ldc, int m, int cols, const float* bias,
                          Activation act);
  // The int8 weight GEMM (quantization "int8"): c[i, j] = act((S[i, j] · a_scale[i] + a_min[i] ·
  // w_sums[j]) · w_scale[j] + bias[j]) for rows i < m and columns j < cols, S[i, j] = Σ_p a[i, p] ·
  // panel[p, j] summed exactly in int32 (a row of a stands for a_min + a_scale · a). The panel:
  // [k4, kGemmPanel, 4], column j's values of rows 4q..4q + 3 side by side, zeros past k; cols may
  // reach 2·kGemmPanel, the columns past kGemmPanel then the next panel's (it follows at panel +
  // 4·k4·kGemmPanel). k4 is a multiple of kS8KGroups and a holds round_up(m, kS8RowPad) rows
  // (those past m any values: a tile kernel reads them and drops their results). a: uint8 rows of
  // 4·k4 values, stride lda; w_sums[j] = Σ_p panel[p, j]. The
  // sums being exact, every instruction set's kernel gives the same S. bias may be null: no bias,
  // no activation.
  void (*panel_gemm_s8)(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                        const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4,
                        float* c, int64_t ldc, int m, int cols, const float* bias, Activation act);
  // One row of panel_gemm_s8's a: x [k] as out[p] = round((x[p] - low) / scale) in [0, 255] (to
  // nearest even), scale = (max - min) / 255 and low = min over the row; zeros from k to padded.
  void (*quantize_row_u8)(const float* x, int k, uint8_t* out, int padded, float* scale,
                          float* low);
  // Which panel_gemm_s8 this is: "amx", "vnni", "avx2" or "portable".
  const char* s8_kernel;
  // For benchmarks: `steps` rounds of 12 independent 512-bit bfloat16 dot products (vdpbf16ps, 64
  // floating-point operations each) on registers only, what one thread's bfloat16 GEMM cannot
  // beat; returns a value of the sums so that none is left out. Null without AVX512-BF16.
  float (*bf16_dot_peak)(int64_t steps);
};

// Floats of scratch one attention tile needs (same for every instruction set).
int64_t attention_scratch_floats(int n_keys, int head_dim);
// Queries per attention tile at most: the unit of work the attention op hands to a thread. Each
// block of keys is gathered once per tile, so larger tiles gather less; 256 keeps a tile's state
// ([256, d] queries and sums) within a core's L2 and still gives batch x heads x S/256 tiles.
constexpr int kAttentionQueries = 256;

const Kernels& kernels();

namespace baseline { const Kernels& table(); }
namespace avx2 { const Kernels& table(); }
namespace avx512 { const Kernels& table(); }
namespace avx512_bf16 { const Kernels& table(); }

}  // namespace ftbert::cpu
