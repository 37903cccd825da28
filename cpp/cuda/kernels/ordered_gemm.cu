// Batched products in which every element is summed over k in one fixed order, whatever the shape
// around it (Backend::batched_gemm under batch_invariant): c[b](i, j) = alpha · Σ_k A(i, k) B(k, j)
// + beta · c[b](i, j), one fp32 FMA per k from k = 0 up. cuBLAS may pick another kernel, with
// another order of sums, for another row count; DeBERTa's term tables are such products over all
// of a batch's rows. Plain fp32 FMAs on 64 × 64 output tiles: correct first, the tensor cores are
// for the weight GEMMs.
#include "cuda/cuda_check.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"
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
