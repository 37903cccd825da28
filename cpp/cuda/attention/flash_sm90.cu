// Fused attention for Hopper (sm_90a): the algorithm, inputs and outputs of flash.cu's kernel,
// with both matrix products on warpgroup MMA (wgmma) instead of mma.sync. Head dims 64 (BERT-base
// and BERT-large) and 128; flash.cu's kernel covers the other head dims and other GPUs.
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
//     Head dim 128 keeps a tile as two such 64-column panels, one after the other: the scores'
//     k-steps move to the second panel halfway, and P·V's V descriptor steps between them.
//   - cp.async writes shared memory through the generic proxy and wgmma reads it through the
//     async proxy, so every thread fences (fence.proxy.async) after its copies land and before
//     the barrier that publishes them.
//   - wgmma runs asynchronously: each batch is fenced (wgmma.fence), committed, and waited for
//     before its accumulators are read; the accumulator registers are pinned across the wait.
//   - The schedule overlaps the two products of neighbouring key tiles: the scores of tile t are
//     issued right behind P·V of tile t - 1, and the softmax of tile t runs while that P·V
//     finishes (the accumulator is rescaled only after it lands). The next tile's copies are
//     issued while the scores compute, its mask read ahead into a register.
//
// Two kernels run that algorithm (launch_flash_sm90 picks by grid size): one where every block
// copies its own tiles with cp.async (a block is 1-2 warpgroups, several blocks per
// multiprocessor), and a persistent warp-specialized one where a producer warp loads tiles with
// TMA for consumer warpgroups that take turns at the tensor cores (see its section below).
#include "cuda/attention/flash_sm90.h"

#include <cuda.h>  // CUtensorMap; the encoder is looked up at run time (no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/flash_common.cuh"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "ftbert/check.h"

namespace ftbert::cuda {
namespace {

using namespace flash_detail;

// wgmma with f32 accumulators d (the m64nN tile of this warpgroup, per-warp layout as in
// flash_common.cuh). ss: A and B from shared memory (descriptors), both K-major; d = A·B, or
// d += A·B when `accumulate`. rs: A from registers (the mma.sync A fragment layout), B from
// shared memory MN-major (transposed), d += A·B.
template <typename T>
struct Wgmma;

// A shared-memory matrix descriptor (sw128_desc) as its two words. The low word holds the start
// address (16-byte units, bits 0-13) and the leading-dimension offset; a tile or k-step further on
// is a 32-bit add to it, which cannot carry out of the address field (shared memory ends below
// 2^18 bytes). As one 64-bit value every such add was an add with carry plus copies of the high
// word, per descriptor and key tile.
struct SmemDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ SmemDesc operator+(uint32_t step) const { return {lo + step, hi}; }
};

// The instructions, one text per shape with the input type (TY: "f16" or "bf16") filled in. The
// accumulators are operands %0.. of each (8 or 16 blocks of 4 per thread), listed once here.
#define FTBERT_WGMMA_ACC8 \
          "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define FTBERT_WGMMA_ACC9 \
    FTBERT_WGMMA_ACC8, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3])
#define FTBERT_WGMMA_ACC16 \
    FTBERT_WGMMA_ACC8, \
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define FTBERT_WGMMA_REGS32 \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FTBERT_WGMMA_REGS36 FTBERT_WGMMA_REGS32 ", %32, %33, %34, %35"
#define FTBERT_WGMMA_REGS64 \
        FTBERT_WGMMA_REGS32 "," \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FTBERT_WGMMA_SS_N64(TY) \
    asm volatile("{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %36, 0;\n" \
                 "mov.b64 da, {%32, %33};\nmov.b64 db, {%34, %35};\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY "\n" \
                 "{" FTBERT_WGMMA_REGS32 "}, da, db, p, 1, 1, 0, 0;\n}\n" \
                 : FTBERT_WGMMA_ACC8 \
                 : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(accumulate))
#define FTBERT_WGMMA_SS_N128(TY) \
    asm volatile("{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %68, 0;\n" \
                 "mov.b64 da, {%64, %65};\nmov.b64 db, {%66, %67};\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY "\n" \
                 "{" FTBERT_WGMMA_REGS64 "}, da, db, p, 1, 1, 0, 0;\n}\n" \
                 : FTBERT_WGMMA_ACC16 \
                 : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(accumulate))
#define FTBERT_WGMMA_RS_N64(TY) \
    asm volatile("{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %38, 0;\n" \
                 "mov.b64 db, {%36, %37};\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY "\n" \
                 "{" FTBERT_WGMMA_REGS32 "}, {%32, %33, %34, %35}, db, p, 1, 1, 1;\n}\n" \
                 : FTBERT_WGMMA_ACC8 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.lo), "r"(b.hi), "r"(1))
#define FTBERT_WGMMA_RS_N72(TY) \
    asm volatile("{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %42, 0;\n" \
                 "mov.b64 db, {%40, %41};\n" \
                 "wgmma.mma_async.sync.aligned.m64n72k16.f32." TY "." TY "\n" \
                 "{" FTBERT_WGMMA_REGS36 "}, {%36, %37, %38, %39}, db, p, 1, 1, 1;\n}\n" \
                 : FTBERT_WGMMA_ACC9 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.lo), "r"(b.hi), "r"(1))
