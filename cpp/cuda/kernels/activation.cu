// Bias + activation, in place: x[r, c] = act(x[r, c] + bias[c]), in fp32, rounded to T once.
//   kGeluErf  : 0.5·x·(1 + erf(x/√2))                       (HF "gelu"; erff, not an approximation)
//   kGeluTanh : 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  (HF "gelu_new" / "gelu_pytorch_tanh")
//   kRelu     : max(x, 0)
//   kTanh     : tanh(x)                                      (the pooler)
//   kIdentity : x                                            (a projection's bias alone)
//   kSilu     : x·sigmoid(x)                                 (HF "silu" / "swish": SwiGLU's gate)
// A few rows per block (threadIdx.y), threads striding over a row's vectors; the activation is a
// template parameter so the inner loop has no branch.
// Gated activation (GeGLU and its kin): out[r, c] = act(x[r, c]) · x[r, n + c], the same
// activations, in fp32, rounded to T once.
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
  } else if constexpr (A == Activation::kSilu) {
    return x / (1.0f + expf(-x));
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

// One row of out is n values from a row of x of 2n: the activated half, then the gate.
template <typename T, int VEC, Activation A>
__global__ void __launch_bounds__(256)
    gated_activation_kernel(const T* __restrict__ x, T* __restrict__ out, int rows, int n) {
  begin_dependent_kernel();
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const T* xr = x + static_cast<int64_t>(row) * 2 * n;
  T* yr = out + static_cast<int64_t>(row) * n;
  for (int c = threadIdx.x; c < n / VEC; c += blockDim.x) {
    const Vec<T, VEC> a = load_vec<VEC>(xr + c * VEC);
    const Vec<T, VEC> g = load_vec<VEC>(xr + n + c * VEC);
    Vec<T, VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      y.v[i] = from_float<T>(activate<A>(to_float(a.v[i])) * to_float(g.v[i]));
    }
    store_vec<VEC>(yr + c * VEC, y);
  }
}

// Calls f(std::integral_constant<Activation, A>{}) for the runtime activation `act`.
template <typename F>
void dispatch_activation(Activation act, const char* op, F&& f) {
  switch (act) {
    case Activation::kGeluErf: return f(std::integral_constant<Activation, Activation::kGeluErf>{});
    case Activation::kGeluTanh:
      return f(std::integral_constant<Activation, Activation::kGeluTanh>{});
    case Activation::kRelu: return f(std::integral_constant<Activation, Activation::kRelu>{});
    case Activation::kTanh: return f(std::integral_constant<Activation, Activation::kTanh>{});
    case Activation::kSilu: return f(std::integral_constant<Activation, Activation::kSilu>{});
    case Activation::kIdentity:
      return f(std::integral_constant<Activation, Activation::kIdentity>{});
  }
  FTBERT_FAIL(op << ": unknown activation " << static_cast<int>(act));
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
    dispatch_activation(act, "add_bias_activation", [&](auto act_c) {
      launch(add_bias_activation_kernel<T, VEC, decltype(act_c)::value>, grid, block, 0, stream,
             x, bias, rows, cols);
    });
  });
  FTBERT_LAUNCH_CHECK("add_bias_activation_kernel", stream);
}

template <typename T>
void invoke_gated_activation(const T* x, T* out, int rows, int n, Activation act,
                             cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  // A vector that divides n never straddles the two halves, and x + n is then as aligned as x.
  const int vec = pick_vec<T>(n, {x, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const dim3 block = row_block(n / VEC);
    const int grid = ceil_div(rows, block.y);
    dispatch_activation(act, "gated_activation", [&](auto act_c) {
      launch(gated_activation_kernel<T, VEC, decltype(act_c)::value>, grid, block, 0, stream, x,
             out, rows, n);
    });
  });
  FTBERT_LAUNCH_CHECK("gated_activation_kernel", stream);
}

template void invoke_add_bias_activation<float>(float*, const float*, int, int, Activation,
                                                cudaStream_t);
template void invoke_add_bias_activation<__half>(__half*, const __half*, int, int, Activation,
                                                 cudaStream_t);
template void invoke_add_bias_activation<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int,
                                                        int, Activation, cudaStream_t);

template void invoke_gated_activation<float>(const float*, float*, int, int, Activation,
                                             cudaStream_t);
template void invoke_gated_activation<__half>(const __half*, __half*, int, int, Activation,
                                              cudaStream_t);
template void invoke_gated_activation<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int,
                                                     int, Activation, cudaStream_t);

}  // namespace ftbert::cuda
