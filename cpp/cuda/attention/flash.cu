// Fused attention, FlashAttention-2 style, for BERT encoders:
//   out[b, s, h*d + :] = softmax_j(scale * q_s · k_j, keys with mask[b, j] == 1) · v_j
// with q/k/v read straight from the QKV GEMM output [B, S, 3H] (bias not yet added) and the result
// written in the merged-heads layout [B, S, H] the output GEMM reads: no bias kernel, no score
// matrix in device memory, no transpose kernel.
//
// Algorithm (one thread block per Br query rows of one (batch, head)):
//   - Each warp owns 16 or 32 query rows (one or two 16-row mma tiles). Q (plus its bias) is
//     loaded once and kept in registers as mma A fragments.
//   - K/V tiles of Bc keys are staged in shared memory with 16-byte cp.async, double-buffered, and
//     shared by all warps. Each warp computes S = Q Kᵀ for its rows with mma.sync m16n8k16
//     (fp32 accumulation), masks it (only tiles that hold a masked key pay for this), and updates
//     the online softmax: running row max m and row sum l in fp32; when m grows the fp32
//     accumulator O is rescaled by exp2(m_old - m_new).
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
// Tile choice (Br query rows x Bc keys per step; 4 warps; measured on an H100 at BERT shapes):
//   - Each warp owns one or two 16-row mma tiles. With two (Br = 128, "wide"), every K/V
//     fragment read from shared memory feeds two mma instead of one, which cuts shared-memory
//     traffic and instructions per flop: 8-20% faster at batch 32. With one (Br = 64, "narrow")
//     a block does half the work, which is faster when the grid does not fill the GPU a couple of
//     times over (batch 1 x 128 tokens has 12-24 blocks for 132 SMs). The launcher picks wide when
//     it gives at least two blocks per SM.
//   - Bc = 64: 32 fp32 S registers per m-tile; 32-key tiles double the barriers per key, 128-key
//     tiles push the wide kernels past 255 registers.
//   - d = 128 runs narrow only: its O accumulator is already 64 registers per m-tile, and two
//     m-tiles would spill.
//   Registers per thread / shared memory per block (sm_90): d=32 narrow 102 / 25.5 KiB, wide
//   164 / 30.5 KiB; d=64 narrow 142 / 45.5 KiB, wide 226 / 54.5 KiB; d=128 195 / 85.5 KiB. Above
//   48 KiB needs the opt-in (cudaFuncSetAttribute).
#include "cuda/attention/flash.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.h"
#include "ftbert/check.h"

namespace ftbert::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------------
// kernels
// ---------------------------------------------------------------------------------------------

// Per-dtype pieces: packing two floats into one 32-bit mma operand register (lower half = lower
// column), unpacking, and the tensor-core instruction itself.
template <typename T>
struct Mma;

template <>
struct Mma<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2*>(&v));
  }
  // c[16x8] += a[16x16] (row-major) · b[16x8] (column-major), fp32 accumulators.
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

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

struct FlashParams {
  const void* qkv;      // [B, S, 3H]
  const void* bias;     // [3H]
  const int32_t* mask;  // [B, S]
  void* out;            // [B, S, H]
  int seq;
  int heads;
  float scale_log2;  // scale * log2(e)
};

// 2^x on the SFU. exp2f compiles to the same instruction plus a subnormal fix-up; here every
// argument is <= 0 (weights relative to the row max's 1), and a weight below 2^-126 is lost in
// the row sum anyway, so flushing it to zero changes nothing. exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int D, int Br, int Bc, int kWarps>
struct FlashTile {
  static_assert(D % 16 == 0, "head dim must be a multiple of 16 (mma k)");
  static_assert(Br % (16 * kWarps) == 0, "each warp owns whole 16-row mma tiles");
  static_assert(Bc % 16 == 0, "key tiles are whole mma k-steps of P·V");
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
  // sQ [Br][kStride] | sK [2][Bc][kStride] | sV [2][Bc][kStride] | key bias [2][Bc] fp32
  static constexpr size_t smem_bytes(size_t elem) {
    return (kQElems + 4 * kKVElems) * elem + 2 * Bc * sizeof(float);
  }
};

