// Batched products in which every element is summed over k in one fixed order, whatever the shape
// around it (Backend::batched_gemm under batch_invariant): c[b](i, j) = alpha · Σ_k A(i, k) B(k, j)
// + beta · c[b](i, j). cuBLAS may pick another kernel, with another order of sums, for another row
// count; DeBERTa's term tables are such products over all of a batch's rows.
// Two kernels, chosen by what the operands are (never by m, n or the batch):
//   - 16-bit A · Bᵀ with k-contiguous, 16-byte aligned rows (DeBERTa's tables, the unfused
//     attention's scores): tensor cores, each element's k-steps one mma.sync m16n8k16 after
//     another from k = 0, fp32 accumulators;
//   - anything else: plain fp32 FMAs from k = 0.
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/mma.cuh"
#include "cuda/launch.cuh"

namespace ftbert::cuda {
namespace {

constexpr int kTile = 64;          // output rows and columns of a block
constexpr int kDepth = 16;         // k per staged slice
constexpr int kPitch = kTile + 4;  // floats per staged k row (16-byte rows for float4 reads)
constexpr int kThreads = 256;      // 16 × 16 threads, 4 × 4 outputs each

// Stages X(r, k) for r in [r0, r0 + 64), k in [k0, k0 + 16) into s[k][r] as fp32, zero outside
// `rows` and `depth`. X(r, k) is x[r·ld + k] when k_inner, else x[k·ld + r]; consecutive threads
// read consecutive addresses either way.
template <typename T>
__device__ __forceinline__ void stage(float (*s)[kPitch], const T* __restrict__ x, int64_t ld,
                                      bool k_inner, int r0, int rows, int k0, int depth) {
  for (int e = threadIdx.x; e < kDepth * kTile; e += kThreads) {
    const int r = k_inner ? e / kDepth : e % kTile;
    const int k = k_inner ? e % kDepth : e / kTile;
    const int gr = r0 + r, gk = k0 + k;
    float v = 0.0f;
    if (gr < rows && gk < depth) {
      v = to_float(x[k_inner ? gr * ld + gk : static_cast<int64_t>(gk) * ld + gr]);
    }
    s[k][r] = v;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ordered_batched_gemm_kernel(bool trans_a, bool trans_b, int m, int n, int k, const T* a,
                                int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                                int64_t stride_b, T* c, int64_t ldc, int64_t stride_c,
                                float alpha, float beta) {
  begin_dependent_kernel();
  __shared__ __align__(16) float sa[kDepth][kPitch];  // A(i, k), i across
  __shared__ __align__(16) float sb[kDepth][kPitch];  // B(k, j), j across
  const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  a += blockIdx.z * stride_a;
  b += blockIdx.z * stride_b;
  c += blockIdx.z * stride_c;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += kDepth) {
    // A(i, k) = a[i·lda + k], or a[k·lda + i] transposed; B(k, j) = b[k·ldb + j], or b[j·ldb + k].
    stage(sa, a, lda, !trans_a, i0, m, k0, k);
    stage(sb, b, ldb, trans_b, j0, n, k0, k);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&sa[kk][4 * ty]);
      const float4 bv = *reinterpret_cast<const float4*>(&sb[kk][4 * tx]);
      const float ar[4] = {av.x, av.y, av.z, av.w}, br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[r][q] = fmaf(ar[r], br[q], acc[r][q]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int i = i0 + 4 * ty + r;
    if (i >= m) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = j0 + 4 * tx + q;
      if (j >= n) continue;
      T* out = c + i * ldc + j;
      const float prior = beta != 0.0f ? beta * to_float(*out) : 0.0f;
      *out = from_float<T>(alpha * acc[r][q] + prior);
    }
  }
}

// ---- the tensor-core kernel: A [m, k] row-major, B given as [n, k] (k contiguous) ------------

constexpr int kMmaDepth = 32;                 // k per staged slice
constexpr int kMmaPitch = kMmaDepth + 8;      // elements per staged row: conflict-free fragments
constexpr int kMmaThreads = 128;              // 2 × 2 warps of 32 × 32 outputs

// Stages rows [r0, r0 + 64) × k [k0, k0 + 32) of x (row stride ld, k contiguous) into s, zero
// outside `rows` and `depth` (k and ld are multiples of 8, so a 16-byte chunk is all in or out).
template <typename T>
__device__ __forceinline__ void stage_rows(T (*s)[kMmaPitch], const T* __restrict__ x, int64_t ld,
                                           int r0, int rows, int k0, int depth) {
  for (int e = threadIdx.x; e < kTile * kMmaDepth / 8; e += kMmaThreads) {
    const int r = e / (kMmaDepth / 8), chunk = e % (kMmaDepth / 8);
    const int gr = r0 + r, gk = k0 + 8 * chunk;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (gr < rows && gk < depth) v = *reinterpret_cast<const uint4*>(x + gr * ld + gk);
    *reinterpret_cast<uint4*>(&s[r][8 * chunk]) = v;
  }
}

template <typename T>
__global__ void __launch_bounds__(kMmaThreads)
    ordered_mma_gemm_kernel(int m, int n, int k, const T* a, int64_t lda, int64_t stride_a,
                            const T* b, int64_t ldb, int64_t stride_b, T* c, int64_t ldc,
                            int64_t stride_c, float alpha, float beta) {
  begin_dependent_kernel();
  __shared__ __align__(16) T sa[kTile][kMmaPitch];  // A rows
  __shared__ __align__(16) T sb[kTile][kMmaPitch];  // B columns (rows of Bᵀ)
  const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  a += blockIdx.z * stride_a;
  b += blockIdx.z * stride_b;
  c += blockIdx.z * stride_c;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = 32 * (warp / 2), wc = 32 * (warp % 2);
  const int g = lane / 4, q2 = 2 * (lane % 4);  // fragment row, and column pair
  float acc[2][4][4] = {};
  auto word = [](const T* p) { return *reinterpret_cast<const uint32_t*>(p); };
  for (int k0 = 0; k0 < k; k0 += kMmaDepth) {
    stage_rows(sa, a, lda, i0, m, k0, k);
    stage_rows(sb, b, ldb, j0, n, k0, k);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kMmaDepth; kk += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const T* row = &sa[wr + 16 * mt + g][kk + q2];
        af[mt][0] = word(row);
        af[mt][1] = word(row + 8 * kMmaPitch);
        af[mt][2] = word(row + 8);
        af[mt][3] = word(row + 8 * kMmaPitch + 8);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const T* col = &sb[wc + 8 * nt + g][kk + q2];
        const uint32_t b0 = word(col), b1 = word(col + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) Mma<T>::mma(acc[mt][nt], af[mt], b0, b1);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = i0 + wr + 16 * mt + g + 8 * half;
      if (i >= m) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + wc + 8 * nt + q2 + e;
          if (j >= n) continue;
          T* out = c + i * ldc + j;
          const float prior = beta != 0.0f ? beta * to_float(*out) : 0.0f;
          *out = from_float<T>(alpha * acc[mt][nt][2 * half + e] + prior);
        }
      }
    }
  }
}

