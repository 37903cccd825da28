// flash_sm90.cu's cp.async kernel: every block copies its own tiles with cp.async (a block is 1-2
// warpgroups, several blocks per multiprocessor), and its launcher. The matrix products and the
// helpers it shares with the warp-specialized kernel are flash_sm90_wgmma.cuh's.
//
// What changes against flash.cu, besides the matrix products (flash_sm90_wgmma.cuh):
//   - cp.async writes shared memory through the generic proxy and wgmma reads it through the
//     async proxy, so every thread fences (fence.proxy.async) after its copies land and before
//     the barrier that publishes them.
//   - The schedule overlaps the two products of neighbouring key tiles: the scores of tile t are
//     issued right behind P·V of tile t - 1, and the softmax of tile t runs while that P·V
//     finishes (the accumulator is rescaled only after it lands). The next tile's copies are
//     issued while the scores compute, its mask read ahead into a register.
//
// For flash_sm90.cu's translation unit alone, as flash_sm90_wgmma.cuh.
#pragma once

#include <atomic>
#include <cstdint>

#include "cuda/attention/flash_common.cuh"
#include "cuda/attention/flash_sm90_wgmma.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace ftbert::cuda {
namespace {

using namespace flash_detail;

template <int D_, int kWarpgroups, int Bc, bool kPositions = false>
struct Sm90Tile {
  static constexpr int D = D_;
  static_assert(D % 64 == 0, "whole 64-column panels");
  static constexpr int Br = 64 * kWarpgroups;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kQPanel = Br * 128;   // bytes of a panel of the Q tile
  static constexpr int kKVPanel = Bc * 128;  // ... of a K or V tile
  static constexpr int kQBytes = D / 64 * kQPanel;
  static constexpr int kKVBytes = D / 64 * kKVPanel;
  static constexpr int kStages = 2;  // the schedule alternates two buffers (buf ^ 1)
  // [align pad] sQ | sK [2] | sV [2] | key bias [2][Bc] fp32 | key positions [2][Bc]
  // (kPositions) | key range scratch
  static constexpr int kKeyPosInts = kPositions ? kStages * Bc : 0;
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes +
                                       kStages * Bc * sizeof(float) +
                                       (kKeyPosInts + kThreads / 32 * 2) * sizeof(int);
};

// kRelBias: add p.relative_bias (MPNet); kWindow: attend within p.window positions (ModernBERT's
// local layers); both as flash.cu's kernel does, from the positions of the rows and keys.
template <typename T, int D_, int kWarpgroups, int Bc, int kMinBlocks, bool kRelBias, bool kWindow>
__global__ void __launch_bounds__(kWarpgroups * 128, kMinBlocks)
    flash_attention_sm90_kernel(FlashParams p) {
  begin_dependent_kernel();
  constexpr bool kPositions = kRelBias || kWindow;
  using Tile = Sm90Tile<D_, kWarpgroups, Bc, kPositions>;
  constexpr int D = Tile::D, Br = Tile::Br, kThreads = Tile::kThreads, kStages = Tile::kStages;
  constexpr float kNegInf = -__builtin_huge_valf();
  static_assert(sizeof(T) == 2, "16-bit inputs");

  extern __shared__ unsigned char smem_raw[];
  // The swizzle pattern is a function of the address bits, so tiles start on 1024 bytes.
  // Rounded up by pointer arithmetic (not through an integer), so the compiler still knows every
  // pointer below is shared memory and emits shared loads and stores rather than generic ones.
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + Tile::kQBytes;
  unsigned char* sV = sK + kStages * Tile::kKVBytes;
  float* sKeyBias = reinterpret_cast<float*>(sV + kStages * Tile::kKVBytes);  // [kStages][Bc]
  int* sKeyPos = reinterpret_cast<int*>(sKeyBias + kStages * Bc);  // [kStages][Bc] (kPositions)
  int* sRange = sKeyPos + Tile::kKeyPosInts;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wg = warp / 4;
  const int q0 = blockIdx.x * Br;
  const SequenceRows<T, D> seq(p, blockIdx.z, blockIdx.y);
  if (q0 >= seq.len) return;  // past this sequence's end (packed batches); uniform per block
  const float scale_log2 = p.scale_log2;

  // kWindow: only the key tiles within the window of some row of the block (flash.cu's
  // file comment); a score outside its row's window is masked in the registers.
  int t_begin, t_end;
  if constexpr (kWindow) {
    seq.template key_tiles<kThreads, Bc, true>(sRange, t_begin, t_end, q0, min(q0 + Br, seq.len) - 1,
                                               p.window);
  } else {
    seq.template key_tiles<kThreads, Bc>(sRange, t_begin, t_end);
  }
  // kPositions: the padded positions of this thread's rows g and g + 8 (rows past the sequence
  // take its last row's, to stay inside the bias table).
  int q_pos[2] = {0, 0};
  if constexpr (kPositions) {
    const int g = q0 + wg * 64 + (warp % 4) * 16 + lane / 4;
    q_pos[0] = seq.position(min(g, seq.len - 1));
    q_pos[1] = seq.position(min(g + 8, seq.len - 1));
  }
  // kRelBias: this head's bias table at distance 0, shifted by each row's position.
  const float* rel_row[2] = {nullptr, nullptr};
  if constexpr (kRelBias) {
    const float* table = p.relative_bias + (static_cast<int64_t>(blockIdx.y) * (2 * p.relative_span - 1) +
                                            (p.relative_span - 1));
    rel_row[0] = table - q_pos[0];
    rel_row[1] = table - q_pos[1];
  }

  // ---- loads: D / 8 chunks of 16 bytes per row, into the swizzled panels.
  auto q_at = [&](int row, int chunk) { return sQ + panel_offset<Br>(row, chunk); };
  // bit `buf`: this thread's key-bias entries of that buffer hold a masked key
  int masked_bits = 0;
  auto write_key_bias = [&](uint32_t kept, int buf) {
    const bool masked = seq.template write_key_bias<Bc, kThreads>(kept, sKeyBias + buf * Bc);
    masked_bits = (masked_bits & ~(1 << buf)) | ((masked ? 1 : 0) << buf);
  };
  // kPositions: the positions of tile `tile`'s keys into buffer `buf`, published with its key
  // bias.
  auto write_key_pos = [&](int tile, int buf) {
    if constexpr (kPositions) seq.template key_positions<Bc, kThreads>(tile * Bc, sKeyPos + buf * Bc);
  };

  float o[D / 8][4];
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int quad_col = 2 * (lane % 4);
  // What the tile's scores get after the products: the relative bias (kRelBias, in raw score
  // units as flash.cu's kernel starts from it), the masked keys' -inf, and (kWindow) -inf outside
  // a row's window.
  auto mask_scores = [&](float (&s)[Bc / 8][4], bool tile_masked, int buf) {
    if constexpr (kRelBias) {
      add_relative_bias(s, rel_row, sKeyPos + buf * Bc, quad_col, p.inv_scale);
    }
    if (tile_masked) add_key_bias(s, sKeyBias + buf * Bc, quad_col);
    if constexpr (kWindow) window_mask_scores(s, q_pos, sKeyPos + buf * Bc, quad_col, p.window);
  };
  const unsigned char* q_tile = sQ + wg * 64 * 128;  // this warpgroup's 64 rows (first panel)

  // Descriptors built once: a descriptor's low bits are the start address in 16-byte units, so
  // a tile or k-step further on is the same descriptor plus its byte offset / 16 (shared memory
  // ends well below where that field would carry).
  const SmemDesc q_desc = sw128_desc(q_tile, 16);
  const SmemDesc k_desc = sw128_desc(sK, 16);
  const SmemDesc v_desc = sw128_desc(sV, Tile::kKVPanel);
  constexpr uint32_t kTileStep = Tile::kKVBytes / 16;

  // The products of the tile in buffer `buf`.
  auto scores = [&](float (&s)[Bc / 8][4], int buf) {
    issue_scores<T, D, Bc>(s, q_desc, Tile::kQPanel / 16, k_desc + buf * kTileStep,
                           Tile::kKVPanel / 16);
  };
  auto pv = [&](const uint32_t (&a)[Bc / 16][4], int buf) {
    issue_pv<T, D / 8, Bc>(o, a, v_desc + buf * kTileStep);
  };
  // After this thread's copies of the tile in `buf` have landed: fences them (and the Q fix-up)
  // for wgmma and publishes them with a barrier, which also ORs the tile's masked-key bits.
  auto publish = [&](int buf) {
    fence_proxy_async();
    return __syncthreads_or((masked_bits >> buf) & 1) != 0;
  };

  // The schedule: tile t's scores are computed while P·V of tile t - 1 runs, and its softmax
  // while that P·V finishes, so the tensor cores get the next product before the exponentials
  // start. Iteration t copies K of tile t + 1 and V of tile t (V a tile later than K: its buffer
  // is free only once P·V of tile t - 2 has landed, and the first scores need only Q and K).
  auto kept = [&](int tile) { return seq.template kept_keys<Bc, kThreads>(tile * Bc); };
  auto copy_k = [&](int tile, int buf) {
    unsigned char* dk = sK + buf * Tile::kKVBytes;
    seq.template copy_rows<1, Bc, kThreads>(
        tile * Bc, [&](int row, int chunk) { return dk + panel_offset<Bc>(row, chunk); });
  };
  auto copy_v = [&](int tile, int buf) {
    unsigned char* dv = sV + buf * Tile::kKVBytes;
    seq.template copy_rows<2, Bc, kThreads>(
        tile * Bc, [&](int row, int chunk) { return dv + panel_offset<Bc>(row, chunk); });
  };
  // Iteration t's copies, committed as one group; returns tile t + 1's mask bits, read into a
  // register here and written out as key bias after the softmax, once the load has landed.
  auto copy_next = [&](int t, int buf) {
    uint32_t next_kept = 0;
    if (t + 1 < t_end) {
      copy_k(t + 1, buf ^ 1);
      next_kept = kept(t + 1);
    }
    copy_v(t, buf);
    cp_async_commit();
    return next_kept;
  };

  seq.template load_q<Br, kThreads>(q0, q_at);
  if (t_begin < t_end) {
    copy_k(t_begin, 0);
    write_key_bias(kept(t_begin), 0);
    write_key_pos(t_begin, 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  seq.template add_q_bias<Br, kThreads>(q_at);  // by the thread that copied each chunk

  uint32_t a[Bc / 16][4];  // P of a tile, read by the tensor cores until waited for
  if (t_begin < t_end) {
    float alpha[2];
    {  // the first tile: nothing to overlap with yet (o is still zero)
      const bool tile_masked = publish(0);
      float s[Bc / 8][4];
      scores(s, 0);
      const uint32_t next_kept = copy_next(t_begin, 0);
      wgmma_wait<0>();
      pin(s);
      mask_scores(s, tile_masked, 0);
      softmax_scores(s, row_max, row_sum, scale_log2, alpha);
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
      if (t_begin + 1 < t_end) {  // published by the next barrier
        write_key_bias(next_kept, 1);
        write_key_pos(t_begin + 1, 1);
      }
    }
    int buf = 1;  // the buffers of tile t (K, V, key bias)
    for (int t = t_begin + 1; t < t_end; ++t) {
      cp_async_wait<0>();  // K of tile t and V of tile t - 1 have landed
      // Every thread's copies are visible (to wgmma too); every warp is done with the scores of
      // tile t - 1 and with P·V of tile t - 2, whose buffers are refilled next.
      const bool tile_masked = publish(buf);
      float s[Bc / 8][4];
      scores(s, buf);
      pv(a, buf ^ 1);  // tile t - 1
      const uint32_t next_kept = copy_next(t, buf);
      wgmma_wait<1>();  // the scores; P·V may still run
      pin(s);
      mask_scores(s, tile_masked, buf);
      softmax_scores(s, row_max, row_sum, scale_log2, alpha);
      wgmma_wait<0>();  // P·V of tile t - 1: o and a are free
      pin(o);
      pin(a);
      rescale_rows(o, alpha);
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
      if (t + 1 < t_end) {  // published by the next barrier
        write_key_bias(next_kept, buf ^ 1);
        write_key_pos(t + 1, buf ^ 1);
      }
      buf ^= 1;
    }
    // P·V of the last tile, once the last iteration's copy of its V has landed everywhere.
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    pv(a, buf ^ 1);
    wgmma_wait<0>();
    pin(o);
  }
  // A block with no unmasked key ran no tile, hence no barrier yet: order the Q fix-up above
  // before the epilogue reuses the Q rows.
  if (t_begin == t_end) __syncthreads();

  // ---- epilogue, staged through this warp's own 16 Q rows
  const int warp_row0 = wg * 64 + (warp % 4) * 16;
  store_output<T, D>(
      o, row_sum, seq,
      [&](int row, int chunk) { return sQ + panel_offset<Br>(warp_row0 + row, chunk); },
      q0 + warp_row0, lane);
}

template <typename T, int D, int kWarpgroups, int Bc, int kMinBlocks, bool kRelBias = false,
          bool kWindow = false>
void launch_sm90(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  using Tile = Sm90Tile<D, kWarpgroups, Bc, kRelBias || kWindow>;
  constexpr size_t smem = Tile::kSmemBytes;
  auto kernel = flash_attention_sm90_kernel<T, D, kWarpgroups, Bc, kMinBlocks, kRelBias, kWindow>;
  static std::atomic<uint64_t> raised_on{0};
  allow_shared_memory(kernel, smem, device, raised_on);
  launch(kernel, flash_grid(p, batch, Tile::Br), Tile::kThreads, smem, stream, p);
  FTBERT_LAUNCH_CHECK("flash_attention_sm90_kernel", stream);
}

}  // namespace
}  // namespace ftbert::cuda