#define FTBERT_WGMMA_RS_N128(TY) \
    asm volatile("{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %70, 0;\n" \
                 "mov.b64 db, {%68, %69};\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY "\n" \
                 "{" FTBERT_WGMMA_REGS64 "}, {%64, %65, %66, %67}, db, p, 1, 1, 1;\n}\n" \
                 : FTBERT_WGMMA_ACC16 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.lo), "r"(b.hi), "r"(1))

template <>
struct Wgmma<__half> {
  static __device__ __forceinline__ void ss(float (&d)[8][4], SmemDesc a, SmemDesc b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N64("f16");
  }
  static __device__ __forceinline__ void ss(float (&d)[16][4], SmemDesc a, SmemDesc b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N128("f16");
  }
  static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],
                                            SmemDesc b) {
    FTBERT_WGMMA_RS_N64("f16");
  }
  static __device__ __forceinline__ void rs(float (&d)[16][4], const uint32_t (&a)[4],
                                            SmemDesc b) {
    FTBERT_WGMMA_RS_N128("f16");
  }
  static __device__ __forceinline__ void rs(float (&d)[9][4], const uint32_t (&a)[4],
                                            SmemDesc b) {
    FTBERT_WGMMA_RS_N72("f16");
  }
};

template <>
struct Wgmma<__nv_bfloat16> {
  static __device__ __forceinline__ void ss(float (&d)[8][4], SmemDesc a, SmemDesc b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N64("bf16");
  }
  static __device__ __forceinline__ void ss(float (&d)[16][4], SmemDesc a, SmemDesc b,
                                            int accumulate) {
    FTBERT_WGMMA_SS_N128("bf16");
  }
  static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],
                                            SmemDesc b) {
    FTBERT_WGMMA_RS_N64("bf16");
  }
  static __device__ __forceinline__ void rs(float (&d)[16][4], const uint32_t (&a)[4],
                                            SmemDesc b) {
    FTBERT_WGMMA_RS_N128("bf16");
  }
  static __device__ __forceinline__ void rs(float (&d)[9][4], const uint32_t (&a)[4],
                                            SmemDesc b) {
    FTBERT_WGMMA_RS_N72("bf16");
  }
};

#undef FTBERT_WGMMA_SS_N64
#undef FTBERT_WGMMA_SS_N128
#undef FTBERT_WGMMA_RS_N64
#undef FTBERT_WGMMA_RS_N128
#undef FTBERT_WGMMA_RS_N72
#undef FTBERT_WGMMA_ACC9
#undef FTBERT_WGMMA_REGS36
#undef FTBERT_WGMMA_ACC8
#undef FTBERT_WGMMA_ACC16
#undef FTBERT_WGMMA_REGS32
#undef FTBERT_WGMMA_REGS64

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
__device__ __forceinline__ SmemDesc sw128_desc(const void* smem, uint32_t lead) {
  SmemDesc d;
  d.lo = (smem_addr(smem) & 0x3FFFF) >> 4;  // start address, 16-byte units
  d.lo |= (lead >> 4) << 16;                // leading-dimension byte offset
  d.hi = 1024 >> 4;                         // bits 32-45: stride byte offset, the next 8 rows
  d.hi |= 1u << (62 - 32);                  // bit 62: 128-byte swizzle
  return d;
}