// Whether the tensor-core kernel takes these (16-bit) operands: A · Bᵀ whose rows are k-contiguous
// and start on 16-byte boundaries in every matrix of the batch.
bool mma_operands(bool trans_a, bool trans_b, int k, const void* a, int lda, int64_t stride_a,
                  const void* b, int ldb, int64_t stride_b) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return !trans_a && trans_b && k % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && stride_a % 8 == 0 &&
         stride_b % 8 == 0 && aligned(a) && aligned(b);
}

}  // namespace

template <typename T>
void invoke_ordered_batched_gemm(bool trans_a, bool trans_b, int m, int n, int k, const T* a,
                                 int lda, int64_t stride_a, const T* b, int ldb, int64_t stride_b,
                                 T* c, int ldc, int64_t stride_c, int batch, float alpha,
                                 float beta, cudaStream_t stream) {
  if (m == 0 || n == 0 || batch == 0) return;
  FTBERT_CHECK(batch <= 65535 && (m + kTile - 1) / kTile <= 65535,
               "ordered batched GEMM: " << batch << " products of " << m << " rows");
  const dim3 grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile, batch);
  if constexpr (!std::is_same_v<T, float>) {
    if (mma_operands(trans_a, trans_b, k, a, lda, stride_a, b, ldb, stride_b)) {
      launch(ordered_mma_gemm_kernel<T>, grid, kMmaThreads, 0, stream, m, n, k, a,
             static_cast<int64_t>(lda), stride_a, b, static_cast<int64_t>(ldb), stride_b, c,
             static_cast<int64_t>(ldc), stride_c, alpha, beta);
      FTBERT_LAUNCH_CHECK("ordered_mma_gemm_kernel", stream);
      return;
    }
  }
  launch(ordered_batched_gemm_kernel<T>, grid, kThreads, 0, stream, trans_a, trans_b, m, n, k, a,
         static_cast<int64_t>(lda), stride_a, b, static_cast<int64_t>(ldb), stride_b, c,
         static_cast<int64_t>(ldc), stride_c, alpha, beta);
  FTBERT_LAUNCH_CHECK("ordered_batched_gemm_kernel", stream);
}

#define FTBERT_INSTANTIATE_ORDERED_GEMM(T)                                                        \
  template void invoke_ordered_batched_gemm<T>(bool, bool, int, int, int, const T*, int, int64_t, \
                                               const T*, int, int64_t, T*, int, int64_t, int,      \
                                               float, float, cudaStream_t);
FTBERT_INSTANTIATE_ORDERED_GEMM(float)
FTBERT_INSTANTIATE_ORDERED_GEMM(__half)
FTBERT_INSTANTIATE_ORDERED_GEMM(__nv_bfloat16)
#undef FTBERT_INSTANTIATE_ORDERED_GEMM

}  // namespace ftbert::cuda
