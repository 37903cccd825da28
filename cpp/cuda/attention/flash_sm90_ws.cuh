// flash_sm90.cu's warp-specialized kernel, the TMA tensor map it reads qkv through, and its
// launcher. The matrix products and the helpers it shares with the cp.async kernel are
// flash_sm90_wgmma.cuh's; its consumers run the one-warpgroup kernel's schedule
// (flash_sm90_cpasync.cuh).
//
// Persistent: one block per multiprocessor walks work items (64·kConsumers query rows of one head
// of one sequence). A block is one producer warp (in a warpgroup of its own) and kConsumers
// consumer warpgroups of 64 query rows each. The producer loads each item's Q (two slots, so the
// next item's loads while this one finishes) and its K and V tiles with TMA into a ring of
// kStages buffers, and writes each tile's key bias; the consumers run the one-warpgroup kernel's
// schedule on the same tiles, taking turns at the tensor cores (kPingPong: one warpgroup's
// softmax runs while the other's products do). Buffers change hands through mbarriers, never a
// block barrier, so neither side waits for the slowest of the other:
//   full:  the producer's 32 lanes arrive once their key-bias writes are done, lane 0 with the
//          tile's bytes expected; TMA completes them (Q: lane 0 alone).
//   empty: every consumer thread arrives once its last read of the buffer is done.
// The ring's position and the Q slot carry over from item to item; producer and consumers skip
// the same items (past a packed sequence's end), so their counts agree.
// TMA reads a tile past the sequence's end from whatever rows follow (the next sequence) or as
// zeros (past the tensor). Those keys are masked, but 0 · inf is NaN, so the producer zeroes
// those rows before publishing the tile: a sequence's result never depends on another's.
//
// For flash_sm90.cu's translation unit alone, as flash_sm90_wgmma.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap; the encoder is looked up at run time (no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/flash_common.cuh"
#include "cuda/attention/flash_sm90_wgmma.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "ftbert/check.h"

namespace ftbert::cuda {
namespace {

using namespace flash_detail;

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives and raises the bytes the current phase waits for by `bytes` (the TMA that follows).
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: a ring's buffers start empty).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "retry:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra retry;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// A 2-D box of `map` at (column c0, row c1) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap& map, int c0, int c1,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// A barrier for consumer warpgroup c alone (barrier 1 + c; 0 is __syncthreads'). The id is an
// immediate: with a register id the compiler reserves all 16 of the block's barriers.
template <int kConsumers>
__device__ __forceinline__ void consumer_sync(int c) {
  static_assert(kConsumers <= 3, "one case per consumer");
  if (c == 0) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  } else if (kConsumers > 1 && c == 1) {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  } else if (kConsumers > 2) {
    asm volatile("bar.sync 3, 128;\n" ::: "memory");
  }
}

// TMA boxes: 64 columns (a 128-byte panel row) by kBoxRows rows.
constexpr int kBoxRows = 64;
constexpr int kBoxBytes = kBoxRows * 128;

template <int D_, int kConsumers, int Bc, int kStages_, bool kMmaRowSums_>
struct WsTile {
  static constexpr int D = D_;
  static_assert(D % 64 == 0, "whole 64-column panels");
  static constexpr int kPanels = D / 64;
  static constexpr int Br = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kStages = kStages_;  // K/V ring
  static constexpr int kQSlots = 2;         // the next work item's Q loads during this one
  static constexpr int kQPanel = Br * 128;   // bytes of a panel of the Q tile
  static constexpr int kKVPanel = Bc * 128;  // ... of a K or V tile
  static constexpr int kQBytes = kPanels * kQPanel;
  static constexpr int kKVBytes = kPanels * kKVPanel;
  static_assert(Bc % kBoxRows == 0 && Br % kBoxRows == 0, "whole boxes per tile");
  // kMmaRowSums: a panel of ones after the V ring, read by P·V as 8 more columns of V, so the
  // row sums of P come out of the tensor cores with O instead of from 64 adds per thread and
  // tile (head dim 64: m64n72).
  static constexpr bool kMmaRowSums = kMmaRowSums_;
  static_assert(!kMmaRowSums || D == 64, "row sums through the tensor cores at head dim 64");
  static constexpr int kOnesBytes = kMmaRowSums ? kKVPanel : 0;
  static constexpr int kOutBlocks = D / 8 + (kMmaRowSums ? 1 : 0);
  // [align pad] sQ [kQSlots] | sK [kStages] | sV [kStages] | ones | mbarriers | key bias
  // [kStages][Bc] fp32 | masked flag [kStages] | key tiles [kQSlots]
  static constexpr int kBarriers = 2 * kQSlots + 4 * kStages + 2;
  static constexpr size_t kSmemBytes = 1024 + kQSlots * kQBytes + 2 * kStages * kKVBytes +
                                       kOnesBytes + kBarriers * 8 + kStages * Bc * sizeof(float) +
                                       kStages * sizeof(int) + kQSlots * 2 * sizeof(int);
};

