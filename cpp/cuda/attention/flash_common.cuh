// Device pieces shared by the two fused-attention kernels: flash.cu (mma.sync, any GPU the build
// targets) and flash_sm90.cu (warpgroup MMA, Hopper). Both run the same algorithm on the same
// fragment layout: a warp owns 16-row tiles, a thread holds rows g = lane/4 and g + 8 of a tile
// and columns 8j + 2c, 8j + 2c + 1 (c = lane % 4) of each 8-column block j, as
//   x[j][0], x[j][1]: row g      x[j][2], x[j][3]: row g + 8
// which is both the mma.sync m16n8 accumulator layout and, per warp, the wgmma m64nN one.
//
// Also shared: the skeleton around the matrix products. SequenceRows is where a block's rows are
// (padded or packed batches: the only place that knows the difference), and its loaders and
// stores move 16-byte chunks between those rows and a kernel's shared-memory tiles, whatever
// their layout (the kernel passes the address of a row's chunk). The launch helpers size the grid
// and opt in to large shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/kernels/mma.cuh"

namespace ftbert::cuda::flash_detail {

constexpr float kLog2e = 1.4426950408889634f;

struct FlashParams {
  const void* qkv;                      // [rows, 3H]: B·S padded, T packed
  const void* bias;                     // [3H]
  const int32_t* mask = nullptr;        // [B, S], padded batches
  const int32_t* cu_seqlens = nullptr;  // [B + 1], packed batches (then mask is not read)
  void* out;                            // [rows, H]
  int seq;                              // S: the padded length; packed, the longest sequence
  int rows = 0;                         // rows of qkv and out (B·S padded; packed, >= T)
  int heads;
  float scale_log2;  // scale * log2(e)
  // A relative position bias (AttentionOptions), null when none.
  const float* relative_bias = nullptr;  // [heads, 2·span − 1]
  int relative_span = 0;                 // >= seq
  float inv_scale = 0.0f;                // 1 / scale: the bias enters in raw score units
  // DeBERTa's disentangled terms (DisentangledTerms), null when none; only flash.cu's kernel
  // adds them: [heads, term_rows, term_width] each, in the compute dtype.
  const void* c2p = nullptr;
  const void* p2c = nullptr;
  int64_t term_rows = 0;
  int term_width = 0;
  int term_first = 0;
  const int32_t* term_column = nullptr;  // at distance 0
  // Or, with no tables (flash.cu's inline terms): the layer's relative queries | keys
  // [term_position_rows, 3H] (DisentangledTerms::positions), from which the kernel computes the
  // terms; term_column[δ] is then their row, for |δ| < term_max_distance.
  const void* term_positions = nullptr;
  int term_position_rows = 0;
  int term_max_distance = 0;
  bool term_c2p = false;
  bool term_p2c = false;
  // [rows], packed batches with a bias, a window or the terms: b·S + s of each row
  const int32_t* token_index = nullptr;
  // A sliding window (AttentionOptions): keys within `window` positions of the query, 0 for
  // every key; only flash.cu's kernel takes one, and only 0 < window < seq.
  int window = 0;
};

// The mma.sync wrapper per dtype (kernels/mma.cuh), shared with the ordered GEMM.
using ::ftbert::cuda::Mma;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses the registers (and L1); with valid == false nothing
// is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// chunk[i] += bias[i] for 8 elements (one 16-byte chunk of a Q row in shared memory), in fp32
// and rounded once, as the unfused path's bias kernel does.
template <typename T>
__device__ __forceinline__ void add_bias_chunk(uint4* chunk, const uint4& bias) {
  uint4 v = *chunk;
  uint32_t* vw = reinterpret_cast<uint32_t*>(&v);
  const uint32_t* bw = reinterpret_cast<const uint32_t*>(&bias);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float2 x = Mma<T>::unpack(vw[w]);
    const float2 y = Mma<T>::unpack(bw[w]);
    vw[w] = Mma<T>::pack(x.x + y.x, x.y + y.y);
  }
  *chunk = v;
}