template <typename T, int D, int Br, int Bc, int kWarps, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) flash_attention_kernel(FlashParams p) {
  using Tile = FlashTile<D, Br, Bc, kWarps>;
  constexpr int kM = Tile::kMTiles;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kStride = Tile::kStride;
  constexpr int kChunks = Tile::kChunks;
  constexpr float kNegInf = -__builtin_huge_valf();

  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);                                   // [Br][kStride]
  T* sK = sQ + Tile::kQElems;                                           // [2][Bc][kStride]
  T* sV = sK + 2 * Tile::kKVElems;                                      // [2][Bc][kStride]
  float* sKeyBias = reinterpret_cast<float*>(sV + 2 * Tile::kKVElems);  // [2][Bc]: 0 or -inf
  __shared__ int sRange[2][kWarps];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int q0 = blockIdx.x * Br;
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int S = p.seq;
  const int H = p.heads * D;
  const float scale_log2 = p.scale_log2;
  // Row s of this (batch, head): Q at qkv + s*3H, K at + H, V at + 2H.
  const T* qkv = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * S * (3 * H) + head * D;
  const T* bias = static_cast<const T*>(p.bias) + head * D;
  const int32_t* mask = p.mask + static_cast<int64_t>(b) * S;

  // ---- the key range [lo, hi] holding every unmasked key of this sequence --------------------
  int lo = S, hi = -1;
  for (int i = tid; i < S; i += kThreads) {
    if (mask[i] != 0) {
      lo = min(lo, i);
      hi = max(hi, i);
    }
  }
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  if (lane == 0) {
    sRange[0][warp] = lo;
    sRange[1][warp] = hi;
  }
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    lo = min(lo, sRange[0][w]);
    hi = max(hi, sRange[1][w]);
  }
  const int t_begin = lo / Bc;
  const int t_end = hi < 0 ? t_begin : hi / Bc + 1;  // no unmasked key: no tiles, zero output

  // ---- loads ---------------------------------------------------------------------------------
  // Offsets inside one sequence fit in 32 bits (S * 3H elements); the base pointers carry the
  // 64-bit batch offset. Rows past S are zero-filled from a clamped (valid) address.
  static_assert(kThreads % kChunks == 0, "a thread copies the same column chunk of every row");
  constexpr int kRowStep = kThreads / kChunks;
  const int ld = 3 * H;
  const int my_row = tid / kChunks;
  const int my_col = (tid % kChunks) * 8;
  auto load_q = [&]() {
#pragma unroll
    for (int row = my_row; row < Br; row += kRowStep) {
      const int s = q0 + row;
      cp_async_16(sQ + row * kStride + my_col, qkv + (min(s, S - 1) * ld + my_col), s < S);
    }
  };
  // Returns whether this thread wrote a masked key (padding or past S) into the key bias.
  auto load_kv = [&](int tile, int buf) {
    const int k0 = tile * Bc;
    T* dk = sK + buf * Tile::kKVElems;
    T* dv = sV + buf * Tile::kKVElems;
#pragma unroll
    for (int row = my_row; row < Bc; row += kRowStep) {
      const int s = k0 + row;
      const int off = min(s, S - 1) * ld + my_col;
      cp_async_16(dk + row * kStride + my_col, qkv + (off + H), s < S);
      cp_async_16(dv + row * kStride + my_col, qkv + (off + 2 * H), s < S);
    }
    bool masked = false;
#pragma unroll
    for (int i = tid; i < Bc; i += kThreads) {
      const int s = k0 + i;
      const bool keep = s < S && mask[s] != 0;
      sKeyBias[buf * Bc + i] = keep ? 0.0f : kNegInf;
      masked |= !keep;
    }
    return masked;
  };

  // bit `buf`: this thread's key-bias entries of that buffer hold a masked key.
  int masked_bits = 0;
  load_q();
  cp_async_commit();
  if (t_begin < t_end) masked_bits = load_kv(t_begin, 0) ? 1 : 0;
  cp_async_commit();

  // Q + bias, in fp32, rounded once; each thread fixes the chunks it copied itself, which
  // cp.async.wait_group makes visible to it.
  cp_async_wait<1>();
  const uint4 bq = __ldg(reinterpret_cast<const uint4*>(bias + my_col));
