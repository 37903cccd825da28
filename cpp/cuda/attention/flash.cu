// Fused attention, FlashAttention-2 style, for BERT encoders:
//   out[b, s, h*d + :] = softmax_j(scale * q_s · k_j, keys with mask[b, j] == 1) · v_j
// with q/k/v read straight from the QKV GEMM output [B, S, 3H] (bias not yet added) and the result
// written in the merged-heads layout [B, S, H] the output GEMM reads: no bias kernel, no score
// matrix in device memory, no transpose kernel.
//
// This file's kernel uses mma.sync and runs on every GPU the build targets. On Hopper (compute
// capability 9.0) head dims 64 and 128 go to flash_sm90.cu instead, the same algorithm on
// warpgroup MMA (wgmma); FTBERT_FLASH_PORTABLE=1 keeps them here.
// Pieces shared by both kernels (fragment layout, online softmax, copies) are in flash_common.cuh.
//
// Algorithm (one thread block per Br query rows of one (batch, head)):
//   - Each warp owns 16 or 32 query rows (one or two 16-row mma tiles). Q (plus its bias) is
//     loaded once into shared memory and, in most configurations, kept in registers as mma A
//     fragments.
//   - K/V tiles of Bc keys are staged in shared memory with 16-byte cp.async, double-buffered, and
//     shared by all warps; one barrier per tile (the next tile's copy is issued right after it,
//     into the buffer the previous tile used). Each warp computes S = Q Kᵀ for its rows with
//     mma.sync m16n8k16 (fp32 accumulation), masks it (only tiles that hold a masked key pay for
//     this), and updates the online softmax: running row max m and row sum l in fp32; when m
//     grows the fp32 accumulator O is rescaled by exp2(m_old - m_new).
//   - P (the exponentiated scores, rounded to fp16/bf16) is reused straight from the S accumulator
//     registers as the A operand of O += P V (V fragments via ldmatrix.trans).
//   - O is divided by l once at the end. A row with no unmasked key has l == 0 and gives zeros.
//   - log2(e) is folded into the scale so every exponential is one exp2 (the SFU's ex2) of an
//     FMA: p = exp2(s * scale * log2(e) - m * scale * log2(e)).
//
// The QKV bias, without a pass over the tiles:
//   - Q: added in fp32 while Q is loaded (once per block), then rounded to the compute dtype, as the
//     unfused path's bias kernel does.
//   - K: q · (k + b_k) = q · k + q · b_k, and q · b_k is the same for every key of a query row, so
//     softmax cancels it exactly; the K bias is never needed.
//   - V: the softmax weights of a row sum to 1, so Σ_j p_j (v_j + b_v) = Σ_j p_j v_j + b_v; b_v is
//     added in fp32 after the division by l (rows with no unmasked key stay zero).
//   K and V tiles are therefore plain asynchronous copies of the GEMM output.
//
// Keys outside [first unmasked key, last unmasked key] of a sequence are skipped tile by tile (the
// range is found on the device from the mask), so left or right padding costs no work; masked keys
// inside the range get -inf. Keys past S are zero-filled (finite V rows, so 0 · V stays 0).
//
// A relative position bias (MPNet; AttentionOptions) is a template bool of the kernel, so the
// kernels without it are unchanged: with it, each key tile's positions are staged next to its key
// bias, each thread holds the positions of its query rows, and the bias of each score is read
// from the head's table (small enough for the read-only cache) in fp32 as the value the score's
// Q·K products accumulate onto, in raw score units (b / scale; relative_bias_scores), so it is in
// place before the mask and the online softmax. Positions are those of the padded row: packed
// batches read them from token_index. On Hopper, flash_sm90.cu's one-warpgroup kernel adds it
// (after the products, add_relative_bias).
//
// DeBERTa's disentangled terms (FlashParams::c2p / p2c, from run_attention's two batched GEMMs)
// are a third template bool (kTerms) on the same positions: a score tile starts from
// c2p[query row][col] + p2c[key row][col], col = column[q_pos − k_pos] − first, read from the
// tables in L2 as the relative bias is, so no [B, heads, S, S] tensor is ever written. The tables
// themselves are [heads, rows, width] (width ≤ 2·span; the columns the batch's distances reach).
// At head dim 64 (unless FTBERT_DEBERTA_TERM_TABLES=1), the kernel computes the terms instead
// (kInlineTerms; FlashParams::term_positions, no tables): a block of 64 query rows and a
// tile of 64 keys span 127 distances, whose bucketed relative rows are at most 127 consecutive rows
// (a row per distance or fewer). Per key tile, the tile's keys times those rows' relative queries
// (p2c, 16 keys a warp) and each warp's 16 query rows times the relative keys of its own 79
// distances (c2p) are two more mma products, rounded to the dtype as the tables are and staged in
// shared memory, where each score reads the column of its distance. The relative rows sit in a
// ring: key tiles come in order, so their windows only move down, and each tile copies just the
// rows below the last window. This trades the tables' two products and the scores' reads of them
// from memory for more mma work per key tile (p2c twice the QKᵀ tile's, c2p 1.25 times) and two
// more barriers. Positions that jump (a packed batch whose mask had holes inside a sequence) can
// span more distances than the windows hold: such a tile computes each score's terms alone, from
// the relative rows in memory.
//
// A sliding window (ModernBERT's local layers; AttentionOptions::window = W, 0 < W < S) is another
// template bool (kWindow), with the same positions: key j attends query i only where
// |pos_j − pos_i| <= W. Positions grow with the row, so a block's queries lie in
// [pos(q_first), pos(q_last)] and only keys in [pos(q_first) − W, pos(q_last) + W] can count:
// the block visits only the key tiles holding such keys (SequenceRows::window_key_rows, which
// intersects them with the unmasked range), so a sequence costs O(S·W), not O(S²). Inside that
// range, a warp skips a tile none of whose keys is in the window of any of its rows (every score
// would be masked: it adds nothing), and masks to -inf the scores of a tile only where the tile
// straddles the window's edge for some of its rows (from the tile's first and last key position
// and each thread's first and last query position, voted over the warp); tiles wholly inside
// every row's window are untouched. Rows whose window holds no unmasked key give zeros, as fully
// masked rows do. The key positions are staged per tile beside the key bias, as for the relative
// bias. On Hopper, flash_sm90.cu's one-warpgroup kernel runs a window or a relative bias the same
// way (without the per-warp skip: its products are a warpgroup's; the bias added after them).
//
// Packed batches (cu_seqlens, FlashAttention's varlen): sequence b is rows cu[b]..cu[b+1]-1, every
// one a token; blocks past a sequence's end return at once, so the grid sized for the longest
// sequence costs the short ones nothing. flash_common.cuh's SequenceRows is the only code that
// tells the two layouts apart.
//
// Tile choice (Br query rows x Bc keys per step; 4 warps): "wide" (Br = 128, two 16-row mma tiles
// per warp, so each K/V fragment read from shared memory feeds two mma) where the grid gives at
// least two blocks per SM, else "narrow" (Br = 64, half the work per block for small grids);
// Bc = 64, or 128 for d = 64 wide over more than 256 keys (fewer row-max shuffles, rescales and
// barriers per key; Q is then re-read from shared memory, since holding it would spill); d = 128
// narrow only. Above 48 KiB of shared memory needs the opt-in (cudaFuncSetAttribute).
// Measurements, register and shared-memory budgets, and what was tried: docs/performance.md,
// "Kernel choices".
#include "cuda/attention/flash.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/attention/flash_common.cuh"
#include "cuda/attention/flash_sm90.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "ftbert/check.h"

