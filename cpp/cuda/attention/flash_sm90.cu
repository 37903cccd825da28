// Fused attention for Hopper (sm_90a): the algorithm, inputs and outputs of flash.cu's kernel,
// with both matrix products on warpgroup MMA (wgmma) instead of mma.sync. Head dim 64 (BERT-base
// and BERT-large); flash.cu's kernel covers the other head dims and other GPUs.
//
// What changes against flash.cu:
//   - A block is kWarpgroups warpgroups (4 warps each); a warpgroup owns 64 query rows, and each
//     of its warps the same 16 rows as in flash.cu, in the same register layout (the m64nN
//     accumulator of wgmma is, per warp, the m16n8 layout of mma.sync), so the masking, online
//     softmax, P packing and epilogue are the shared ones (flash_common.cuh).
//   - S = Q Kᵀ: wgmma m64n{Bc}k16 with both operands read by the tensor cores straight from
//     shared memory (Q and K tiles, K-major). O += P V: wgmma m64n64k16 with P from registers and
//     V from shared memory (MN-major, transposed by the instruction).
//   - Shared tiles use the 128-byte swizzle wgmma reads: a row of 64 elements is 128 bytes, and
//     the 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so rows 8 apart start in the
//     same banks but the 8 rows of a group never collide. Tiles start on 1024-byte boundaries.
//   - cp.async writes shared memory through the generic proxy and wgmma reads it through the
//     async proxy, so every thread fences (fence.proxy.async) after its copies land and before
//     the barrier that publishes them.
//   - wgmma runs asynchronously: each batch is fenced (wgmma.fence), committed, and waited for
//     before its accumulators are read; the accumulator registers are pinned across the wait.
//   - The schedule overlaps the two products of neighbouring key tiles: the scores of tile t are
//     issued right behind P·V of tile t - 1, and the softmax of tile t runs while that P·V
//     finishes (the accumulator is rescaled only after it lands). The next tile's copies are
//     issued while the scores compute, its mask read ahead into a register.
#include "cuda/attention/flash_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

#include "cuda/attention/flash_common.cuh"
#include "cuda/cuda_check.h"

namespace ftbert::cuda {
namespace {

using namespace flash_detail;

// wgmma with f32 accumulators d (the m64nN tile of this warpgroup, per-warp layout as in
// flash_common.cuh). ss: A and B from shared memory (descriptors), both K-major; d = A·B, or
// d += A·B when `accumulate`. rs: A from registers (the mma.sync A fragment layout), B from
// shared memory MN-major (transposed), d += A·B.
template <typename T>
struct Wgmma;

// The instructions, one text per shape with the input type (TY: "f16" or "bf16") filled in.
#define FTBERT_WGMMA_SS_N64(TY) \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY "\n" \
        "{" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "l"(a), "l"(b), "r"(accumulate))
#define FTBERT_WGMMA_SS_N128(TY) \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY "\n" \
        "{" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
        : "l"(a), "l"(b), "r"(accumulate))
#define FTBERT_WGMMA_RS_N64(TY) \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY "\n" \
        "{" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

template <>
struct Wgmma<__half> {
  static __device__ __forceinline__ void ss(float (&d)[8][4], uint64_t a, uint64_t b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N64("f16");
  }
  static __device__ __forceinline__ void ss(float (&d)[16][4], uint64_t a, uint64_t b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N128("f16");
  }
  static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],
                                            uint64_t b) {
    FTBERT_WGMMA_RS_N64("f16");
  }
};

template <>
struct Wgmma<__nv_bfloat16> {
  static __device__ __forceinline__ void ss(float (&d)[8][4], uint64_t a, uint64_t b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N64("bf16");
  }
  static __device__ __forceinline__ void ss(float (&d)[16][4], uint64_t a, uint64_t b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N128("bf16");
  }
  static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],
                                            uint64_t b) {
    FTBERT_WGMMA_RS_N64("bf16");
  }
};

#undef FTBERT_WGMMA_SS_N64
#undef FTBERT_WGMMA_SS_N128
#undef FTBERT_WGMMA_RS_N64

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed wgmma groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Registers a wgmma reads or writes asynchronously, pinned after the wait that completes it:
// accumulators look modified here (so their reads stay below the wait), and A fragments look
// used here (so the compiler cannot hand their registers to other values while the tensor
// cores may still read them).
template <int N>
__device__ __forceinline__ void pin(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
  }
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[j][i])::"memory");
  }
}

// Shared-memory matrix descriptor of a 128-byte-swizzled tile (rows of 128 bytes, 8-row groups
// 1024 bytes apart). `lead` is the leading-dimension byte offset, used by MN-major operands only.
__device__ __forceinline__ uint64_t sw128_desc(const void* smem, uint32_t lead) {
  uint64_t d = (smem_addr(smem) & 0x3FFFF) >> 4;  // start address, 16-byte units
  d |= static_cast<uint64_t>(lead >> 4) << 16;    // leading-dimension byte offset
  d |= static_cast<uint64_t>(1024 >> 4) << 32;    // stride byte offset: the next 8 rows
  d |= static_cast<uint64_t>(1) << 62;            // 128-byte swizzle
  return d;
}