#pragma unroll
  for (int row = my_row; row < Br; row += kRowStep) {
    uint4* q = reinterpret_cast<uint4*>(sQ + row * kStride + my_col);
    uint4 v = *q;
    uint32_t* vw = reinterpret_cast<uint32_t*>(&v);
    const uint32_t* bw = reinterpret_cast<const uint32_t*>(&bq);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 x = Mma<T>::unpack(vw[w]);
      const float2 y = Mma<T>::unpack(bw[w]);
      vw[w] = Mma<T>::pack(x.x + y.x, x.y + y.y);
    }
    *q = v;
  }
  __syncthreads();

  // This warp's rows: warp_row0 + 16m + {g, g + 8} for m-tile m, g = lane / 4.
  const int warp_row0 = warp * Tile::kWarpRows;
  // Q as A fragments, one per m-tile and 16-wide k-step: lanes 0-15 address rows 0-15 at column
  // k, lanes 16-31 the same rows at column k+8 -> a0..a3 = (rows 0-7 | 8-15) x (cols k | k+8).
  uint32_t qf[kM][D / 16][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const T* base = sQ + (warp_row0 + 16 * m + lane % 16) * kStride + (lane / 16) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[m][kk], base + kk * 16);
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

  for (int t = t_begin; t < t_end; ++t) {
    const int buf = (t - t_begin) & 1;
    // Prefetch the next tile into the other buffer (freed by the previous iteration's barrier);
    // an empty group on the last tile keeps the wait count uniform.
    if (t + 1 < t_end) {
      const int nb = buf ^ 1;
      masked_bits = (masked_bits & ~(1 << nb)) | ((load_kv(t + 1, nb) ? 1 : 0) << nb);
    }
    cp_async_commit();
    cp_async_wait<1>();
    // The barrier also tells every thread whether this tile has any masked key.
    const bool tile_masked = __syncthreads_or((masked_bits >> buf) & 1) != 0;

    const T* tk = sK + buf * Tile::kKVElems;
    const T* tv = sV + buf * Tile::kKVElems;

    // S = Q Kᵀ: s[m][j] is key block j (keys 8j..8j+7) of m-tile m, C layout. Each K fragment
    // serves every m-tile of the warp.
    float s[kM][Bc / 8][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int j = 0; j < Bc / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int jn = 0; jn < Bc / 16; ++jn) {
        uint32_t kb[4];
        ldmatrix_x4(kb, tk + jn * 16 * kStride + kk * 16 + k_lane);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          Mma<T>::mma(s[m][2 * jn], qf[m][kk], kb[0], kb[1]);
          Mma<T>::mma(s[m][2 * jn + 1], qf[m][kk], kb[2], kb[3]);
        }
      }
    }

    // Masked keys (padding, past S) -> -inf; tiles without any skip this.
    if (tile_masked) {
      const float* key_bias = sKeyBias + buf * Bc;
#pragma unroll
      for (int j = 0; j < Bc / 8; ++j) {
        const float2 kb = *reinterpret_cast<const float2*>(key_bias + 8 * j + quad_col);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          s[m][j][0] += kb.x;
          s[m][j][1] += kb.y;
          s[m][j][2] += kb.x;
          s[m][j][3] += kb.y;
        }
      }
    }

    // Online softmax per row (r = 0: row g, r = 1: row g+8); a row is spread over the 4 lanes of
    // a quad. The max is kept in raw score units (scale > 0), and scale·log2(e) is applied inside
    // the exponent's FMA: p = 2^(s·scale_log2 - max·scale_log2).
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[m][r];
#pragma unroll
        for (int j = 0; j < Bc / 8; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * r], s[m][j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // While a row has seen only masked keys its max is -inf; using 0 instead keeps
        // -inf - -inf from becoming NaN (every term is then 2^-inf = 0).
        const float m_scaled = mx == kNegInf ? 0.0f : mx * scale_log2;
        const float alpha = fast_exp2(fmaf(row_max[m][r], scale_log2, -m_scaled));
        row_max[m][r] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < Bc / 8; ++j) {
          s[m][j][2 * r] = fast_exp2(fmaf(s[m][j][2 * r], scale_log2, -m_scaled));
          s[m][j][2 * r + 1] = fast_exp2(fmaf(s[m][j][2 * r + 1], scale_log2, -m_scaled));
          sum += s[m][j][2 * r] + s[m][j][2 * r + 1];
        }
        row_sum[m][r] = row_sum[m][r] * alpha + sum;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[m][n][2 * r] *= alpha;
          o[m][n][2 * r + 1] *= alpha;
        }
      }
    }

    // O += P V. The S accumulators of key blocks 2kk and 2kk+1 are exactly the A fragment of
    // k-step kk (a0/a1: keys 16kk + 2c.. of rows g/g+8, a2/a3: keys 16kk + 8 + 2c..); each V
    // fragment serves every m-tile.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        a[m][0] = Mma<T>::pack(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = Mma<T>::pack(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = Mma<T>::pack(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = Mma<T>::pack(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
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
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  // ---- epilogue: O / l + b_v, staged through this warp's own Q rows for 16-byte stores -------
  // Only this warp ever read its rows of sQ (its own ldmatrix, long done).
  T* so = sQ + warp_row0 * kStride;
  const int g = lane / 4;
  const T* bias_v = bias + 2 * H;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float inv_sum[2], has_keys[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv_sum[r] = l > 0.0f ? 1.0f / l : 0.0f;
      has_keys[r] = l > 0.0f ? 1.0f : 0.0f;  // rows with no unmasked key stay exactly zero
    }
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
  T* out = static_cast<T*>(p.out) + head * D;