// 2^x on the SFU. exp2f compiles to the same instruction plus a subnormal fix-up; here every
// argument is <= 0 (weights relative to the row max's 1), and a weight below 2^-126 is lost in
// the row sum anyway, so flushing it to zero changes nothing. exp2(-inf) = 0.
// Every weight of a tile takes this one instruction: on an H100 the persistent Hopper kernel ran
// slower with a share of them computed on the FMA pipe instead (its softmax's instruction
// stream, not the SFU, is what it waits on), and the Hopper kernels ran slower with the rescale
// skipped while the max stays put (benchmarks/results/levers-tried-h100.txt). MUFU work beside
// the other warpgroup's wgmma costs the tensor cores nothing; FP32 FMAs cost them about a cycle
// each (benchmarks/kernels/wgmma_overlap.cu).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// [lo, hi]: the first and last unmasked key of a sequence (lo = S, hi = -1 when there is none),
// found by the whole block; `scratch` holds 2 ints per warp.
template <int kThreads>
__device__ __forceinline__ void unmasked_key_range(const int32_t* mask, int S, int* scratch,
                                                   int& lo, int& hi) {
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x;
  lo = S;
  hi = -1;
  for (int i = tid; i < S; i += kThreads) {
    if (mask[i] != 0) {
      lo = min(lo, i);
      hi = max(hi, i);
    }
  }
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  if (tid % 32 == 0) {
    scratch[2 * (tid / 32)] = lo;
    scratch[2 * (tid / 32) + 1] = hi;
  }
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    lo = min(lo, scratch[2 * w]);
    hi = max(hi, scratch[2 * w + 1]);
  }
}

// Adds the key bias (0 for kept keys, -inf for masked ones) of a tile to a 16-row score tile.
template <int kBlocks>
__device__ __forceinline__ void add_key_bias(float (&s)[kBlocks][4], const float* key_bias,
                                             int quad_col) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const float2 kb = *reinterpret_cast<const float2*>(key_bias + 8 * j + quad_col);
    s[j][0] += kb.x;
    s[j][1] += kb.y;
    s[j][2] += kb.x;
    s[j][3] += kb.y;
  }
}

// A key tile's relative position bias for a 16-row score tile, as b / scale in raw (unscaled)
// score units, for the products to be accumulated onto: the softmax's scale·log2(e) then turns
// it into b·log2(e), the running max stays in raw units, and a bias of zeros starts the scores
// from exact zeros, as without one. rel_row[r] (r = 0: row g, 1: row g + 8) is the head's bias
// table shifted by the row's position, so that rel_row[r][pos] is its bias against the key at
// padded position pos; key_pos holds the tile's key positions. The table is small enough to stay
// in the read-only cache.
template <int kBlocks>
__device__ __forceinline__ void relative_bias_scores(float (&s)[kBlocks][4],
                                                     const float* const (&rel_row)[2],
                                                     const int* key_pos, int quad_col,
                                                     float inv_scale) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const int2 kp = *reinterpret_cast<const int2*>(key_pos + 8 * j + quad_col);
    s[j][0] = __ldg(rel_row[0] + kp.x) * inv_scale;
    s[j][1] = __ldg(rel_row[0] + kp.y) * inv_scale;
    s[j][2] = __ldg(rel_row[1] + kp.x) * inv_scale;
    s[j][3] = __ldg(rel_row[1] + kp.y) * inv_scale;
  }
}

// relative_bias_scores' bias added to a tile's finished products instead (the Hopper kernels,
// whose products start from zeros in the tensor cores).
template <int kBlocks>
__device__ __forceinline__ void add_relative_bias(float (&s)[kBlocks][4], const float* const (&rel_row)[2],
                                                  const int* key_pos, int quad_col, float inv_scale) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const int2 kp = *reinterpret_cast<const int2*>(key_pos + 8 * j + quad_col);
    s[j][0] += __ldg(rel_row[0] + kp.x) * inv_scale;
    s[j][1] += __ldg(rel_row[0] + kp.y) * inv_scale;
    s[j][2] += __ldg(rel_row[1] + kp.x) * inv_scale;
    s[j][3] += __ldg(rel_row[1] + kp.y) * inv_scale;
  }
}