namespace ftbert::cuda {
namespace {

using namespace flash_detail;

// ---------------------------------------------------------------------------------------------
// kernels
// ---------------------------------------------------------------------------------------------

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i gets
// matrix i's fragment (lane t: row t/4, columns 2(t%4), 2(t%4)+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem))
               : "memory");
}
// The same, each matrix transposed: lane t gets rows 2(t%4), 2(t%4)+1 of column t/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem))
               : "memory");
}

template <int D, int Br, int Bc, int kWarps, int kStages>
struct FlashTile {
  static_assert(D % 16 == 0, "head dim must be a multiple of 16 (mma k)");
  static_assert(Br % (16 * kWarps) == 0, "each warp owns whole 16-row mma tiles");
  static_assert(Bc % 16 == 0, "key tiles are whole mma k-steps of P·V");
  static_assert(kStages >= 2, "at least double buffering");
  static constexpr int kMTiles = Br / (16 * kWarps);  // 16-row mma tiles per warp
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kThreads = kWarps * 32;
  // Shared rows are D + 8 elements: the 16 extra bytes move each row to the next 16-byte bank
  // group, so the 8 row addresses of every ldmatrix phase hit 8 different groups (row lengths of
  // 64/128/256 bytes would otherwise all start in the same banks).
  static constexpr int kStride = D + 8;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kQElems = Br * kStride;
  static constexpr int kKVElems = Bc * kStride;
  // sQ [Br][kStride] | sK [kStages][Bc][kStride] | sV [kStages][Bc][kStride] |
  // key bias [kStages][Bc] fp32 | with a relative bias or a window: key positions [kStages][Bc]
  // int32
  static constexpr size_t smem_bytes(size_t elem, bool key_positions) {
    return (kQElems + 2 * kStages * kKVElems) * elem + kStages * Bc * sizeof(float) +
           (key_positions ? kStages * Bc * sizeof(int32_t) : 0);
  }
};

// The inline terms' shared memory (kInlineTerms; see the file comment), after FlashTile's:
//   relative queries and keys, each a ring of kRing rows [kRing][kStride] | p2c [Bc][kP2CStride] |
//   c2p per warp [kWarps][16][kC2PStride] | the row of each distance [kRows] int32.
template <int D, int Br, int Bc, int kWarps>
struct InlineTermsTile {
  // The block's Br + Bc - 1 distances reach at most that many relative rows (the bucketed row of
  // a distance grows by 0 or 1 per step); a warp's 16 + Bc - 1.
  static constexpr int kRows = Br + Bc;
  static constexpr int kRing = kRows;  // a power of two (the kernel checks)
  static constexpr int kWarpCols = (16 + Bc - 1 + 15) / 16 * 16;
  static constexpr int kStride = D + 8;
  static constexpr int kP2CStride = kRows + 8;
  static constexpr int kC2PStride = kWarpCols + 8;
  static constexpr size_t smem_bytes(size_t elem) {
    return (2 * kRing * kStride + Bc * kP2CStride + kWarps * 16 * kC2PStride) * elem +
           kRows * sizeof(int32_t);
  }
};

// DeBERTa's terms of a 16-row score tile, in raw score units: this thread's query rows r (their
// c2p rows q_terms[r], positions q_pos[r]) against the tile's keys k0 + 8j + quad_col (+1): their
// positions from key_pos, their p2c rows from k_terms (this head's table at the sequence's row 0;
// keys past the sequence read its last row, their scores are masked anyway).
template <typename T, int kBlocks>
__device__ __forceinline__ void disentangled_term_scores(float (&s)[kBlocks][4],
                                                         const T* const (&q_terms)[2],
                                                         const T* k_terms, const int (&q_pos)[2],
                                                         const int* key_pos, int k0, int len,
                                                         int quad_col, const FlashParams& p) {
  const int width = p.term_width;
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const int2 kp = *reinterpret_cast<const int2*>(key_pos + 8 * j + quad_col);
    const int key0 = min(k0 + 8 * j + quad_col, len - 1);
    const int key1 = min(k0 + 8 * j + quad_col + 1, len - 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int c0 = __ldg(p.term_column + (q_pos[r] - kp.x)) - p.term_first;
      const int c1 = __ldg(p.term_column + (q_pos[r] - kp.y)) - p.term_first;
      float a0 = 0.0f, a1 = 0.0f;
      if (q_terms[r] != nullptr) {
        a0 += static_cast<float>(q_terms[r][c0]);
        a1 += static_cast<float>(q_terms[r][c1]);
      }
      if (k_terms != nullptr) {
        a0 += static_cast<float>(k_terms[static_cast<int64_t>(key0) * width + c0]);
        a1 += static_cast<float>(k_terms[static_cast<int64_t>(key1) * width + c1]);
      }
      s[j][2 * r] = a0;
      s[j][2 * r + 1] = a1;
    }
  }
}