// Byte offset of the 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile.
__device__ __forceinline__ int sw128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}
// A tile of kRows rows of D elements is D / 64 such swizzled panels of 64 columns, one after the
// other (the 128-byte swizzle covers 64 16-bit columns): byte offset of chunk `chunk` (0..D/8-1)
// of row `row`.
template <int kRows>
__device__ __forceinline__ int panel_offset(int row, int chunk) {
  return (chunk / 8) * (kRows * 128) + sw128(row, chunk % 8);
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// S = Q Kᵀ for one key tile (k_tile: its descriptor), over the head dim in k-steps of 16: 32
// bytes into a swizzled row, 4 per panel. q_panel / k_panel: the descriptor step from one 64-column
// panel of the tile to the next (bytes / 16).
template <typename T, int D, int Bc>
__device__ __forceinline__ void issue_scores(float (&s)[Bc / 8][4], SmemDesc q_desc,
                                             uint32_t q_panel, SmemDesc k_tile, uint32_t k_panel) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t panel = kk / 4, step = 2 * (kk % 4);
    Wgmma<T>::ss(s, q_desc + (panel * q_panel + step), k_tile + (panel * k_panel + step), kk);
  }
  wgmma_commit();
}
// O += P V with P in `a`, over the keys of one tile (v_tile: its descriptor, whose leading
// dimension offset steps from one 64-column panel to the next) in k-steps of 16 (2048 bytes of
// each panel); issued and committed, not waited for. O's width is kOutBlocks x 8 columns: the
// head dim, or 8 more when V is followed by a panel of ones (the row sums of P come out there).
template <typename T, int kOutBlocks, int Bc>
__device__ __forceinline__ void issue_pv(float (&o)[kOutBlocks][4], const uint32_t (&a)[Bc / 16][4],
                                         SmemDesc v_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) Wgmma<T>::rs(o, a[kk], v_tile + 128u * kk);
  wgmma_commit();
}

// A warp's epilogue: O / l + b_v for its 16 rows, staged through shared memory the warp owns
// (`at(row, chunk)`: 16 swizzled rows, so its 4-byte writes spread over the banks) for 16-byte
// stores of the sequence's rows row0..row0+15. O's first D / 8 blocks are the output (a kernel
// that sums rows through the tensor cores has one more); kQuadParts as finish_rows'.
template <typename T, int D, bool kQuadParts = true, int kOutBlocks, typename At>
__device__ __forceinline__ void store_output(const float (&o)[kOutBlocks][4],
                                             const float (&row_sum)[2],
                                             const SequenceRows<T, D>& seq, At at, int row0,
                                             int lane) {
  static_assert(kOutBlocks >= D / 8, "the output's columns");
  const int g = lane / 4, quad_col = 2 * (lane % 4);
  const T* bias_v = seq.bias + 2 * seq.H;
  float inv_sum[2], has_keys[2];
  finish_rows<kQuadParts>(row_sum, inv_sum, has_keys);
  __syncwarp();
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = 8 * n + quad_col;
    const float2 bv = Mma<T>::unpack(__ldg(reinterpret_cast<const unsigned int*>(bias_v + col)));
    *reinterpret_cast<uint32_t*>(at(g, n) + 2 * quad_col) =
        Mma<T>::pack(fmaf(o[n][0], inv_sum[0], bv.x * has_keys[0]),
                     fmaf(o[n][1], inv_sum[0], bv.y * has_keys[0]));
    *reinterpret_cast<uint32_t*>(at(g + 8, n) + 2 * quad_col) =
        Mma<T>::pack(fmaf(o[n][2], inv_sum[1], bv.x * has_keys[1]),
                     fmaf(o[n][3], inv_sum[1], bv.y * has_keys[1]));
  }
  __syncwarp();
  seq.template store_rows<16>(row0, at, lane);
}

template <int D_, int kWarpgroups, int Bc>
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
  // [align pad] sQ | sK [2] | sV [2] | key bias [2][Bc] fp32 | key range scratch
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes +
                                       kStages * Bc * sizeof(float) + kThreads / 32 * 2 * sizeof(int);
};