// Byte offset of the 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile.
__device__ __forceinline__ int sw128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <int kWarpgroups, int Bc>
struct Sm90Tile {
  static constexpr int D = 64;  // one 128-byte swizzle row per key / query (16-bit types)
  static constexpr int Br = 64 * kWarpgroups;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kQBytes = Br * 128;
  static constexpr int kKVBytes = Bc * 128;
  static constexpr int kStages = 2;  // the schedule alternates two buffers (buf ^ 1)
  // [align pad] sQ | sK [2] | sV [2] | key bias [2][Bc] fp32 | key range scratch
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes +
                                       kStages * Bc * sizeof(float) + kThreads / 32 * 2 * sizeof(int);
};

template <typename T, int kWarpgroups, int Bc, int kMinBlocks>
__global__ void __launch_bounds__(kWarpgroups * 128, kMinBlocks)
    flash_attention_sm90_kernel(FlashParams p) {
  using Tile = Sm90Tile<kWarpgroups, Bc>;
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
  int* sRange = reinterpret_cast<int*>(sKeyBias + kStages * Bc);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wg = warp / 4;
  const int q0 = blockIdx.x * Br;
  const SequenceRows<T, D> seq(p, blockIdx.z, blockIdx.y);
  if (q0 >= seq.len) return;  // past this sequence's end (packed batches); uniform per block
  const float scale_log2 = p.scale_log2;

  int t_begin, t_end;
  seq.template key_tiles<kThreads, Bc>(sRange, t_begin, t_end);

  // ---- loads: 8 chunks of 16 bytes per row, into the swizzled tiles.
  auto q_at = [&](int row, int chunk) { return sQ + sw128(row, chunk); };
  // bit `buf`: this thread's key-bias entries of that buffer hold a masked key
  int masked_bits = 0;
  auto write_key_bias = [&](uint32_t kept, int buf) {
    const bool masked = seq.template write_key_bias<Bc, kThreads>(kept, sKeyBias + buf * Bc);
    masked_bits = (masked_bits & ~(1 << buf)) | ((masked ? 1 : 0) << buf);
  };

  float o[D / 8][4];
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int quad_col = 2 * (lane % 4);
  const unsigned char* q_tile = sQ + wg * 64 * 128;  // this warpgroup's 64 rows

  // Descriptors built once: a descriptor's low bits are the start address in 16-byte units, so
  // a tile or k-step further on is the same descriptor plus its byte offset / 16 (shared memory
  // ends well below where that field would carry).
  const uint64_t q_desc = sw128_desc(q_tile, 16);
  const uint64_t k_desc = sw128_desc(sK, 16);
  const uint64_t v_desc = sw128_desc(sV, 1024);
  constexpr uint64_t kTileStep = Tile::kKVBytes / 16;

  // S = Q Kᵀ for the key tile in buffer `buf`, over the head dim in 4 k-steps of 16 (32 bytes
  // into each swizzled row); issued and committed, not waited for.
  auto issue_scores = [&](float (&s)[Bc / 8][4], int buf) {
    const uint64_t k_tile = k_desc + buf * kTileStep;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) Wgmma<T>::ss(s, q_desc + 2 * kk, k_tile + 2 * kk, kk);
    wgmma_commit();
  };
  // O += P V issued and committed with P in `a`, over the keys of the tile in buffer `buf` in
  // k-steps of 16 (2048 bytes of V each).
  auto issue_pv = [&](const uint32_t (&a)[Bc / 16][4], int buf) {
    const uint64_t v_tile = v_desc + buf * kTileStep;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) Wgmma<T>::rs(o, a[kk], v_tile + 128 * kk);
    wgmma_commit();
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
        tile * Bc, [&](int row, int chunk) { return dk + sw128(row, chunk); });
  };
  auto copy_v = [&](int tile, int buf) {
    unsigned char* dv = sV + buf * Tile::kKVBytes;
    seq.template copy_rows<2, Bc, kThreads>(
        tile * Bc, [&](int row, int chunk) { return dv + sw128(row, chunk); });
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
      issue_scores(s, 0);
      const uint32_t next_kept = copy_next(t_begin, 0);
      wgmma_wait<0>();
      pin(s);
      if (tile_masked) add_key_bias(s, sKeyBias, quad_col);
      softmax_scores(s, row_max, row_sum, scale_log2, alpha);
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
      if (t_begin + 1 < t_end) write_key_bias(next_kept, 1);  // published by the next barrier
    }
    int buf = 1;  // the buffers of tile t (K, V, key bias)
    for (int t = t_begin + 1; t < t_end; ++t) {
      cp_async_wait<0>();  // K of tile t and V of tile t - 1 have landed
      // Every thread's copies are visible (to wgmma too); every warp is done with the scores of
      // tile t - 1 and with P·V of tile t - 2, whose buffers are refilled next.
      const bool tile_masked = publish(buf);
      float s[Bc / 8][4];
      issue_scores(s, buf);
      issue_pv(a, buf ^ 1);  // tile t - 1
      const uint32_t next_kept = copy_next(t, buf);
      wgmma_wait<1>();  // the scores; P·V may still run
      pin(s);
      if (tile_masked) add_key_bias(s, sKeyBias + buf * Bc, quad_col);
      softmax_scores(s, row_max, row_sum, scale_log2, alpha);
      wgmma_wait<0>();  // P·V of tile t - 1: o and a are free
      pin(o);
      pin(a);
      rescale_rows(o, alpha);
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
      if (t + 1 < t_end) write_key_bias(next_kept, buf ^ 1);  // published by the next barrier
      buf ^= 1;
    }
    // P·V of the last tile, once the last iteration's copy of its V has landed everywhere.
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    issue_pv(a, buf ^ 1);
    wgmma_wait<0>();
    pin(o);
  }
  // A block with no unmasked key ran no tile, hence no barrier yet: order the Q fix-up above
  // before the epilogue reuses the Q rows.
  if (t_begin == t_end) __syncthreads();

  // ---- epilogue: O / l + b_v, staged through this warp's own 16 Q rows (swizzled, so the
  // 4-byte writes of a warp spread over the banks) for 16-byte stores.
  __syncwarp();
  const int warp_row0 = wg * 64 + (warp % 4) * 16;
  unsigned char* so = sQ + warp_row0 * 128;
  const int g = lane / 4;
  const T* bias_v = seq.bias + 2 * seq.H;
  float inv_sum[2], has_keys[2];
  finish_rows(row_sum, inv_sum, has_keys);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = 8 * n + quad_col;
    const float2 bv = Mma<T>::unpack(__ldg(reinterpret_cast<const unsigned int*>(bias_v + col)));
    *reinterpret_cast<uint32_t*>(so + sw128(g, n) + 2 * quad_col) =
        Mma<T>::pack(fmaf(o[n][0], inv_sum[0], bv.x * has_keys[0]),
                     fmaf(o[n][1], inv_sum[0], bv.y * has_keys[0]));
    *reinterpret_cast<uint32_t*>(so + sw128(g + 8, n) + 2 * quad_col) =
        Mma<T>::pack(fmaf(o[n][2], inv_sum[1], bv.x * has_keys[1]),
                     fmaf(o[n][3], inv_sum[1], bv.y * has_keys[1]));
  }
  __syncwarp();
  seq.template store_rows<16>(q0 + warp_row0,
                              [&](int row, int chunk) { return so + sw128(row, chunk); }, lane);
}

