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
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
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
  static constexpr int kStages = 2;
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
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
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
  auto load_kv = [&](int tile, int buf) {  // returns whether this thread saw a masked key
    unsigned char* dk = sK + buf * Tile::kKVBytes;
    unsigned char* dv = sV + buf * Tile::kKVBytes;
    return seq.template load_kv<Bc, kThreads>(
        tile * Bc, [&](int row, int chunk) { return dk + sw128(row, chunk); },
        [&](int row, int chunk) { return dv + sw128(row, chunk); }, sKeyBias + buf * Bc);
  };

  // Groups: Q, then one per key tile, kStages - 1 tiles ahead; every stage commits a group,
  // empty or not, so the wait counts stay uniform.
  int masked_bits = 0;  // bit `buf`: this thread's key-bias entries of that buffer hold a masked key
  seq.template load_q<Br, kThreads>(q0, q_at);
  cp_async_commit();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (t_begin + i < t_end) masked_bits |= (load_kv(t_begin + i, i) ? 1 : 0) << i;
    cp_async_commit();
  }

  // Q + bias, by the thread that copied each chunk.
  cp_async_wait<kStages - 1>();
  seq.template add_q_bias<Br, kThreads>(q_at);

  float o[D / 8][4];
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int quad_col = 2 * (lane % 4);
  const unsigned char* q_tile = sQ + wg * 64 * 128;  // this warpgroup's 64 rows

  // S = Q Kᵀ for the key tile in buffer `buf`, over the head dim in 4 k-steps of 16 (32 bytes
  // into each swizzled row); issued and committed, not waited for.
  auto issue_scores = [&](float (&s)[Bc / 8][4], int buf) {
    const unsigned char* k_tile = sK + buf * Tile::kKVBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      Wgmma<T>::ss(s, sw128_desc(q_tile + 32 * kk, 16), sw128_desc(k_tile + 32 * kk, 16), kk);
    }
    wgmma_commit();
  };
  // The softmax step on the (complete) scores of the tile in buffer `buf`, then O += P V issued
  // and committed with P in `a`, over the tile's keys in k-steps of 16 (2048 bytes of V each).
  auto softmax_issue_pv = [&](float (&s)[Bc / 8][4], int buf, bool tile_masked,
                              uint32_t (&a)[Bc / 16][4]) {
    if (tile_masked) add_key_bias(s, sKeyBias + buf * Bc, quad_col);
    online_softmax(s, o, row_max, row_sum, scale_log2);
    const unsigned char* v_tile = sV + buf * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) weights_fragment<T>(s, kk, a[kk]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      Wgmma<T>::rs(o, a[kk], sw128_desc(v_tile + 2048 * kk, 1024));
    }
    wgmma_commit();
  };
  // After this thread's copies of the tile in `buf` have landed: fences them (and the Q fix-up)
  // for wgmma and publishes them with a barrier, which also ORs the tile's masked-key bits.
  auto publish = [&](int buf) {
    fence_proxy_async();
    return __syncthreads_or((masked_bits >> buf) & 1) != 0;
  };
  auto refill = [&](int tile, int buf) {
    if (tile < t_end) {
      masked_bits = (masked_bits & ~(1 << buf)) | ((load_kv(tile, buf) ? 1 : 0) << buf);
    }
    cp_async_commit();
  };

  uint32_t a[Bc / 16][4];  // P of the current tile, read by the tensor cores until waited for
  int buf = 0;
  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait<0>();  // this thread's copies of tile t have landed
    // Every thread's copies of tile t are visible (to wgmma too), every warp is done with tile
    // t - 1 (its wgmma were waited for), whose buffer is refilled next.
    const bool tile_masked = publish(buf);
    refill(t + 1, buf ^ 1);
    float s[Bc / 8][4];
    issue_scores(s, buf);
    wgmma_wait_all();
    pin(s);
    softmax_issue_pv(s, buf, tile_masked, a);
    wgmma_wait_all();
    pin(o);
    pin(a);
    buf ^= 1;
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
// (164 registers, 74 KiB of shared memory each). Measured on an H100 against 1 or 2 warpgroups
// with 64-key tiles and against 2 or 3 warpgroups with 128-key tiles, and against computing the
// next tile's scores before the current softmax (three buffers, two blocks per multiprocessor):
// this one was fastest or within 3% at batch 32 x 128/512 tokens, batch 1 x 128 and 3 x 197.
template <typename T>
void launch_flash_sm90(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  launch_sm90<T, 1, 128, 3>(p, batch, device, stream);
}
template void launch_flash_sm90<__half>(const FlashParams&, int, int, cudaStream_t);
template void launch_flash_sm90<__nv_bfloat16>(const FlashParams&, int, int, cudaStream_t);

}  // namespace ftbert::cuda