// Masks (-inf) the scores of a 16-row score tile whose key lies outside its query's window:
// |key position − query position| > window. q_pos[r] (r = 0: row g, 1: row g + 8) are this
// thread's query positions, key_pos the tile's key positions.
template <int kBlocks>
__device__ __forceinline__ void window_mask_scores(float (&s)[kBlocks][4], const int (&q_pos)[2],
                                                   const int* key_pos, int quad_col, int window) {
  constexpr float kNegInf = -__builtin_huge_valf();
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const int2 kp = *reinterpret_cast<const int2*>(key_pos + 8 * j + quad_col);
    s[j][0] = abs(kp.x - q_pos[0]) <= window ? s[j][0] : kNegInf;
    s[j][1] = abs(kp.y - q_pos[0]) <= window ? s[j][1] : kNegInf;
    s[j][2] = abs(kp.x - q_pos[1]) <= window ? s[j][2] : kNegInf;
    s[j][3] = abs(kp.y - q_pos[1]) <= window ? s[j][3] : kNegInf;
  }
}

// The online-softmax step for one 16-row tile and one key tile, on the scores: s (raw scores)
// becomes the unnormalized weights p = 2^(s·scale_log2 - max·scale_log2), the running max and this
// thread's running sum move on, and alpha[r] = 2^(old max - new max) is what the accumulator must
// be scaled by (`rescale_rows`; a kernel whose P·V is still in flight does that once it lands). A
// row is spread over the 4 lanes of a quad; the max is kept in raw score units (scale > 0) so that
// scale·log2(e) folds into the exponent's FMA. r = 0: row g, r = 1: row g + 8. kRowSums = false:
// the caller sums the weights elsewhere (row_sum is left alone).
template <int kBlocks, bool kRowSums = true>
__device__ __forceinline__ void softmax_scores(float (&s)[kBlocks][4], float (&row_max)[2],
                                               float (&row_sum)[2], float scale_log2,
                                               float (&alpha)[2]) {
  constexpr float kNegInf = -__builtin_huge_valf();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // Max and sum over the row in kLanes independent chains (a single chain would wait out each
    // instruction's latency in turn), combined at the end.
    constexpr int kLanes = kBlocks >= 4 ? 4 : kBlocks;
    float part[kLanes];
#pragma unroll
    for (int c = 0; c < kLanes; ++c) part[c] = row_max[r];
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      part[j % kLanes] = fmaxf(part[j % kLanes], fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    }
    float mx = part[0];
#pragma unroll
    for (int c = 1; c < kLanes; ++c) mx = fmaxf(mx, part[c]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // While a row has seen only masked keys its max is -inf; using 0 instead keeps -inf - -inf
    // from becoming NaN (every term is then 2^-inf = 0).
    const float m_scaled = mx == kNegInf ? 0.0f : mx * scale_log2;
    alpha[r] = fast_exp2(fmaf(row_max[r], scale_log2, -m_scaled));
    row_max[r] = mx;
#pragma unroll
    for (int c = 0; c < kLanes; ++c) part[c] = 0.0f;
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      s[j][2 * r] = fast_exp2(fmaf(s[j][2 * r], scale_log2, -m_scaled));
      s[j][2 * r + 1] = fast_exp2(fmaf(s[j][2 * r + 1], scale_log2, -m_scaled));
      if (kRowSums) part[j % kLanes] += s[j][2 * r] + s[j][2 * r + 1];
    }
    if (kRowSums) {
      float sum = part[0];
#pragma unroll
      for (int c = 1; c < kLanes; ++c) sum += part[c];
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  }
}