#pragma unroll
  for (int i = lane; i < Tile::kWarpRows * kChunks; i += 32) {
    const int row = i / kChunks, ch = i % kChunks;
    const int s = q0 + warp_row0 + row;
    if (s < S) {
      *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(b) * S + s) * H + ch * 8) =
          *reinterpret_cast<const uint4*>(so + row * kStride + ch * 8);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------------------------

template <typename T, int D, int Br, int Bc, int kWarps, int kMinBlocks>
void launch_flash(const FlashParams& p, int batch, int device, cudaStream_t stream) {
  using Tile = FlashTile<D, Br, Bc, kWarps>;
  constexpr size_t smem = Tile::smem_bytes(sizeof(T));
  auto kernel = flash_attention_kernel<T, D, Br, Bc, kWarps, kMinBlocks>;
  if constexpr (smem > 48 * 1024) {
    // The opt-in above 48 KB is per device; remember which devices already have it.
    static std::atomic<uint64_t> raised_on{0};
    const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
    if (bit == 0 || !(raised_on.load(std::memory_order_acquire) & bit)) {
      FTBERT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
      raised_on.fetch_or(bit, std::memory_order_release);
    }
  }
  const dim3 grid((p.seq + Br - 1) / Br, p.heads, batch);
  kernel<<<grid, Tile::kThreads, smem, stream>>>(p);
  FTBERT_LAUNCH_CHECK("flash_attention_kernel", stream);
}

// Multiprocessors of `device`, looked up once per device.
int multiprocessor_count(int device) {
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

// Tile configuration per head dim, as <T, d, Br, Bc, warps, min blocks per SM> (see the file
// comment). The min-blocks bound caps registers so that many blocks share an SM; every
// configuration here compiles without spills.
template <typename T>
void launch_flash_for_head_dim(const FlashParams& p, int batch, int head_dim,
                               cudaStream_t stream) {
  int device = 0;
  FTBERT_CUDA_CHECK(cudaGetDevice(&device));
  // Wide tiles pay off once the grid is a few waves deep; below that, narrow tiles' shorter
  // blocks finish sooner (measured on an H100: batch 1 x 128 tokens runs best narrow, batch 32
  // wide).
  const int64_t wide_blocks = static_cast<int64_t>((p.seq + 127) / 128) * p.heads * batch;
  const bool wide = wide_blocks >= 2 * static_cast<int64_t>(multiprocessor_count(device));
  switch (head_dim) {
    case 32:
      if (wide) {
        launch_flash<T, 32, 128, 64, 4, 3>(p, batch, device, stream);
      } else {
        launch_flash<T, 32, 64, 64, 4, 4>(p, batch, device, stream);
      }
      return;
    case 64:
      if (wide) {
        launch_flash<T, 64, 128, 64, 4, 2>(p, batch, device, stream);
      } else {
        launch_flash<T, 64, 64, 64, 4, 3>(p, batch, device, stream);
      }
      return;
    case 128:
      launch_flash<T, 128, 64, 64, 4, 2>(p, batch, device, stream);
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

void invoke_flash_attention(DType dt, const void* qkv, const void* qkv_bias, const int32_t* mask,
                            void* out, int batch, int seq, int heads, int head_dim, float scale,
                            cudaStream_t stream) {
  const std::string why = flash_attention_unsupported_reason(dt, head_dim);
  FTBERT_CHECK(why.empty(), why);
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
  if (batch == 0 || seq == 0) return;
  FTBERT_CHECK(qkv && qkv_bias && mask && out, "flash attention: null pointer argument");
  // 16-byte vector copies of rows (row strides are multiples of 16 bytes since d % 8 == 0).
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  };
  FTBERT_CHECK(aligned16(qkv) && aligned16(qkv_bias) && aligned16(out),
               "flash attention: qkv, bias and out must be 16-byte aligned");

  FlashParams p;
  p.qkv = qkv;
  p.bias = qkv_bias;
  p.mask = mask;
  p.out = out;
  p.seq = seq;
  p.heads = heads;
  p.scale_log2 = scale * kLog2e;
  if (dt == DType::kFloat16) {
    launch_flash_for_head_dim<__half>(p, batch, head_dim, stream);
  } else {
    launch_flash_for_head_dim<__nv_bfloat16>(p, batch, head_dim, stream);
  }
}

}  // namespace ftbert::cuda
