// DeBERTa's disentangled terms on the unfused path's scores (Backend::disentangled_scores):
//   scores[b, h, i, j] += c2p[t][i][col(i − j)] + p2c[t][j][col(i − j)],  t = b·heads + h,
// col(δ) = column[δ] − first. One block per score row (t, i), threads over j; the row's c2p terms
// are one contiguous run of columns (read in reverse as j grows), p2c's one column per key row.
// The fused kernels add the same terms inside attention (attention/flash.cu).
#include "cuda/cuda_check.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"
#include "cuda/launch.cuh"

namespace ftbert::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(256)
    disentangled_scores_kernel(T* __restrict__ scores, const T* __restrict__ c2p,
                               const T* __restrict__ p2c, const int32_t* __restrict__ column,
                               int seq, int width, int first) {
  begin_dependent_kernel();
  const int64_t row = blockIdx.x;  // t·S + i
  const int64_t table = row / seq;
  const int i = static_cast<int>(row - table * seq);
  T* s = scores + row * seq;
  const T* q_terms = c2p != nullptr ? c2p + row * width : nullptr;
  const T* k_terms = p2c != nullptr ? p2c + table * seq * width : nullptr;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) {
    const int col = column[i - j] - first;
    float x = to_float(s[j]);
    if (q_terms != nullptr) x += to_float(q_terms[col]);
    if (k_terms != nullptr) x += to_float(k_terms[static_cast<int64_t>(j) * width + col]);
    s[j] = from_float<T>(x);
  }
}

}  // namespace

template <typename T>
void invoke_disentangled_scores(T* scores, const T* c2p, const T* p2c, const int32_t* column,
                                int batch, int heads, int seq, int width, int first,
                                cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq;
  if (rows == 0) return;
  FTBERT_CHECK(rows <= 0x7fffffff, "disentangled_scores: " << rows << " score rows");
  const int threads = seq >= 256 ? 256 : round_up(seq, 32);
  launch(disentangled_scores_kernel<T>, static_cast<int>(rows), threads, 0, stream, scores, c2p,
         p2c, column, seq, width, first);
  FTBERT_LAUNCH_CHECK("disentangled_scores_kernel", stream);
}

#define FTBERT_INSTANTIATE_DISENTANGLED(T)                                                      \
  template void invoke_disentangled_scores<T>(T*, const T*, const T*, const int32_t*, int, int, \
                                              int, int, int, cudaStream_t);
FTBERT_INSTANTIATE_DISENTANGLED(float)
FTBERT_INSTANTIATE_DISENTANGLED(__half)
FTBERT_INSTANTIATE_DISENTANGLED(__nv_bfloat16)
#undef FTBERT_INSTANTIATE_DISENTANGLED

}  // namespace ftbert::cuda
