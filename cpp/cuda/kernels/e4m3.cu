// invoke_quantize_rows_e4m3: a weight GEMM's input rows in e4m3 (e4m3.cuh), in a pass of its own,
// for the inputs no kernel before wrote that way.
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

}  // namespace

template <typename T>
void invoke_quantize_rows_e4m3(const T* a, int lda, int rows, int k, E4m3Rows out,
                               cudaStream_t stream) {
  FTBERT_CHECK((!std::is_same<T, float>::value), "e4m3 rows are made from float16 or bfloat16");
  FTBERT_CHECK(k % 16 == 0 && lda % 8 == 0 && is_aligned(a, 16) && is_aligned(out.codes, 16),
               "quantize_rows_e4m3: rows of " << k << " values, " << lda
                                              << " apart, need 16-byte alignment");
  if (rows == 0) return;
  launch(quantize_rows_e4m3_kernel<T>, ceil_div(rows, kRowsPerBlock), 32 * kRowsPerBlock, 0,
         stream, a, lda, rows, k, out);
  FTBERT_LAUNCH_CHECK("quantize_rows_e4m3", stream);
}

template void invoke_quantize_rows_e4m3<float>(const float*, int, int, int, E4m3Rows, cudaStream_t);
template void invoke_quantize_rows_e4m3<__half>(const __half*, int, int, int, E4m3Rows,
                                                cudaStream_t);
template void invoke_quantize_rows_e4m3<__nv_bfloat16>(const __nv_bfloat16*, int, int, int,
                                                       E4m3Rows, cudaStream_t);

}  // namespace ftbert::cuda
