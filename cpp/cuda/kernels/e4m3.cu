// invoke_quantize_rows_e4m3: a weight GEMM's input rows in e4m3 (e4m3.cuh), in a pass of its own,
// for the inputs no kernel before wrote that way.
#include <algorithm>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/kernels/e4m3.cuh"
#include "cuda/launch.cuh"

namespace ftbert::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

// One warp per row: the row's largest magnitude, then its values scaled into e4m3's range.
// Reads the row twice (the second time from cache).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    quantize_rows_e4m3_kernel(const T* __restrict__ a, int lda, int rows, int k, E4m3Rows out) {
  begin_dependent_kernel();
  constexpr int kVec = 8;  // 16 bytes of T in, 8 bytes of e4m3 out
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* x = a + static_cast<int64_t>(row) * lda;
  float top = 0.0f;
  for (int c = lane * kVec; c < k; c += 32 * kVec) e4m3_fold_top<T, kVec>(load_vec<kVec>(x + c), top);
  top = warp_max(top);
  const float multiplier = e4m3_row_multiplier(top);
  unsigned char* code_row = out.codes + static_cast<int64_t>(row) * k;
  for (int c = lane * kVec; c < k; c += 32 * kVec) {
    e4m3_store<T, kVec>(load_vec<kVec>(x + c), multiplier, code_row + c);
  }
  if (lane == 0) out.scales[row] = e4m3_row_scale(top);
}

// The same with the row held in registers (kChunks vectors a lane, vector c = lane + 32 j): read
// once, all of a lane's loads in flight before the first is used, as the warp LayerNorms read
// theirs. For rows of up to 32 * kChunks vectors; a lane past the row's end loads its last vector
// again (never out of bounds) and drops it.
template <typename T, int kChunks>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    quantize_rows_e4m3_held_kernel(const T* __restrict__ a, int lda, int rows, int k,
                                   E4m3Rows out) {
  begin_dependent_kernel();
  constexpr int kVec = 8;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps, as warp_max needs
  const int chunks = k / kVec;
  const T* x = a + static_cast<int64_t>(row) * lda;
  Vec<T, kVec> v[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) v[j] = load_vec<kVec>(x + min(lane + 32 * j, chunks - 1) * kVec);
  float top = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (lane + 32 * j < chunks) e4m3_fold_top<T, kVec>(v[j], top);
  }
  top = warp_max(top);
  const float multiplier = e4m3_row_multiplier(top);
  unsigned char* code_row = out.codes + static_cast<int64_t>(row) * k;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) e4m3_store<T, kVec>(v[j], multiplier, code_row + c * kVec);
  }
  if (lane == 0) out.scales[row] = e4m3_row_scale(top);
}

// Runs the held-row kernel of the fewest vectors a lane that take a row of `per_lane`; false
// where a row needs more than 16 (k > 4,096), which the two-read kernel takes.
template <typename T>
bool launch_held_rows(const T* a, int lda, int rows, int k, E4m3Rows out, cudaStream_t stream) {
  const int per_lane = ceil_div(k / 8, 32);
  const int blocks = ceil_div(rows, kRowsPerBlock);
  auto run = [&](auto chunks_c) {
    constexpr int kChunks = decltype(chunks_c)::value;
    launch(quantize_rows_e4m3_held_kernel<T, kChunks>, blocks, 32 * kRowsPerBlock, 0, stream, a, lda,
           rows, k, out);
    return true;
  };
  if (per_lane <= 1) return run(std::integral_constant<int, 1>{});
  if (per_lane <= 2) return run(std::integral_constant<int, 2>{});
  if (per_lane <= 3) return run(std::integral_constant<int, 3>{});  // k = 768
  if (per_lane <= 4) return run(std::integral_constant<int, 4>{});
  if (per_lane <= 6) return run(std::integral_constant<int, 6>{});
  if (per_lane <= 8) return run(std::integral_constant<int, 8>{});
  if (per_lane <= 12) return run(std::integral_constant<int, 12>{});  // k = 3,072
  if (per_lane <= 16) return run(std::integral_constant<int, 16>{});
  return false;
}

}  // namespace

template <typename T>
void invoke_quantize_rows_e4m3(const T* a, int lda, int rows, int k, E4m3Rows out,
                               cudaStream_t stream) {
  FTBERT_CHECK((!std::is_same<T, float>::value), "e4m3 rows are made from float16 or bfloat16");
  FTBERT_CHECK(k % 16 == 0 && lda % 8 == 0 && is_aligned(a, 16) && is_aligned(out.codes, 16),
               "quantize_rows_e4m3: rows of " << k << " values, " << lda
                                              << " apart, need 16-byte alignment");
  if (rows == 0) return;
  if (!launch_held_rows(a, lda, rows, k, out, stream)) {
    launch(quantize_rows_e4m3_kernel<T>, ceil_div(rows, kRowsPerBlock), 32 * kRowsPerBlock, 0,
           stream, a, lda, rows, k, out);
  }
  FTBERT_LAUNCH_CHECK("quantize_rows_e4m3", stream);
}

template void invoke_quantize_rows_e4m3<float>(const float*, int, int, int, E4m3Rows, cudaStream_t);
template void invoke_quantize_rows_e4m3<__half>(const __half*, int, int, int, E4m3Rows,
                                                cudaStream_t);
template void invoke_quantize_rows_e4m3<__nv_bfloat16>(const __nv_bfloat16*, int, int, int,
                                                       E4m3Rows, cudaStream_t);

}  // namespace ftbert::cuda