// kRelBias: add p.relative_bias; kWindow: attend within p.window positions; kTerms: DeBERTa's
// disentangled terms from their tables; kInlineTerms: the same terms computed here (see the file
// comment).
template <typename T, int D, int Br, int Bc, int kWarps, int kMinBlocks, int kStages, bool kQRegs,
          bool kRelBias, bool kWindow, bool kTerms, bool kInlineTerms>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) flash_attention_kernel(FlashParams p) {
  begin_dependent_kernel();
  using Tile = FlashTile<D, Br, Bc, kWarps, kStages>;
  using Terms = InlineTermsTile<D, Br, Bc, kWarps>;
  constexpr int kM = Tile::kMTiles;
  static_assert(!kInlineTerms || (kQRegs && !kRelBias && !kWindow && !kTerms),
                "the inline terms take Q from registers, alone");
  static_assert(!kInlineTerms || (Br == 16 * kWarps && (Terms::kRing & (Terms::kRing - 1)) == 0),
                "the inline terms: one 16-row tile a warp, a ring indexed by a mask");
  // All four read the padded positions of the query rows and of each key tile.
  constexpr bool kPositions = kRelBias || kWindow || kTerms || kInlineTerms;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kStride = Tile::kStride;
  constexpr int kChunks = Tile::kChunks;
  constexpr float kNegInf = -__builtin_huge_valf();

  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);     // [Br][kStride]
  T* sK = sQ + Tile::kQElems;             // [kStages][Bc][kStride]
  T* sV = sK + kStages * Tile::kKVElems;  // [kStages][Bc][kStride]
  // [kStages][Bc]: 0 or -inf
  float* sKeyBias = reinterpret_cast<float*>(sV + kStages * Tile::kKVElems);
  // [kStages][Bc]: the keys' padded positions (kPositions only)
  int* sKeyPos = reinterpret_cast<int*>(sKeyBias + kStages * Bc);
  // kInlineTerms (InlineTermsTile): relative query and key rows, products, distances' rows.
  T* sRelQ = reinterpret_cast<T*>(sKeyPos + kStages * Bc);
  T* sRelK = sRelQ + Terms::kRing * Terms::kStride;
  T* sP2C = sRelK + Terms::kRing * Terms::kStride;
  T* sC2P = sP2C + Bc * Terms::kP2CStride;
  int* sCol = reinterpret_cast<int*>(sC2P + kWarps * 16 * Terms::kC2PStride);
  __shared__ int sRange[kWarps][2];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int q0 = blockIdx.x * Br;
  const SequenceRows<T, D> seq(p, blockIdx.z, blockIdx.y);
  if (q0 >= seq.len) return;  // past this sequence's end (packed batches); uniform per block
  const float scale_log2 = p.scale_log2;

  int t_begin, t_end;
  if constexpr (kWindow) {
    seq.template key_tiles<kThreads, Bc, true>(&sRange[0][0], t_begin, t_end, q0,
                                               min(q0 + Br, seq.len) - 1, p.window);
  } else {
    seq.template key_tiles<kThreads, Bc>(&sRange[0][0], t_begin, t_end);
  }

  // ---- loads ---------------------------------------------------------------------------------
  auto q_at = [&](int row, int chunk) { return sQ + row * kStride + chunk * 8; };
  // Loads key tile `tile` into buffer `buf`; returns whether this thread wrote a masked key.
  auto load_kv = [&](int tile, int buf) {
    T* dk = sK + buf * Tile::kKVElems;
    T* dv = sV + buf * Tile::kKVElems;
    const bool masked = seq.template load_kv<Bc, kThreads>(
        tile * Bc, [&](int row, int chunk) { return dk + row * kStride + chunk * 8; },
        [&](int row, int chunk) { return dv + row * kStride + chunk * 8; }, sKeyBias + buf * Bc);
    // Visible to every warp at the same barrier as the key bias.
    if constexpr (kPositions) {
      seq.template key_positions<Bc, kThreads>(tile * Bc, sKeyPos + buf * Bc);
    }
    return masked;
  };

  // Groups in flight: Q, then one per key tile; kStages - 1 key tiles are loaded ahead. Every
  // stage commits a group, empty or not, so the wait counts stay uniform.
  // bit `buf`: this thread's key-bias entries of that buffer hold a masked key.
  int masked_bits = 0;
  seq.template load_q<Br, kThreads>(q0, q_at);
  cp_async_commit();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (t_begin + i < t_end) masked_bits |= (load_kv(t_begin + i, i) ? 1 : 0) << i;
    cp_async_commit();
  }
  // Loads tile `tile` (if it exists) into buffer `buf` and commits its group.
  auto refill = [&](int tile, int buf) {
    if (tile < t_end) {
      masked_bits = (masked_bits & ~(1 << buf)) | ((load_kv(tile, buf) ? 1 : 0) << buf);
    }
    cp_async_commit();
  };
  auto next_buf = [](int buf) { return buf + 1 == kStages ? 0 : buf + 1; };

  // Q + bias, by the thread that copied each chunk.
  cp_async_wait<kStages - 1>();
  seq.template add_q_bias<Br, kThreads>(q_at);
  __syncthreads();

  // This warp's rows: warp_row0 + 16m + {g, g + 8} for m-tile m, g = lane / 4.
  const int warp_row0 = warp * Tile::kWarpRows;
  // Q as A fragments, one per m-tile and 16-wide k-step: lanes 0-15 address rows 0-15 at column
  // k, lanes 16-31 the same rows at column k+8 -> a0..a3 = (rows 0-7 | 8-15) x (cols k | k+8).
  // Kept in registers (kQRegs) or re-read from shared memory for every key tile.
  const T* q_lane = sQ + (warp_row0 + lane % 16) * kStride + (lane / 16) * 8;
  uint32_t qf[kQRegs ? kM : 1][kQRegs ? D / 16 : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        ldmatrix_x4(qf[m][kk], q_lane + 16 * m * kStride + kk * 16);
      }
    }
  }

  // Thread (g = lane/4, c = lane%4) holds rows g and g+8 of each m-tile; accumulator o[m][n]
  // covers columns 8n + 2c, 8n + 2c + 1 of both rows (index 0,1: row g; 2,3: row g+8).
  float o[kM][D / 8][4];
  float row_max[kM][2];  // raw scores (before scale); -inf until a row sees an unmasked key
  float row_sum[kM][2];  // this thread's columns only; summed over the quad at the end
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
    row_max[m][0] = row_max[m][1] = kNegInf;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }

  // ldmatrix lane offsets (elements) inside a tile:
  //  K (non-transposed B of S = Q·Kᵀ, key rows): lanes 0-7 keys 0-7 @ d, 8-15 keys 0-7 @ d+8,
  //    16-23 keys 8-15 @ d, 24-31 keys 8-15 @ d+8 -> {b0, b1} of key block n, then of n+1.
  //  V (transposed B of O = P·V, key rows): lanes 0-15 keys 0-15 @ col, 16-31 @ col+8
  //    -> {b0, b1} of column block n, then of n+1.
  const int k_lane = ((lane % 8) + (lane / 16) * 8) * kStride + ((lane / 8) % 2) * 8;
  const int v_lane = (lane % 16) * kStride + (lane / 16) * 8;
  const int quad_col = 2 * (lane % 4);
  // kPositions: the padded positions of this thread's query rows (rows past the sequence take its
  // last row's, to stay inside the bias table).
  int q_pos[kPositions ? kM : 1][2];
  if constexpr (kPositions) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int q = q0 + warp_row0 + 16 * m + lane / 4 + 8 * r;
        q_pos[m][r] = seq.position(min(q, seq.len - 1));
      }
    }
  }

  // kTerms: this head's c2p rows of this thread's query rows, and its p2c table at the
  // sequence's row 0.
  const T* q_terms[kTerms ? kM : 1][2] = {};
  const T* k_terms = nullptr;
  if constexpr (kTerms) {
    const int64_t head = static_cast<int64_t>(blockIdx.y) * p.term_rows + seq.row0;
    if (p.c2p != nullptr) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int q = min(q0 + warp_row0 + 16 * m + lane / 4 + 8 * r, seq.len - 1);
          q_terms[m][r] = static_cast<const T*>(p.c2p) + (head + q) * p.term_width;
        }
      }
    }
    if (p.p2c != nullptr) k_terms = static_cast<const T*>(p.p2c) + head * p.term_width;
  }

  // Scores of one key tile: s[m][j] is key block j (keys 8j..8j+7) of m-tile m, C layout.
  using Scores = float[kM][Bc / 8][4];

  // S = Q Kᵀ for the key tile in buffer `buf`. Each K fragment serves every m-tile of the warp.
  // kRelBias: S starts from the relative bias instead of zeros; the bias values then live in the
  // score registers the whole time (added after the products, they would need as many registers
  // again, which the wide tiles do not have), and their loads overlap the products.
  auto scores = [&](Scores& s, int buf, int k0) {
    const T* tk = sK + buf * Tile::kKVElems;
    if constexpr (kTerms) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        disentangled_term_scores<T>(s[m], q_terms[m], k_terms, q_pos[m], sKeyPos + buf * Bc, k0,
                                    seq.len, quad_col, p);
      }
    } else if constexpr (kRelBias) {
      // This head's table at distance 0, then shifted by each of this thread's query positions.
      const float* table = p.relative_bias +
                           (static_cast<int64_t>(blockIdx.y) * (2 * p.relative_span - 1) +
                            (p.relative_span - 1));
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const float* const rel_row[2] = {table - q_pos[m][0], table - q_pos[m][1]};
        relative_bias_scores(s[m], rel_row, sKeyPos + buf * Bc, quad_col, p.inv_scale);
      }
    } else {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int j = 0; j < Bc / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qs[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if constexpr (kQRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qs[m][i] = qf[m][kk][i];
        } else {
          ldmatrix_x4(qs[m], q_lane + 16 * m * kStride + kk * 16);
        }
      }
#pragma unroll
      for (int jn = 0; jn < Bc / 16; ++jn) {
        uint32_t kb[4];
        ldmatrix_x4(kb, tk + jn * 16 * kStride + kk * 16 + k_lane);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          Mma<T>::mma(s[m][2 * jn], qs[m], kb[0], kb[1]);
          Mma<T>::mma(s[m][2 * jn + 1], qs[m], kb[2], kb[3]);
        }
      }
    }
  };

  // The online-softmax update with the scores of the key tile in buffer `buf`, then O += P V.
  // window_edge (kWindow): some score of this warp's rows lies outside its window.
  auto accumulate = [&](Scores& s, int buf, bool tile_masked, bool window_edge) {
    // Masked keys (padding, past S) -> -inf; tiles without any skip this.
    if (tile_masked) {
#pragma unroll
      for (int m = 0; m < kM; ++m) add_key_bias(s[m], sKeyBias + buf * Bc, quad_col);
    }
    if constexpr (kWindow) {
      if (window_edge) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          window_mask_scores(s[m], q_pos[m], sKeyPos + buf * Bc, quad_col, p.window);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) online_softmax(s[m], o[m], row_max[m], row_sum[m], scale_log2);

    // O += P V, P straight from the score registers; each V fragment serves every m-tile.
    const T* tv = sV + buf * Tile::kKVElems;
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) weights_fragment<T>(s[m], kk, a[m]);
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, tv + kk * 16 * kStride + nn * 16 + v_lane);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          Mma<T>::mma(o[m][2 * nn], a[m], vb[0], vb[1]);
          Mma<T>::mma(o[m][2 * nn + 1], a[m], vb[2], vb[3]);
        }
      }
    }
  };

  // kInlineTerms: the positions of the block's and this warp's first query rows, and the ring's
  // lowest relative row (none loaded yet). Key tiles come in order, so the relative rows a tile
  // needs only move down: each tile loads the rows below the ring's, into the slots of rows above
  // its window, which no later tile needs.
  // Also how far the block's and any warp's query positions reach: one a row, except for packed
  // rows whose mask had holes.
  int q_first_pos = 0, warp_first_pos = 0, q_span = 0, warp_span = 0;
  int ring_low = 0x7fffffff;
  if constexpr (kInlineTerms) {
    q_first_pos = seq.position(q0);
    warp_first_pos = seq.position(min(q0 + warp_row0, seq.len - 1));
    q_span = seq.position(min(q0 + Br - 1, seq.len - 1)) - q_first_pos;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int first = min(q0 + 16 * w, seq.len - 1), last = min(q0 + 16 * w + 15, seq.len - 1);
      warp_span = max(warp_span, seq.position(last) - seq.position(first));
    }
  }
  const int k_row = (lane % 8) + (lane / 16) * 8;  // k_lane's row and column parts
  const int k_col = ((lane / 8) % 2) * 8;

  // kInlineTerms: copies the relative rows key tile `buf` needs that the ring lacks, and the row
  // of each of its distances, relative to the window's first; returns that first row. Commits a
  // group.
  auto load_term_rows = [&](int buf) -> int {
    if constexpr (kInlineTerms) {
      const int d_min = q_first_pos - sKeyPos[buf * Bc + Bc - 1];
      const int low = __ldg(p.term_column + d_min);
      const int rows = min(ring_low, low + Terms::kRows) - low;
      const T* rel = static_cast<const T*>(p.term_positions) + blockIdx.y * D;
      const int64_t rel_stride = 3 * static_cast<int64_t>(seq.H);
      for (int i = tid; i < rows * kChunks; i += kThreads) {
        const int row = low + i / kChunks, chunk = i % kChunks;
        const T* src = rel + min(row, p.term_position_rows - 1) * rel_stride + chunk * 8;
        const int slot = (row & (Terms::kRing - 1)) * Terms::kStride + chunk * 8;
        const bool valid = row < p.term_position_rows;
        cp_async_16(sRelQ + slot, src, valid);
        cp_async_16(sRelK + slot, src + seq.H, valid);
      }
      cp_async_commit();
      if (tid < Terms::kRows) {
        sCol[tid] = __ldg(p.term_column + min(d_min + tid, p.term_max_distance - 1)) - low;
      }
      ring_low = low;
      return low;
    } else {
      (void)buf;
      return 0;
    }
  };

  // Adds term(key, key's position, r) to each score this thread holds of the first m-tile: rows
  // g and g + 8 (r), two keys in each group of 8.
  auto add_to_scores = [&](Scores& s, const int* key_pos, auto term) {
#pragma unroll
    for (int j = 0; j < Bc / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * j + quad_col + e;
        const int kp = key_pos[key];
#pragma unroll
        for (int r = 0; r < 2; ++r) s[0][j][2 * r + e] += term(key, kp, r);
      }
    }
  };

  // kInlineTerms: adds the terms to the scores of the key tile in buffer `buf`, whose relative
  // rows start at `low`. p2c: the tile's keys (16 a warp) against the window's relative queries,
  // for the whole block; c2p: this warp's query rows against the relative keys of its own
  // distances. Both through shared memory, where each score reads its distance's column.
  auto add_inline_terms = [&](Scores& s, int buf, int low) {
    if constexpr (kInlineTerms) {
      const int* key_pos = sKeyPos + buf * Bc;
      const int k_span = key_pos[Bc - 1] - key_pos[0];
      const int g = lane / 4;
      if (q_span + k_span >= Terms::kRows || warp_span + k_span >= Terms::kWarpCols) {
        // Positions with gaps (a packed batch whose mask had holes) span more distances than the
        // windows hold: each score's terms alone, from the relative rows in memory, rounded to
        // the dtype as the products are. The choice is the whole block's.
        const T* rel = static_cast<const T*>(p.term_positions) + blockIdx.y * D;
        const int64_t rel_stride = 3 * static_cast<int64_t>(seq.H);
        const T* tk = sK + buf * Tile::kKVElems;
        auto dot = [](const T* smem_row, const T* rel_row) {
          float sum = 0.0f;
#pragma unroll
          for (int d = 0; d < D; d += 2) {
            const float2 a = Mma<T>::unpack(*reinterpret_cast<const uint32_t*>(smem_row + d));
            const float2 b =
                Mma<T>::unpack(__ldg(reinterpret_cast<const unsigned int*>(rel_row + d)));
            sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
          }
          return static_cast<float>(static_cast<T>(sum));
        };
        add_to_scores(s, key_pos, [&](int key, int kp, int r) {
          const T* row = rel + __ldg(p.term_column + (q_pos[0][r] - kp)) * rel_stride;
          float add = 0.0f;
          if (p.term_c2p) add += dot(sQ + (warp_row0 + g + 8 * r) * kStride, row + seq.H);
          if (p.term_p2c) add += dot(tk + key * kStride, row);
          return add;
        });
        return;
      }
      cp_async_wait<1>();  // this thread's relative rows (the tile after may still be in flight)
      __syncthreads();     // everyone's, and sCol
      if (p.term_p2c) {
        const T* tk = sK + buf * Tile::kKVElems + (16 * warp + lane % 16) * kStride + (lane / 16) * 8;
        uint32_t kf[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(kf[kk], tk + kk * 16);
#pragma unroll
        for (int part = 0; part < Terms::kRows / 64; ++part) {
          float acc[8][4] = {};
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int jn = 0; jn < 4; ++jn) {
              const int row = (low + 64 * part + 16 * jn + k_row) & (Terms::kRing - 1);
              uint32_t b[4];
              ldmatrix_x4(b, sRelQ + row * Terms::kStride + k_col + kk * 16);
              Mma<T>::mma(acc[2 * jn], kf[kk], b[0], b[1]);
              Mma<T>::mma(acc[2 * jn + 1], kf[kk], b[2], b[3]);
            }
          }
          T* out = sP2C + (16 * warp + g) * Terms::kP2CStride + 64 * part + quad_col;
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            *reinterpret_cast<uint32_t*>(out + 8 * n) = Mma<T>::pack(acc[n][0], acc[n][1]);
            *reinterpret_cast<uint32_t*>(out + 8 * Terms::kP2CStride + 8 * n) =
                Mma<T>::pack(acc[n][2], acc[n][3]);
          }
        }
      }
      // This warp's first distance's row, relative to the window's.
      const int warp_low = sCol[warp_first_pos - q_first_pos];
      T* c2p = sC2P + warp * 16 * Terms::kC2PStride;
      if (p.term_c2p) {
        float acc[Terms::kWarpCols / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
          for (int jn = 0; jn < Terms::kWarpCols / 16; ++jn) {
            const int row = (low + warp_low + 16 * jn + k_row) & (Terms::kRing - 1);
            uint32_t b[4];
            ldmatrix_x4(b, sRelK + row * Terms::kStride + k_col + kk * 16);
            Mma<T>::mma(acc[2 * jn], qf[0][kk], b[0], b[1]);
            Mma<T>::mma(acc[2 * jn + 1], qf[0][kk], b[2], b[3]);
          }
        }
        T* out = c2p + g * Terms::kC2PStride + quad_col;
#pragma unroll
        for (int n = 0; n < Terms::kWarpCols / 8; ++n) {
          *reinterpret_cast<uint32_t*>(out + 8 * n) = Mma<T>::pack(acc[n][0], acc[n][1]);
          *reinterpret_cast<uint32_t*>(out + 8 * Terms::kC2PStride + 8 * n) =
              Mma<T>::pack(acc[n][2], acc[n][3]);
        }
      }
      __syncthreads();  // every warp's p2c rows (and this warp's c2p ones) are in place
      // Score (row, key) at distance δ reads column sCol[δ − δ_min] of both.
      const int d_min = q_first_pos - key_pos[Bc - 1];
      add_to_scores(s, key_pos, [&](int key, int kp, int r) {
        const int col = sCol[q_pos[0][r] - kp - d_min];
        float add = 0.0f;
        if (p.term_c2p) {
          add += static_cast<float>(c2p[(g + 8 * r) * Terms::kC2PStride + col - warp_low]);
        }
        if (p.term_p2c) add += static_cast<float>(sP2C[key * Terms::kP2CStride + col]);
        return add;
      });
    } else {
      (void)s, (void)buf, (void)low;
    }
  };

  int buf = 0;             // buffer of tile t
  int fill = kStages - 1;  // buffer of tile t + kStages - 1 (the one tile t - 1 used)
  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
    // One barrier per tile: every thread's copies of tile t are visible, and every warp is done
    // with tile t - 1, whose buffer is refilled next. It also tells every thread whether this
    // tile has any masked key.
    const bool tile_masked = __syncthreads_or((masked_bits >> buf) & 1) != 0;
    // kInlineTerms: the relative rows go first, so that their group lands before the refill's.
    [[maybe_unused]] int term_low = 0;
    if constexpr (kInlineTerms) term_low = load_term_rows(buf);
    refill(t + kStages - 1, fill);
    if constexpr (kWindow) {
      // Where this tile's keys lie for this warp's rows, decided for the whole warp: wholly
      // outside every row's window (skipped: every score would be masked and add nothing),
      // straddling some row's edge (masked), or inside every row's window. A thread's rows span
      // positions q_pos[0][0] to q_pos[kM - 1][1] (positions grow with the row).
      const int key_first = sKeyPos[buf * Bc];
      const int key_last = sKeyPos[buf * Bc + Bc - 1];  // keys past the sequence: its last key's
      const int row_first = q_pos[0][0], row_last = q_pos[kM - 1][1];
      const bool outside = __all_sync(0xffffffffu, key_first > row_last + p.window ||
                                                       key_last < row_first - p.window);
      const bool edge = __any_sync(0xffffffffu, key_last - row_first > p.window ||
                                                    row_last - key_first > p.window);
      if (!outside) {
        Scores s;
        scores(s, buf, t * Bc);
        accumulate(s, buf, tile_masked, edge);
      }
    } else {
      Scores s;
      scores(s, buf, t * Bc);
      if constexpr (kInlineTerms) add_inline_terms(s, buf, term_low);
      accumulate(s, buf, tile_masked, false);
    }
    buf = next_buf(buf);
    fill = next_buf(fill);
  }

  // ---- epilogue: O / l + b_v, staged through this warp's own Q rows for 16-byte stores -------
  // Only this warp ever reads its rows of sQ; __syncwarp orders its last ldmatrix of them first.
  __syncwarp();
  T* so = sQ + warp_row0 * kStride;
  const int g = lane / 4;
  const T* bias_v = seq.bias + 2 * seq.H;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float inv_sum[2], has_keys[2];
    finish_rows(row_sum[m], inv_sum, has_keys);
    T* rows = so + (16 * m + g) * kStride;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int col = 8 * n + quad_col;
      const float2 bv =
          Mma<T>::unpack(__ldg(reinterpret_cast<const unsigned int*>(bias_v + col)));
      *reinterpret_cast<uint32_t*>(rows + col) =
          Mma<T>::pack(fmaf(o[m][n][0], inv_sum[0], bv.x * has_keys[0]),
                       fmaf(o[m][n][1], inv_sum[0], bv.y * has_keys[0]));
      *reinterpret_cast<uint32_t*>(rows + 8 * kStride + col) =
          Mma<T>::pack(fmaf(o[m][n][2], inv_sum[1], bv.x * has_keys[1]),
                       fmaf(o[m][n][3], inv_sum[1], bv.y * has_keys[1]));
    }
  }
  __syncwarp();
  seq.template store_rows<Tile::kWarpRows>(
      q0 + warp_row0, [&](int row, int chunk) { return so + row * kStride + chunk * 8; }, lane);
}