// o *= alpha per row (rows g and g + 8 of the 16-row tile).
template <int kOutBlocks>
__device__ __forceinline__ void rescale_rows(float (&o)[kOutBlocks][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < kOutBlocks; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}

// Both steps at once, for a kernel whose accumulator is complete.
template <int kBlocks, int kOutBlocks>
__device__ __forceinline__ void online_softmax(float (&s)[kBlocks][4], float (&o)[kOutBlocks][4],
                                               float (&row_max)[2], float (&row_sum)[2],
                                               float scale_log2) {
  float alpha[2];
  softmax_scores(s, row_max, row_sum, scale_log2, alpha);
  rescale_rows(o, alpha);
}

// The weights of keys 16kk..16kk+15 as the A operand (16x16, row-major) of P·V: the accumulator
// blocks 2kk and 2kk + 1 are exactly its fragment (a0/a1: rows g/g+8 at 2c, a2/a3: at 8 + 2c).
template <typename T, int kBlocks>
__device__ __forceinline__ void weights_fragment(const float (&p)[kBlocks][4], int kk,
                                                 uint32_t (&a)[4]) {
  a[0] = Mma<T>::pack(p[2 * kk][0], p[2 * kk][1]);
  a[1] = Mma<T>::pack(p[2 * kk][2], p[2 * kk][3]);
  a[2] = Mma<T>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = Mma<T>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// The row sums over the quad, and per row 1/l and whether the row saw any key (l > 0): rows with
// no unmasked key stay exactly zero (no V bias either).
// kQuadParts = false: each lane's row_sum is already the whole row's.
template <bool kQuadParts = true>
__device__ __forceinline__ void finish_rows(const float (&row_sum)[2], float (&inv_sum)[2],
                                            float (&has_keys)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    if (kQuadParts) {
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
    }
    inv_sum[r] = l > 0.0f ? 1.0f / l : 0.0f;
    has_keys[r] = l > 0.0f ? 1.0f : 0.0f;
  }
}

// The rows of sequence b for one head, as a block of either kernel sees them: a padded batch's
// rows b·S + s with the mask's keys, or a packed batch's rows cu_seqlens[b] + s, all of them
// tokens. Offsets inside a sequence fit in 32 bits; the base pointers carry the 64-bit offset.
template <typename T, int D>
struct SequenceRows {
  static constexpr int kChunks = D / 8;  // 16-byte chunks per head row
  const T* qkv;          // this head's Q in the sequence's row 0; K at + H, V at + 2H
  const T* bias;         // this head's Q bias; V's at + 2H
  T* out;                // this head's output columns in row 0
  const int32_t* mask;   // [len] key mask; null when packed (every row is a token)
  // [len] b·S + s of each row when packed (null padded), and b·S: a row's padded position is
  // token_index[s] - pos_base, which holes in the mask make differ from s plus a constant.
  const int32_t* token_index;
  int pos_base;
  int len;               // rows of the sequence
  int H;
  int64_t row0;          // the layout row of the sequence's row 0

  __device__ __forceinline__ SequenceRows(const FlashParams& p, int b, int head) {
    H = p.heads * D;
    pos_base = b * p.seq;
    if (p.cu_seqlens != nullptr) {
      row0 = p.cu_seqlens[b];
      len = p.cu_seqlens[b + 1] - p.cu_seqlens[b];
      mask = nullptr;
      token_index = p.token_index + row0;
    } else {
      row0 = static_cast<int64_t>(b) * p.seq;
      len = p.seq;
      mask = p.mask + row0;
      token_index = nullptr;
    }
    qkv = static_cast<const T*>(p.qkv) + row0 * (3 * H) + head * D;
    bias = static_cast<const T*>(p.bias) + head * D;
    out = static_cast<T*>(p.out) + row0 * H + head * D;
  }

  __device__ __forceinline__ bool key_kept(int s) const {
    return s < len && (mask == nullptr || mask[s] != 0);
  }
  // Row s's position in the padded row (s < len), for the relative position bias and the window.
  __device__ __forceinline__ int position(int s) const {
    return token_index == nullptr ? s : token_index[s] - pos_base;
  }
  // The positions of the keys of tile k0 into key_pos[Bc]; keys past the sequence take its last
  // key's, which keeps every distance inside the bias table (their scores are masked anyway).
  template <int Bc, int kThreads>
  __device__ __forceinline__ void key_positions(int k0, int* key_pos) const {
#pragma unroll
    for (int j = 0; j * kThreads < Bc; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i < Bc) key_pos[i] = position(min(k0 + i, len - 1));
    }
  }

  // The key tiles to visit, [t_begin, t_end) of Bc keys: those between the first and last kept
  // key, so left or right padding costs no work (none when no key is kept: zero output). Padded
  // batches find the range with the whole block (`scratch`: 2 ints per warp).
  // kWindow: only the keys within `window` of some query row q_first..q_last (window_key_rows).
  template <int kThreads, int Bc, bool kWindow = false>
  __device__ __forceinline__ void key_tiles(int* scratch, int& t_begin, int& t_end,
                                            int q_first = 0, int q_last = 0,
                                            int window = 0) const {
    int lo = 0, hi = len - 1;
    if (mask != nullptr) unmasked_key_range<kThreads>(mask, len, scratch, lo, hi);
    if constexpr (kWindow) {
      window_key_rows<kThreads>(q_first, q_last, window, lo, hi);
      t_begin = lo / Bc;
      t_end = hi < lo ? t_begin : hi / Bc + 1;
    } else {
      t_begin = lo / Bc;
      t_end = hi < 0 ? t_begin : hi / Bc + 1;
    }
  }

  // Narrows the key rows [lo, hi] to those some query row q_first..q_last (q_first <= q_last <
  // len) attends through a window: keys at positions [position(q_first) − window,
  // position(q_last) + window], positions growing with the row. A row's position grows by at
  // least 1 a row (exactly 1 padded), so rows more than `window` before q_first or after q_last
  // are out whatever the holes; packed rows with holes are then narrowed by position: the rows of
  // [q_first − window, q_first) below the first position are a prefix of them, those of
  // (q_last, q_last + window] above the last a suffix, counted by the whole block.
  template <int kThreads>
  __device__ __forceinline__ void window_key_rows(int q_first, int q_last, int window, int& lo,
                                                  int& hi) const {
    int w_lo = max(q_first - window, 0);
    int w_hi = min(q_last + window, len - 1);
    if (token_index != nullptr) {
      const int pos_lo = position(q_first) - window;
      const int pos_hi = position(q_last) + window;
      int below = 0, above = 0;
      for (int s0 = w_lo; s0 < q_first; s0 += kThreads) {  // bounds uniform over the block
        const int s = s0 + static_cast<int>(threadIdx.x);
        below += __syncthreads_count(s < q_first && position(s) < pos_lo);
      }
      for (int s0 = q_last + 1; s0 <= w_hi; s0 += kThreads) {
        const int s = s0 + static_cast<int>(threadIdx.x);
        above += __syncthreads_count(s <= w_hi && position(s) > pos_hi);
      }
      w_lo += below;
      w_hi -= above;
    }
    lo = max(lo, w_lo);
    hi = min(hi, w_hi);
  }

  // Copies Q rows q0..q0+Br-1 into shared memory (`at(row, chunk)`: a chunk's address), rows past
  // the sequence zero-filled from a clamped (valid) address.
  template <int Br, int kThreads, typename At>
  __device__ __forceinline__ void load_q(int q0, At at) const {
    static_assert(kThreads % kChunks == 0, "a thread copies the same chunk of every row");
    const int chunk = threadIdx.x % kChunks;
#pragma unroll
    for (int row = threadIdx.x / kChunks; row < Br; row += kThreads / kChunks) {
      const int s = q0 + row;
      cp_async_16(at(row, chunk), qkv + (min(s, len - 1) * (3 * H) + chunk * 8), s < len);
    }
  }
  // Adds the Q bias to the chunks this thread copied with load_q (in fp32, rounded once, as the
  // unfused path's bias kernel does); cp.async.wait_group has made them visible to it.
  template <int Br, int kThreads, typename At>
  __device__ __forceinline__ void add_q_bias(At at) const {
    const int chunk = threadIdx.x % kChunks;
    const uint4 bq = __ldg(reinterpret_cast<const uint4*>(bias + chunk * 8));
#pragma unroll
    for (int row = threadIdx.x / kChunks; row < Br; row += kThreads / kChunks) {
      add_bias_chunk<T>(reinterpret_cast<uint4*>(at(row, chunk)), bq);
    }
  }
  // Copies part kPart (1: K, 2: V) of the rows of key tile k0..k0+Bc-1 (`at(row, chunk)`: a
  // chunk's address), rows past the sequence zero-filled from a clamped (valid) address. A thread
  // copies the same chunk of every (kThreads / kChunks)-th row, in a fully unrolled loop; a tile
  // wholly inside the sequence (all but the last) needs no clamping.
  template <int kPart, int Bc, int kThreads, typename At>
  __device__ __forceinline__ void copy_rows(int k0, At at) const {
    constexpr int kRowsPerPass = kThreads / kChunks;
    static_assert(kThreads % kChunks == 0 && Bc % kRowsPerPass == 0, "whole passes over the tile");
    const int chunk = threadIdx.x % kChunks;
    const int r0 = threadIdx.x / kChunks;
    const int stride = 3 * H;
    const T* part = qkv + (kPart * H + chunk * 8);
    if (k0 + Bc <= len) {
      const T* src = part + (k0 + r0) * stride;
#pragma unroll
      for (int i = 0; i < Bc / kRowsPerPass; ++i) {
        cp_async_16(at(r0 + i * kRowsPerPass, chunk), src + i * kRowsPerPass * stride, true);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < Bc / kRowsPerPass; ++i) {
      const int row = r0 + i * kRowsPerPass;
      const int s = k0 + row;
      cp_async_16(at(row, chunk), part + min(s, len - 1) * stride, s < len);
    }
  }
  // Both K and V of the tile.
  template <int Bc, int kThreads, typename AtK, typename AtV>
  __device__ __forceinline__ void copy_kv(int k0, AtK k_at, AtV v_at) const {
    copy_rows<1, Bc, kThreads>(k0, k_at);
    copy_rows<2, Bc, kThreads>(k0, v_at);
  }
  // Whether the keys of tile k0 that this thread writes the bias of are kept: bit j for key
  // k0 + threadIdx.x + j * kThreads. A plain load; `write_key_bias` uses it, so a kernel can read
  // the mask early and write the bias later.
  template <int Bc, int kThreads>
  __device__ __forceinline__ uint32_t kept_keys(int k0) const {
    static_assert(Bc <= 32 * kThreads, "a bit per key");
    uint32_t kept = 0;
#pragma unroll
    for (int j = 0; j * kThreads < Bc; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i < Bc && key_kept(k0 + i)) kept |= 1u << j;
    }
    return kept;
  }
  // Writes this thread's entries of a tile's key bias (0 kept, -inf masked or past the sequence)
  // from `kept_keys`; returns whether any of them is masked.
  template <int Bc, int kThreads>
  __device__ __forceinline__ bool write_key_bias(uint32_t kept, float* key_bias) const {
    constexpr float kNegInf = -__builtin_huge_valf();
    bool masked = false;
#pragma unroll
    for (int j = 0; j * kThreads < Bc; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i < Bc) {
        const bool keep = (kept >> j) & 1u;
        key_bias[i] = keep ? 0.0f : kNegInf;
        masked |= !keep;
      }
    }
    return masked;
  }
  // copy_kv and the tile's key bias at once. Returns whether this thread wrote a masked key.
  template <int Bc, int kThreads, typename AtK, typename AtV>
  __device__ __forceinline__ bool load_kv(int k0, AtK k_at, AtV v_at, float* key_bias) const {
    copy_kv<Bc, kThreads>(k0, k_at, v_at);
    return write_key_bias<Bc, kThreads>(kept_keys<Bc, kThreads>(k0), key_bias);
  }
  // Stores rows r0..r0+kRows-1 of a warp's staged output (`at(row, chunk)`) with 16-byte stores,
  // skipping rows past the sequence.
  template <int kRows, typename At>
  __device__ __forceinline__ void store_rows(int r0, At at, int lane) const {
#pragma unroll
    for (int i = lane; i < kRows * kChunks; i += 32) {
      const int row = i / kChunks, chunk = i % kChunks;
      const int s = r0 + row;
      if (s < len) {
        *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(s) * H + chunk * 8)) =
            *reinterpret_cast<const uint4*>(at(row, chunk));
      }
    }
  }
};

// ---- launch helpers (host) -----------------------------------------------------------------

// Multiprocessors of `device`, looked up once per device.
inline int multiprocessor_count(int device) {
  static std::atomic<int> cached[64] = {};
  if (device < 64) {
    const int n = cached[device].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  FTBERT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

// One block per Br query rows of the longest sequence, per head and sequence; blocks past their
// own sequence's end return at once.
inline dim3 flash_grid(const FlashParams& p, int batch, int Br) {
  return dim3((p.seq + Br - 1) / Br, p.heads, batch);
}

// Lets `kernel` use `bytes` of dynamic shared memory, past the 48 KiB default. The opt-in is per
// device; `raised_on` (one per kernel) remembers the devices that have it.
template <typename Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, int device,
                         std::atomic<uint64_t>& raised_on) {
  if (bytes <= 48 * 1024) return;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (raised_on.load(std::memory_order_acquire) & bit)) return;
  FTBERT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
  raised_on.fetch_or(bit, std::memory_order_release);
}

}  // namespace ftbert::cuda::flash_detail