// Consumer warpgroups take turns issuing their matrix products (kPingPong): c waits for barrier
// 4 + c, which its predecessor arrives at once it has issued, so one warpgroup's softmax runs
// while the next one's products occupy the tensor cores. Immediate ids, as consumer_sync's.
template <int kConsumers>
__device__ __forceinline__ void turn_wait(int c) {
  if (c == 0) {
    asm volatile("bar.sync 4, 256;\n" ::: "memory");
  } else if (kConsumers > 1 && c == 1) {
    asm volatile("bar.sync 5, 256;\n" ::: "memory");
  } else if (kConsumers > 2) {
    asm volatile("bar.sync 6, 256;\n" ::: "memory");
  }
}
template <int kConsumers>
__device__ __forceinline__ void turn_pass(int c) {
  const int next = c + 1 == kConsumers ? 0 : c + 1;
  if (next == 0) {
    asm volatile("bar.arrive 4, 256;\n" ::: "memory");
  } else if (kConsumers > 1 && next == 1) {
    asm volatile("bar.arrive 5, 256;\n" ::: "memory");
  } else if (kConsumers > 2) {
    asm volatile("bar.arrive 6, 256;\n" ::: "memory");
  }
}

// Hands registers between the warpgroups of a block (kConsumerRegs = 0: none moved).
template <int kRegs>
__device__ __forceinline__ void registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// A position in a ring of buffers: the buffer, and the parity of the phase its full barriers
// complete next (what a consumer waits for). Advanced tile by tile instead of derived from a
// running count (a division by the ring's size per buffer and key tile).
struct RingSlot {
  int stage = 0;
  uint32_t phase = 0;
  template <int kStages>
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// A block's work items, in an order that gives neighbouring blocks the same head of the same
// sequence (its K and V stay in L2 for all its query blocks).
struct WorkItem {
  int q_block, head, b;
  __device__ __forceinline__ WorkItem(int item, int q_blocks, int heads)
      : q_block(item % q_blocks), head((item / q_blocks) % heads), b(item / (q_blocks * heads)) {}
};

template <typename T, int D_, int kConsumers, int Bc, int kStages, int kConsumerRegs,
          bool kPingPong, bool kMmaRowSums>
__global__ void __launch_bounds__((kConsumers + 1) * 128, 1)
    flash_attention_sm90_ws_kernel(const FlashParams p, int batch,
                                   const __grid_constant__ CUtensorMap qkv_map) {
  begin_dependent_kernel();
  using Tile = WsTile<D_, kConsumers, Bc, kStages, kMmaRowSums>;
  constexpr int D = Tile::D, Br = Tile::Br, kQSlots = Tile::kQSlots;
  constexpr float kNegInf = -__builtin_huge_valf();
  static_assert(sizeof(T) == 2, "16-bit inputs");

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;                              // [kQSlots][Br rows]
  unsigned char* sK = sQ + kQSlots * Tile::kQBytes;      // [kStages][Bc rows]
  unsigned char* sV = sK + kStages * Tile::kKVBytes;     // [kStages][Bc rows]
  unsigned char* sOnes = sV + kStages * Tile::kKVBytes;  // kMmaRowSums: Bc rows of ones
  uint64_t* q_full = reinterpret_cast<uint64_t*>(sOnes + Tile::kOnesBytes);  // [kQSlots]
  uint64_t* q_empty = q_full + kQSlots;                                           // [kQSlots]
  uint64_t* k_full = q_empty + kQSlots;                                           // [kStages]
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;
  uint64_t* k_raw = v_empty + kStages;  // the TMA of a tile the producer zeroes the end of
  uint64_t* v_raw = k_raw + 1;
  float* sKeyBias = reinterpret_cast<float*>(v_raw + 1);          // [kStages][Bc]
  int* sMasked = reinterpret_cast<int*>(sKeyBias + kStages * Bc);  // [kStages]
  int* sTiles = sMasked + kStages;                                  // [kQSlots][2]: t_begin, t_end

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Broadcast from lane 0, so that ptxas knows the warpgroup (and what derives from it: the Q
  // tile and the wgmma descriptors) is uniform across the warp and keeps it in uniform
  // registers. Derived from threadIdx as is, every key tile rebuilt each descriptor in regular
  // registers and moved it over (R2UR) after the turn to issue had come, delaying the first
  // wgmma of every key tile (docs/performance.md, "Kernel choices").
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int q_blocks = (p.seq + Br - 1) / Br;
  const int items = q_blocks * p.heads * batch;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQSlots; ++s) {
      mbar_init(q_full + s, 1);
      mbar_init(q_empty + s, 128 * kConsumers);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full + s, 32);
      mbar_init(v_full + s, 32);
      mbar_init(k_empty + s, 128 * kConsumers);
      mbar_init(v_empty + s, 128 * kConsumers);
    }
    mbar_init(k_raw, 1);
    mbar_init(v_raw, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kMmaRowSums) {
    const uint32_t one = Mma<T>::pack(1.0f, 1.0f);
    for (int i = threadIdx.x; i < Tile::kOnesBytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(sOnes)[i] = make_uint4(one, one, one, one);
    }
    fence_proxy_async();  // for wgmma
  }
  __syncthreads();  // the barriers are initialized (and the ones written)

