// Bias + activation, in place: x[r, c] = act(x[r, c] + bias[c]), in fp32, rounded to T once.
//   kGeluErf  : 0.5·x·(1 + erf(x/√2))                       (HF "gelu"; erff, not an approximation)
//   kGeluTanh : 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  (HF "gelu_new" / "gelu_pytorch_tanh")
//   kRelu     : max(x, 0)
//   kTanh     : tanh(x)                                      (the pooler)
//   kIdentity : x                                            (a projection's bias alone)
// A few rows per block (threadIdx.y), threads striding over a row's vectors; the activation is a
// template parameter so the inner loop has no branch.
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {
namespace {

// kernels

template <Activation A>
__device__ __forceinline__ float activate(float x) {
  if constexpr (A == Activation::kGeluErf) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else if constexpr (A == Activation::kGeluTanh) {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else if constexpr (A == Activation::kRelu) {
    return x > 0.0f ? x : 0.0f;
  } else if constexpr (A == Activation::kIdentity) {
    return x;
  } else {
    return tanhf(x);
  }
}

template <typename T, int VEC, Activation A>
__global__ void __launch_bounds__(256)
    add_bias_activation_kernel(T* __restrict__ x, const T* __restrict__ bias, int rows, int cols) {
  begin_dependent_kernel();
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  T* xr = x + static_cast<int64_t>(row) * cols;
  for (int c = threadIdx.x; c < cols / VEC; c += blockDim.x) {
    const Vec<T, VEC> a = load_vec<VEC>(xr + c * VEC);
    const Vec<T, VEC> b = load_vec<VEC>(bias + c * VEC);
    Vec<T, VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      y.v[i] = from_float<T>(activate<A>(to_float(a.v[i]) + to_float(b.v[i])));
    }
    store_vec<VEC>(xr + c * VEC, y);
  }
}

}  // namespace

// launchers

template <typename T>
void invoke_add_bias_activation(T* x, const T* bias, int rows, int cols, Activation act,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int vec = pick_vec<T>(cols, {x, bias});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const dim3 block = row_block(cols / VEC);
    const int grid = ceil_div(rows, block.y);
    switch (act) {
      case Activation::kGeluErf:
        launch(add_bias_activation_kernel<T, VEC, Activation::kGeluErf>, grid, block, 0, stream,
               x, bias, rows, cols);
        break;
      case Activation::kGeluTanh:
        launch(add_bias_activation_kernel<T, VEC, Activation::kGeluTanh>, grid, block, 0, stream,
               x, bias, rows, cols);
        break;
      case Activation::kRelu:
        launch(add_bias_activation_kernel<T, VEC, Activation::kRelu>, grid, block, 0, stream, x,
               bias, rows, cols);
        break;
      case Activation::kTanh:
        launch(add_bias_activation_kernel<T, VEC, Activation::kTanh>, grid, block, 0, stream, x,
               bias, rows, cols);
        break;
      case Activation::kIdentity:
        launch(add_bias_activation_kernel<T, VEC, Activation::kIdentity>, grid, block, 0, stream,
               x, bias, rows, cols);
        break;
      default:
        FTBERT_FAIL("add_bias_activation: unknown activation " << static_cast<int>(act));
    }
  });
  FTBERT_LAUNCH_CHECK("add_bias_activation_kernel", stream);
}

template void invoke_add_bias_activation<float>(float*, const float*, int, int, Activation,
                                                cudaStream_t);
template void invoke_add_bias_activation<__half>(__half*, const __half*, int, int, Activation,
                                                 cudaStream_t);
template void invoke_add_bias_activation<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int,
                                                        int, Activation, cudaStream_t);

}  // namespace ftbert::cuda