// ---------------------------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------------------------

// One kernel configuration (see the file comment): head dim, Br x Bc tile, warps, min blocks per
// SM (caps registers so that many blocks share an SM), K/V stages, Q kept in registers.
template <int D_, int Br_, int Bc_, int kWarps_, int kMinBlocks_, int kStages_, bool kQRegs_>
struct FlashConfig {
  static constexpr int D = D_, Br = Br_, Bc = Bc_, kWarps = kWarps_, kMinBlocks = kMinBlocks_,
                       kStages = kStages_;
  static constexpr bool kQRegs = kQRegs_;
};

template <typename T, typename C, bool kRelBias, bool kWindow, bool kTerms = false,
          bool kInlineTerms = false>
void launch_flash_kernel(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  using Tile = FlashTile<C::D, C::Br, C::Bc, C::kWarps, C::kStages>;
  using Terms = InlineTermsTile<C::D, C::Br, C::Bc, C::kWarps>;
  constexpr size_t smem =
      Tile::smem_bytes(sizeof(T), kRelBias || kWindow || kTerms || kInlineTerms) +
      (kInlineTerms ? Terms::smem_bytes(sizeof(T)) : 0);
  auto kernel = flash_attention_kernel<T, C::D, C::Br, C::Bc, C::kWarps, C::kMinBlocks,
                                       C::kStages, C::kQRegs, kRelBias, kWindow, kTerms,
                                       kInlineTerms>;
  static std::atomic<uint64_t> raised_on{0};
  allow_shared_memory(kernel, smem, device, raised_on);
  launch(kernel, flash_grid(p, batch, C::Br), Tile::kThreads, smem, stream, p);
  FTBERT_LAUNCH_CHECK("flash_attention_kernel", stream);
}