  // The producer needs few registers; what the consumers gain keeps a tile's scores, P and O in
  // registers at kConsumers warpgroups per block.
  constexpr int kProducerRegs = 24;
  static_assert(kConsumerRegs == 0 || kProducerRegs + kConsumers * kConsumerRegs <= 65536 / 128,
                "the register file holds the block");
  if (wg == 0) {
    // ---- producer: one warp. Walks the same work items as the consumers, runs ahead of them by
    // the ring's depth, and across items (the next Q and key tiles load during this item's tail).
    if constexpr (kConsumerRegs > 0) registers_down<kProducerRegs>();
    if (warp != 0) return;
    int kv = 0;     // key tiles loaded so far (ring position)
    int done = 0;   // work items loaded so far (Q slot)
    uint32_t raw_parity = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const WorkItem w(item, q_blocks, p.heads);
      const SequenceRows<T, D> seq(p, w.b, w.head);
      const int q0 = w.q_block * Br;
      if (q0 >= seq.len) continue;  // past this sequence's end (packed batches)
      // Key tiles between the first and last kept key (padded batches; packed: all).
      int lo = 0, hi = seq.len - 1;
      if (seq.mask != nullptr) {
        lo = seq.len;
        hi = -1;
        for (int i = lane; i < seq.len; i += 32) {
          if (seq.mask[i] != 0) {
            lo = min(lo, i);
            hi = max(hi, i);
          }
        }
        lo = __reduce_min_sync(0xffffffffu, lo);
        hi = __reduce_max_sync(0xffffffffu, hi);
      }
      const int t_begin = lo / Bc, t_end = hi < 0 ? t_begin : hi / Bc + 1;
      const int first_row = static_cast<int>(
          p.cu_seqlens != nullptr ? p.cu_seqlens[w.b] : static_cast<int64_t>(w.b) * p.seq);
      const int col_q = w.head * D, col_k = seq.H + w.head * D, col_v = 2 * seq.H + w.head * D;

      const int qs = done % kQSlots;
      mbar_wait(q_empty + qs, ((done / kQSlots) & 1) ^ 1);
      if (lane == 0) {
        sTiles[2 * qs] = t_begin;
        sTiles[2 * qs + 1] = t_end;
        mbar_arrive_expect(q_full + qs, Tile::kQBytes);
#pragma unroll
        for (int pn = 0; pn < Tile::kPanels; ++pn) {
#pragma unroll
          for (int b = 0; b < Br / kBoxRows; ++b) {
            tma_load(sQ + qs * Tile::kQBytes + pn * Tile::kQPanel + b * kBoxBytes, qkv_map,
                     col_q + 64 * pn, first_row + q0 + b * kBoxRows, q_full + qs);
          }
        }
      }
      ++done;
      // The TMA of one part (K or V) of a tile into `dst` (every panel), completing on `bar`.
      auto tma_part = [&](unsigned char* dst, int col, int k0, uint64_t* bar) {
        mbar_arrive_expect(bar, Tile::kKVBytes);
#pragma unroll
        for (int pn = 0; pn < Tile::kPanels; ++pn) {
#pragma unroll
          for (int b = 0; b < Bc / kBoxRows; ++b) {
            tma_load(dst + pn * Tile::kKVPanel + b * kBoxBytes, qkv_map, col + 64 * pn,
                     first_row + k0 + b * kBoxRows, bar);
          }
        }
      };
      // One part of a tile, published on `full`: by TMA straight away, or, when the tile runs
      // past the sequence, once the rows past it are zeroed.
      auto load_part = [&](unsigned char* dst, int col, int k0, uint64_t* full, uint64_t* raw,
                           int raw_bit) {
        const int inside = seq.len - k0;  // rows of the tile in the sequence
        if (inside >= Bc) {
          if (lane == 0) {
            tma_part(dst, col, k0, full);
          } else {
            mbar_arrive(full);
          }
          return;
        }
        if (lane == 0) tma_part(dst, col, k0, raw);
        mbar_wait(raw, (raw_parity >> raw_bit) & 1);
        raw_parity ^= 1u << raw_bit;
        for (int i = inside * 8 + lane; i < Tile::kPanels * Bc * 8; i += 32) {
          if (Tile::kPanels == 1 || i % (Bc * 8) >= inside * 8) {  // rows [inside, Bc) of each panel
            *reinterpret_cast<uint4*>(dst + i * 16) = make_uint4(0, 0, 0, 0);
          }
        }
        fence_proxy_async();  // the zeros, for wgmma
        mbar_arrive(full);
      };
      for (int t = t_begin; t < t_end; ++t, ++kv) {
        const int s = kv % kStages;
        const uint32_t empty_parity = ((kv / kStages) & 1) ^ 1;
        const int k0 = t * Bc;
        mbar_wait(k_empty + s, empty_parity);
        bool masked = false;
#pragma unroll
        for (int j = lane; j < Bc; j += 32) {
          const bool keep = seq.key_kept(k0 + j);
          sKeyBias[s * Bc + j] = keep ? 0.0f : kNegInf;
          masked |= !keep;
        }
        masked = __any_sync(0xffffffffu, masked);
        if (lane == 0) sMasked[s] = masked ? 1 : 0;
        __syncwarp();
        load_part(sK + s * Tile::kKVBytes, col_k, k0, k_full + s, k_raw, 0);
        mbar_wait(v_empty + s, empty_parity);
        load_part(sV + s * Tile::kKVBytes, col_v, k0, v_full + s, v_raw, 1);
      }
    }
    return;
  }

  // ---- consumers: warpgroup c owns query rows 64c..64c+63 of each work item
  if constexpr (kConsumerRegs > 0) registers_up<kConsumerRegs>();
  const int c = wg - 1;
  const int ctid = threadIdx.x - 128 * wg;
  const int quad_col = 2 * (lane % 4);
  const SmemDesc k_desc = sw128_desc(sK, 16);
  constexpr uint32_t kTileStep = Tile::kKVBytes / 16;
  // V of ring buffer 0; its leading-dimension offset is the step to V's next 64 columns: the
  // next panel (head dim 128), or the ones after the ring (kMmaRowSums, head dim 64).
  const SmemDesc v_desc = sw128_desc(sV, kMmaRowSums ? kStages * Tile::kKVBytes : Tile::kKVPanel);
  // From one buffer's V to the next: the start moves a tile on; with the ones at a fixed place,
  // the leading offset (bits 16-29) shrinks by as much (the 32-bit difference does both).
  constexpr uint32_t kVStep = kMmaRowSums ? kTileStep - (kTileStep << 16) : kTileStep;
  // This thread is done reading a buffer (its products have landed, its key-bias reads done).
  // Every consumer thread arrives, each releasing its own reads.
  auto release = [&](uint64_t* empty) { mbar_arrive(empty); };
  if (kPingPong && c == kConsumers - 1) turn_pass<kConsumers>(c);  // consumer 0 goes first
  auto my_turn = [&] {
    if constexpr (kPingPong) turn_wait<kConsumers>(c);
  };
  auto pass_turn = [&] {
    if constexpr (kPingPong) turn_pass<kConsumers>(c);
  };
  RingSlot kv;  // the ring buffer of the next key tile, and the phase its barriers are in
  int done = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const WorkItem w(item, q_blocks, p.heads);
    const SequenceRows<T, D> seq(p, w.b, w.head);
    const int q0 = w.q_block * Br;
    if (q0 >= seq.len) continue;
    const int qs = done % kQSlots;
    unsigned char* q_tile = sQ + qs * Tile::kQBytes + c * 64 * 128;
    mbar_wait(q_full + qs, (done / kQSlots) & 1);
    ++done;
    const int tiles = sTiles[2 * qs + 1] - sTiles[2 * qs];
    {  // Q bias, in fp32 rounded once as elsewhere; then fenced for wgmma in this warpgroup
      constexpr int kChunks = D / 8;
      const int chunk = ctid % kChunks;
      const uint4 bq = __ldg(reinterpret_cast<const uint4*>(seq.bias + chunk * 8));
#pragma unroll
      for (int row = ctid / kChunks; row < 64; row += 128 / kChunks) {
        add_bias_chunk<T>(reinterpret_cast<uint4*>(q_tile + panel_offset<Br>(row, chunk)), bq);
      }
      fence_proxy_async();
      consumer_sync<kConsumers>(c);
    }
    const SmemDesc q_desc = sw128_desc(q_tile, 16);
    constexpr int kOutBlocks = Tile::kOutBlocks;
    float o[kOutBlocks][4];  // kMmaRowSums: block D / 8 holds the row sums (every column)
    float row_max[2] = {kNegInf, kNegInf};
    float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kOutBlocks; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    auto scores = [&](float (&s)[Bc / 8][4], int buf) {
      issue_scores<T, D, Bc>(s, q_desc, Tile::kQPanel / 16, k_desc + buf * kTileStep,
                             Tile::kKVPanel / 16);
    };
    auto pv = [&](const uint32_t (&a)[Bc / 16][4], int buf) {
      issue_pv<T, kOutBlocks, Bc>(o, a, v_desc + buf * kVStep);
    };

    // The one-warpgroup kernel's schedule: tile i's scores are issued right behind P·V of tile
    // i - 1, and its softmax runs while that P·V finishes.
    uint32_t a[Bc / 16][4];
    if (tiles > 0) {
      float alpha[2];
      {
        const int buf = kv.stage;
        mbar_wait(k_full + buf, kv.phase);
        const bool tile_masked = sMasked[buf] != 0;
        float s[Bc / 8][4];
        my_turn();
        scores(s, buf);
        pass_turn();
        wgmma_wait<0>();
        pin(s);
        if (tile_masked) add_key_bias(s, sKeyBias + buf * Bc, quad_col);
        release(k_empty + buf);
        softmax_scores<Bc / 8, !kMmaRowSums>(s, row_max, row_sum, p.scale_log2, alpha);
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
      }
      RingSlot cur = kv;
      for (int i = 1; i < tiles; ++i) {
        const RingSlot prev = cur;
        cur.advance<kStages>();
        const int buf = cur.stage, pbuf = prev.stage;
        mbar_wait(k_full + buf, cur.phase);
        const bool tile_masked = sMasked[buf] != 0;
        float s[Bc / 8][4];
        mbar_wait(v_full + pbuf, prev.phase);
        my_turn();
        scores(s, buf);
        pv(a, pbuf);  // tile i - 1
        pass_turn();
        wgmma_wait<1>();    // the scores; P·V may still run
        pin(s);
        if (tile_masked) add_key_bias(s, sKeyBias + buf * Bc, quad_col);
        release(k_empty + buf);
        softmax_scores<Bc / 8, !kMmaRowSums>(s, row_max, row_sum, p.scale_log2, alpha);
        wgmma_wait<0>();  // P·V of tile i - 1: o and a are free
        pin(o);
        pin(a);
        release(v_empty + pbuf);
        rescale_rows(o, alpha);
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
      }
      const RingSlot last = cur;
      mbar_wait(v_full + last.stage, last.phase);
      my_turn();
      pv(a, last.stage);
      pass_turn();
      wgmma_wait<0>();
      pin(o);
      release(v_empty + last.stage);
      kv = last;
      kv.advance<kStages>();
    }

    // ---- epilogue, staged through this warp's own 16 rows of the Q slot (the last wgmma
    // reading them has landed); then the slot goes back to the producer.
    const int warp_row0 = c * 64 + (warp % 4) * 16;
    unsigned char* q_slot = sQ + qs * Tile::kQBytes;
    if constexpr (kMmaRowSums) {
      row_sum[0] = o[D / 8][0];  // each lane's column of the ones: the whole row
      row_sum[1] = o[D / 8][2];
    }
    store_output<T, D, !kMmaRowSums>(
        o, row_sum, seq,
        [&](int row, int chunk) { return q_slot + panel_offset<Br>(warp_row0 + row, chunk); },
        q0 + warp_row0, lane);
    // The slot is refilled by TMA (the async proxy) after these generic reads and writes.
    fence_proxy_async();
    release(q_empty + qs);
  }
}

