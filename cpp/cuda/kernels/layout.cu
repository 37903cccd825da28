// The layout changes around unfused attention:
//   add_qkv_bias_transpose: qkv [rows, 3H] + bias -> q, k, v [B, heads, S, d] (split heads)
//   transpose_heads:        ctx [B, heads, S, d] -> [rows, H]                  (merge heads)
// One layout row per block row (threadIdx.y), threads striding over the row's vectors; a vector
// never crosses a head because its width divides head_dim. Pure bandwidth: one read and one write.
// Packed rows come from / go to their padded positions (token_index), so the heads layout and the
// mask are a padded batch's; its padding positions are zeroed first.
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {
namespace {

// kernels

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
    add_qkv_bias_transpose_kernel(const T* __restrict__ qkv, const T* __restrict__ bias,
                                  T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                                  SequenceLayout layout, int heads, int head_dim) {
  begin_dependent_kernel();
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= layout.rows) return;
  const int token = layout.packed() ? layout.token_index[row] : row;  // b·S + s
  if (token < 0) return;  // past the packed tokens
  const int seq = layout.max_seq;
  const int hidden = heads * head_dim;
  const int b = token / seq;
  const int s = token - b * seq;
  const T* src = qkv + static_cast<int64_t>(row) * 3 * hidden;
  for (int c = threadIdx.x; c < 3 * hidden / VEC; c += blockDim.x) {
    const int col = c * VEC;
    const int which = col / hidden;  // 0 = Q, 1 = K, 2 = V
    const int in_part = col - which * hidden;
    const int h = in_part / head_dim;
    const int dd = in_part - h * head_dim;
    const Vec<T, VEC> x = load_vec<VEC>(src + col);
    const Vec<T, VEC> bb = load_vec<VEC>(bias + col);
    Vec<T, VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) y.v[i] = from_float<T>(to_float(x.v[i]) + to_float(bb.v[i]));
    T* dst = which == 0 ? q : (which == 1 ? k : v);
    store_vec<VEC>(dst + ((static_cast<int64_t>(b) * heads + h) * seq + s) * head_dim + dd, y);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
    transpose_heads_kernel(const T* __restrict__ in, T* __restrict__ out, SequenceLayout layout,
                           int heads, int head_dim) {
  begin_dependent_kernel();
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= layout.rows) return;
  const int token = layout.packed() ? layout.token_index[row] : row;  // b·S + s
  if (token < 0) return;  // past the packed tokens
  const int seq = layout.max_seq;
  const int hidden = heads * head_dim;
  const int b = token / seq;
  const int s = token - b * seq;
  T* dst = out + static_cast<int64_t>(row) * hidden;
  for (int c = threadIdx.x; c < hidden / VEC; c += blockDim.x) {
    const int col = c * VEC;
    const int h = col / head_dim;
    const int dd = col - h * head_dim;
    const int64_t src = ((static_cast<int64_t>(b) * heads + h) * seq + s) * head_dim + dd;
    store_vec<VEC>(dst + col, load_vec<VEC>(in + src));
  }
}

}  // namespace

// launchers

template <typename T>
void invoke_add_qkv_bias_transpose(const T* qkv, const T* bias, T* q, T* k, T* v,
                                   const SequenceLayout& layout, int heads, int head_dim,
                                   cudaStream_t stream) {
  const int rows = layout.rows;
  if (layout.packed()) {
    // Padding positions: zeros (V there meets a zero weight, which must not meet a NaN); all of
    // them when there is no token at all.
    const size_t bytes = static_cast<size_t>(layout.batch) * layout.max_seq * heads * head_dim * sizeof(T);
    for (T* x : {q, k, v}) FTBERT_CUDA_CHECK(cudaMemsetAsync(x, 0, bytes, stream));
  }
  if (rows == 0 || heads * head_dim == 0) return;
  const int vec = pick_vec<T>(head_dim, {qkv, bias, q, k, v});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const dim3 block = row_block(3 * heads * head_dim / VEC);
    launch(add_qkv_bias_transpose_kernel<T, VEC>, ceil_div(rows, block.y), block, 0, stream, qkv,
           bias, q, k, v, layout, heads, head_dim);
  });
  FTBERT_LAUNCH_CHECK("add_qkv_bias_transpose_kernel", stream);
}

template <typename T>
void invoke_transpose_heads(const T* in, T* out, const SequenceLayout& layout, int heads,
                            int head_dim, cudaStream_t stream) {
  const int rows = layout.rows;
  if (rows == 0 || heads * head_dim == 0) return;
  const int vec = pick_vec<T>(head_dim, {in, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const dim3 block = row_block(heads * head_dim / VEC);
    launch(transpose_heads_kernel<T, VEC>, ceil_div(rows, block.y), block, 0, stream, in, out,
           layout, heads, head_dim);
  });
  FTBERT_LAUNCH_CHECK("transpose_heads_kernel", stream);
}

#define FTBERT_INSTANTIATE_LAYOUT(T)                                                          \
  template void invoke_add_qkv_bias_transpose<T>(const T*, const T*, T*, T*, T*,                 \
                                                 const SequenceLayout&, int, int, cudaStream_t); \
  template void invoke_transpose_heads<T>(const T*, T*, const SequenceLayout&, int, int,         \
                                          cudaStream_t);
FTBERT_INSTANTIATE_LAYOUT(float)
FTBERT_INSTANTIATE_LAYOUT(__half)
FTBERT_INSTANTIATE_LAYOUT(__nv_bfloat16)
#undef FTBERT_INSTANTIATE_LAYOUT

}  // namespace ftbert::cuda
