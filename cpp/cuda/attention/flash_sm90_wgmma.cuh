// The warpgroup-MMA (wgmma) side of flash_sm90.cu's two kernels: the instructions and their
// ordering, the shared-memory descriptors and the 128-byte swizzle, and the device helpers both
// kernels share (the two products of a key tile, the epilogue).
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
//   - wgmma runs asynchronously: each batch is fenced (wgmma.fence), committed, and waited for
//     before its accumulators are read; the accumulator registers are pinned across the wait.
// (The copies and the schedule: flash_sm90_cpasync.cuh.)
//
// For flash_sm90.cu's translation unit alone (it and its parts include this): the definitions
// sit in that unit's anonymous namespace, as they did when the kernels were one file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/flash_common.cuh"

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

}  // namespace
}  // namespace ftbert::cuda