// The driver's tensor-map encoder, looked up once through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    FTBERT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                       cudaEnableDefault, &found));
    FTBERT_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                 "flash attention: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// qkv [rows, 3H] as TMA sees it: boxes of 64 columns (a panel of a head's Q, K or V) by
// kBoxRows rows, 128-byte swizzled as the wgmma descriptors read them; rows past the tensor read
// as zeros.
template <typename T>
CUtensorMap qkv_tensor_map(const FlashParams& p, int head_dim) {
  const cuuint64_t cols = 3ull * p.heads * head_dim;
  const cuuint64_t dims[2] = {cols, static_cast<cuuint64_t>(p.rows)};
  const cuuint64_t strides[1] = {cols * sizeof(T)};  // bytes from a row to the next
  const cuuint32_t box[2] = {64, kBoxRows};
  const cuuint32_t steps[2] = {1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(
      &map, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      2, const_cast<void*>(p.qkv), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FTBERT_CHECK(r == CUDA_SUCCESS, "flash attention: cuTensorMapEncodeTiled failed (error "
                                      << static_cast<int>(r) << ") for " << p.rows << " rows of "
                                      << cols << " columns");
  return map;
}

// Persistent: one block per multiprocessor (at most one per work item).
template <typename T, int D, int kConsumers, int Bc, int kStages, int kConsumerRegs,
          bool kPingPong, bool kMmaRowSums = false>
void launch_sm90_ws(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  using Tile = WsTile<D, kConsumers, Bc, kStages, kMmaRowSums>;
  constexpr size_t smem = Tile::kSmemBytes;
  const CUtensorMap map = qkv_tensor_map<T>(p, D);
  auto kernel = flash_attention_sm90_ws_kernel<T, D, kConsumers, Bc, kStages, kConsumerRegs,
                                               kPingPong, kMmaRowSums>;
  static std::atomic<uint64_t> raised_on{0};
  allow_shared_memory(kernel, smem, device, raised_on);
  const int64_t items = static_cast<int64_t>((p.seq + Tile::Br - 1) / Tile::Br) * p.heads * batch;
  const int blocks = static_cast<int>(std::min<int64_t>(items, multiprocessor_count(device)));
  launch(kernel, blocks, Tile::kThreads, smem, stream, p, batch, map);
  FTBERT_LAUNCH_CHECK("flash_attention_sm90_ws_kernel", stream);
}

}  // namespace
}  // namespace ftbert::cuda