// Configuration C, or CWindow for a call with a window (C itself where its windowed kernels fit
// their registers).
template <typename T, typename C, typename CWindow = C>
void launch_flash(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  const bool bias = p.relative_bias != nullptr;
  if (p.c2p != nullptr || p.p2c != nullptr) {  // DeBERTa: no bias table, no window
    launch_flash_kernel<T, C, false, false, true>(p, batch, device, stream);
  } else if (p.window > 0) {
    if (bias) {
      launch_flash_kernel<T, CWindow, true, true>(p, batch, device, stream);
    } else {
      launch_flash_kernel<T, CWindow, false, true>(p, batch, device, stream);
    }
  } else if (bias) {
    launch_flash_kernel<T, C, true, false>(p, batch, device, stream);
  } else {
    launch_flash_kernel<T, C, false, false>(p, batch, device, stream);
  }
}

// Whether `device` is compute capability 9.0 (Hopper: H100, H200), looked up once per device.
bool is_sm90(int device) {
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 no, 2 yes
  if (device < 64) {
    const int v = cached[device].load(std::memory_order_relaxed);
    if (v != 0) return v == 2;
  }
  int major = 0, minor = 0;
  FTBERT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FTBERT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool yes = major == 9 && minor == 0;
  if (device < 64) cached[device].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
}