template <typename T, int D_, int kWarpgroups, int Bc, int kMinBlocks>
__global__ void __launch_bounds__(kWarpgroups * 128, kMinBlocks)
    flash_attention_sm90_kernel(FlashParams p) {
  begin_dependent_kernel();
  using Tile = Sm90Tile<D_, kWarpgroups, Bc>;
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

  // ---- loads: D / 8 chunks of 16 bytes per row, into the swizzled panels.
  auto q_at = [&](int row, int chunk) { return sQ + panel_offset<Br>(row, chunk); };
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
      scores(s, buf);
      pv(a, buf ^ 1);  // tile t - 1
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

template <typename T, int D, int kWarpgroups, int Bc, int kMinBlocks>
void launch_sm90(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  using Tile = Sm90Tile<D, kWarpgroups, Bc>;
  constexpr size_t smem = Tile::kSmemBytes;
  auto kernel = flash_attention_sm90_kernel<T, D, kWarpgroups, Bc, kMinBlocks>;
  static std::atomic<uint64_t> raised_on{0};
  allow_shared_memory(kernel, smem, device, raised_on);
  launch(kernel, flash_grid(p, batch, Tile::Br), Tile::kThreads, smem, stream, p);
  FTBERT_LAUNCH_CHECK("flash_attention_sm90_kernel", stream);
}


// ---- the warp-specialized kernel -------------------------------------------------------------
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
  // registers and moved it over (R2UR) after the turn to issue had come: 22 instructions more
  // per key tile (of 410) and the first wgmma 100 instead of 47 instructions into the tile (on an
  // H100, back to back: 32 x 512 80.6-80.8 -> 79.7-79.9 us, 128 x 128 42.2-42.3 -> 40.7-41.4,
  // 32 x 128 11.8-11.9 -> 12.0).
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

// The kernel by head dim and shape, from benchmarks/kernels/flash_variants.cu on an H100 (L2
// flushed, medians of 100, float16). Head dim 64, one run (32 x 512 / 32 x 128 / 1 x 128 / 3 x 197
// tokens, 12 heads, us):
//   one warpgroup per block, 128-key tiles, 3 blocks per SM   94.8  18.9  8.0  10.8
//   persistent, 2 consumers taking turns, 2-stage ring         92.4  18.0  8.9  12.1
//     (the same without turns                                  92.4  18.2  8.9  12.3)
//     (the same with row sums through the tensor cores         90.4  18.1  8.8  12.1)
//   persistent, 3 consumers of 160 registers taking turns,     87.5  19.7  9.6  13.6
//     3-stage ring
//     (the same with row sums through the tensor cores         84.8  20.4 10.1  14.2)
// The persistent kernels run with the row sums through the tensor cores (WsTile's kMmaRowSums).
// The persistent kernels win once there are two work items per multiprocessor; three consumers
// (192 query rows an item) only on long sequences, where an item's rows are mostly used. Below
// that grid the one-warpgroup kernel's several independent blocks per multiprocessor win, and so
// they do at any grid when sequences are at most 64 long, where a 128-row item is half padding
// (flash_variants scan, back to back, us: S = 64, batch 32 / 64 / 128: persistent 13.5 / 24.0 /
// 51.7, one-warpgroup 7.1 / 11.8 / 27.1; at S = 128 the persistent kernel from batch 64: 25.0
// against 27.6, 43.0 against 50.4 at 128).
// Head dim 128, one run (32 x 512 / 32 x 128 tokens with 8 heads, 1 x 128 with 16, us):
//   persistent, 2 consumers of 240 registers taking turns, 2-stage ring   90.0  22.5  11.1
//     (the same with 64-key tiles and a 3-stage ring                      110.6  22.5  11.1)
//   one warpgroup per block, 64-key tiles, 2 blocks per SM                129.1  24.3  10.5
//   one warpgroup per block, 128-key tiles (1 block per SM: 144 KiB)      175.3  32.6   9.8
//   two warpgroups per block, 128-key tiles                               122.3  24.2  10.6
//   (flash.cu's kernel                                                    164.1  27.6   9.9)
// Twice the head dim is twice the products per exponential, so the persistent kernel already wins
// from about one work item per multiprocessor (32 x 128: 256 items for 132); on smaller grids the
// one-warpgroup kernel, with 128-key tiles while its blocks fit one wave.
template <typename T>
void launch_flash_sm90(const FlashParams& p, int batch, int head_dim, int device,
                       cudaStream_t stream) {
  // These kernels leave the relative position bias and the sliding window out; flash.cu runs
  // calls that have one.
  FTBERT_CHECK(p.relative_bias == nullptr, "flash attention (Hopper): no relative position bias");
  FTBERT_CHECK(p.window == 0, "flash attention (Hopper): no sliding window");
  const int64_t sms = multiprocessor_count(device);
  const auto items = [&](int rows) {
    return static_cast<int64_t>((p.seq + rows - 1) / rows) * p.heads * batch;
  };
  if (head_dim == 128) {
    if (items(128) >= sms && items(128) <= INT32_MAX) {
      launch_sm90_ws<T, 128, 2, 128, 2, 240, true>(p, batch, device, stream);
    } else if (items(64) <= sms) {
      launch_sm90<T, 128, 1, 128, 1>(p, batch, device, stream);
    } else {
      launch_sm90<T, 128, 1, 64, 2>(p, batch, device, stream);
    }
    return;
  }
  FTBERT_CHECK(head_dim == 64, "flash attention (Hopper): head dim " << head_dim);
  if (p.seq >= 384 && items(192) >= 2 * sms && items(192) <= INT32_MAX) {
    launch_sm90_ws<T, 64, 3, 128, 3, 160, true, true>(p, batch, device, stream);
  } else if (p.seq > 64 && items(128) >= 2 * sms && items(128) <= INT32_MAX) {
    launch_sm90_ws<T, 64, 2, 128, 2, 0, true, true>(p, batch, device, stream);
  } else {
    launch_sm90<T, 64, 1, 128, 3>(p, batch, device, stream);
  }
}
template void launch_flash_sm90<__half>(const FlashParams&, int, int, int, cudaStream_t);
template void launch_flash_sm90<__nv_bfloat16>(const FlashParams&, int, int, int, cudaStream_t);

}  // namespace ftbert::cuda