template <typename T, int kWarpgroups, int Bc, int kMinBlocks>
void launch_sm90(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  using Tile = Sm90Tile<kWarpgroups, Bc>;
  constexpr size_t smem = Tile::kSmemBytes;
  auto kernel = flash_attention_sm90_kernel<T, kWarpgroups, Bc, kMinBlocks>;
  static std::atomic<uint64_t> raised_on{0};
  allow_shared_memory(kernel, smem, device, raised_on);
  kernel<<<flash_grid(p, batch, Tile::Br), Tile::kThreads, smem, stream>>>(p);
  FTBERT_LAUNCH_CHECK("flash_attention_sm90_kernel", stream);
}

}  // namespace

// One warpgroup (64 query rows) per block, 128-key tiles, three blocks per multiprocessor
// (168 registers, 74 KiB of shared memory each). Measured on an H100 against 1 or 2 warpgroups
// with 64-key tiles and against 2 or 3 warpgroups with 128-key tiles: this one was fastest or
// within 3% at batch 32 x 128/512 tokens, batch 1 x 128 and 3 x 197. The overlapped schedule,
// unrolled copies and four-chain row reductions (benchmarks/kernels/flash_variants.cu, L2 flushed,
// medians of one run before and one after): batch 32 x 512 106 -> 95 us (243 -> 272 TFLOP/s),
// 32 x 128 21.6 -> 19.1 us, 1 x 128 8.5 -> 8.2 us, 3 x 197 11.5 -> 11.0 us.
template <typename T>
void launch_flash_sm90(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  launch_sm90<T, 1, 128, 3>(p, batch, device, stream);
}
template void launch_flash_sm90<__half>(const FlashParams&, int, int, cudaStream_t);
template void launch_flash_sm90<__nv_bfloat16>(const FlashParams&, int, int, cudaStream_t);

}  // namespace ftbert::cuda