// FTBERT_FLASH_PORTABLE=1 keeps every head dim on this file's kernel on Hopper too (to compare the
// two kernels, or to rule one out); read at every call, so tests can switch it.
bool portable_forced() {
  const char* v = std::getenv("FTBERT_FLASH_PORTABLE");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// Tile configuration per head dim and shape (see the file comment); every configuration here
// compiles without spills.
template <typename T>
void launch_flash_for_head_dim(const FlashParams& p, int batch, int head_dim,
                               cudaStream_t stream, bool batch_invariant) {
  int device = 0;
  FTBERT_CUDA_CHECK(cudaGetDevice(&device));
#ifdef FTBERT_FLASH_SM90
  // Head dims 64 and 128 on Hopper: the warpgroup-MMA kernels (flash_sm90.cu), with a relative
  // position bias or a sliding window. A call with both stays on this file's kernel, and so do
  // DeBERTa's disentangled terms.
  if ((p.relative_bias == nullptr || p.window == 0) && p.c2p == nullptr && p.p2c == nullptr &&
      p.term_positions == nullptr && flash_sm90_takes(head_dim) &&
      is_sm90(device) && !portable_forced()) {
    launch_flash_sm90<T>(p, batch, head_dim, device, stream, batch_invariant);
    return;
  }
#endif
  // DeBERTa's terms computed here: narrow tiles (a warp's 16 rows keep the c2p products' window
  // small), two blocks an SM (110 KiB of shared memory each), at every grid.
  if (p.term_positions != nullptr) {
    FTBERT_CHECK(head_dim == 64, "flash attention: inline disentangled terms need head dim 64");
    launch_flash_kernel<T, FlashConfig<64, 64, 64, 4, 2, 2, true>, false, false, false, true>(
        p, batch, device, stream);
    return;
  }
  // Wide tiles pay off once the grid is a few waves deep; below that, narrow tiles' shorter
  // blocks finish sooner (measured on an H100: batch 1 x 128 tokens runs best narrow, batch 32
  // wide).
  const int64_t wide_blocks = static_cast<int64_t>((p.seq + 127) / 128) * p.heads * batch;
  // Batch-invariant: wide blocks at every grid, never the 128-key tiles (a row's keys are summed
  // in 64-key tiles either way; the rows a block takes do not change a row's result).
  const bool wide = batch_invariant ||
                    wide_blocks >= 2 * static_cast<int64_t>(multiprocessor_count(device));
  // 128-key tiles only pay once a sequence has several of them to pipeline. With a window, a
  // wide block visits at most its 128 rows' keys plus the window either side.
  const int block_keys = p.window > 0 ? std::min(p.seq, 128 + 2 * p.window) : p.seq;
  const bool long_keys = block_keys > 256 && !batch_invariant;
  switch (head_dim) {
    case 32:
      if (wide) {
        // Windowed at 3 blocks an SM (168 registers) ptxas spilled; 2 leave it room.
        launch_flash<T, FlashConfig<32, 128, 64, 4, 3, 2, true>,
                     FlashConfig<32, 128, 64, 4, 2, 2, true>>(p, batch, device, stream);
      } else {
        launch_flash<T, FlashConfig<32, 64, 64, 4, 4, 2, true>>(p, batch, device, stream);
      }
      return;
    case 64:
      if (wide && long_keys) {
        launch_flash<T, FlashConfig<64, 128, 128, 4, 2, 2, false>>(p, batch, device, stream);
      } else if (wide) {
        launch_flash<T, FlashConfig<64, 128, 64, 4, 2, 2, true>>(p, batch, device, stream);
      } else {
        launch_flash<T, FlashConfig<64, 64, 64, 4, 3, 2, true>>(p, batch, device, stream);
      }
      return;
    case 128:
      launch_flash<T, FlashConfig<128, 64, 64, 4, 2, 2, true>>(p, batch, device, stream);
      return;
  }
  FTBERT_FAIL(flash_attention_unsupported_reason(DType::kFloat16, head_dim));
}

}  // namespace

std::string flash_attention_unsupported_reason(DType dt, int head_dim) {
  if (dt != DType::kFloat16 && dt != DType::kBFloat16) {
    return std::string("flash attention needs float16 or bfloat16 (got ") + dtype_name(dt) +
           "); float32 uses the unfused path";
  }
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) {
    return "flash attention supports head dims 32, 64 and 128 (got head dim " +
           std::to_string(head_dim) + "); other head dims use the unfused path";
  }
  return "";
}

bool flash_computes_terms(DType dt, int head_dim) {
  const char* tables = std::getenv("FTBERT_DEBERTA_TERM_TABLES");
  return flash_attention_unsupported_reason(dt, head_dim).empty() && head_dim == 64 &&
         (tables == nullptr || tables[0] == '\0' || std::strcmp(tables, "0") == 0);
}

void invoke_flash_attention(DType dt, const void* qkv, const void* qkv_bias, void* out,
                            const SequenceLayout& layout, int heads, int head_dim, float scale,
                            const AttentionOptions& options, cudaStream_t stream,
                            bool batch_invariant) {
  const std::string why = flash_attention_unsupported_reason(dt, head_dim);
  FTBERT_CHECK(why.empty(), why);
  const int batch = layout.batch, seq = layout.max_seq;
  FTBERT_CHECK(batch >= 0 && seq >= 0 && heads > 0,
               "flash attention: bad shape batch=" << batch << " seq=" << seq
                                                   << " heads=" << heads);
  FTBERT_CHECK(batch <= 65535 && heads <= 65535,
               "flash attention: batch and heads must be <= 65535 (got batch=" << batch
                                                                              << ", heads=" << heads
                                                                              << ")");
  // The running max is kept in raw score units, which orders scores correctly only for scale > 0.
  FTBERT_CHECK(scale > 0.0f && std::isfinite(scale),
               "flash attention: scale must be positive and finite, got " << scale);
  if (batch == 0 || seq == 0 || layout.rows == 0) return;
  FTBERT_CHECK(qkv && qkv_bias && out && (layout.packed() || layout.mask),
               "flash attention: null pointer argument");
  // 16-byte vector copies of rows (row strides are multiples of 16 bytes since d % 8 == 0).
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  };
  FTBERT_CHECK(aligned16(qkv) && aligned16(qkv_bias) && aligned16(out),
               "flash attention: qkv, bias and out must be 16-byte aligned");
  if (options.has_relative_bias()) {
    // Every distance between two positions of a row lies in [-(S - 1), S - 1], inside the table.
    FTBERT_CHECK(options.relative_span >= seq,
                 "flash attention: relative bias span " << options.relative_span
                                                        << " < sequence length " << seq);
    FTBERT_CHECK(!layout.packed() || layout.token_index,
                 "flash attention: a packed layout with a relative bias needs token_index");
  }
  if (options.has_terms()) {
    const DisentangledTerms& t = options.terms;
    FTBERT_CHECK(!options.has_relative_bias() && options.window == 0 && t.column != nullptr,
                 "flash attention: disentangled terms go without a bias or a window");
    if (t.positions != nullptr) {
      FTBERT_CHECK(head_dim == 64 && t.position_rows > 0 &&
                       seq <= t.max_distance && (t.inline_c2p || t.inline_p2c),
                   "flash attention: inline disentangled terms need float16 or bfloat16, head "
                   "dim 64 (got " << head_dim << "), relative rows, and distances up to the "
                   "sequence's " << seq << " (table: " << t.max_distance << ")");
    } else {
      FTBERT_CHECK(t.rows >= layout.rows,
                   "flash attention: disentangled term tables need a row for each of the "
                   "layout's " << layout.rows << " rows (got " << t.rows << ")");
    }
    FTBERT_CHECK(!layout.packed() || layout.token_index,
                 "flash attention: a packed layout with disentangled terms needs token_index");
  }
  FTBERT_CHECK(options.window >= 0, "flash attention: window " << options.window << " < 0");
  // Every distance is at most S - 1: a window that long masks nothing and runs the kernels
  // without one (the same bits).
  const bool windowed = options.window > 0 && options.window < seq;
  FTBERT_CHECK(!windowed || !layout.packed() || layout.token_index,
               "flash attention: a packed layout with a window needs token_index");

  FlashParams p;
  p.qkv = qkv;
  p.bias = qkv_bias;
  p.mask = layout.packed() ? nullptr : layout.mask;
  p.cu_seqlens = layout.cu_seqlens;
  p.out = out;
  p.seq = seq;
  p.rows = layout.rows;
  p.heads = heads;
  p.scale_log2 = scale * kLog2e;
  if (options.has_relative_bias()) {
    p.relative_bias = options.relative_bias;
    p.relative_span = options.relative_span;
    p.inv_scale = 1.0f / scale;
  }
  if (windowed) p.window = options.window;
  if (options.has_terms()) {
    p.c2p = options.terms.c2p;
    p.p2c = options.terms.p2c;
    p.term_rows = options.terms.rows;
    p.term_width = options.terms.width;
    p.term_first = options.terms.first;
    p.term_column = options.terms.column;
    p.term_positions = options.terms.positions;
    p.term_position_rows = options.terms.position_rows;
    p.term_max_distance = options.terms.max_distance;
    p.term_c2p = options.terms.inline_c2p;
    p.term_p2c = options.terms.inline_p2c;
  }
  if (options.has_relative_bias() || windowed || options.has_terms()) {
    p.token_index = layout.packed() ? layout.token_index : nullptr;
  }
  if (dt == DType::kFloat16) {
    launch_flash_for_head_dim<__half>(p, batch, head_dim, stream, batch_invariant);
  } else {
    launch_flash_for_head_dim<__nv_bfloat16>(p, batch, head_dim, stream, batch_invariant);
  }
}

}  // namespace ftbert::cuda
