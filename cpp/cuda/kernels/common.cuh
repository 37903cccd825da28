// Helpers shared by the kernel families: fp32 <-> storage-dtype conversion, aligned vector
// loads/stores (16 bytes = one 128-bit access), warp/block reductions in fp32, and the host-side
// choices every launcher makes (vector width, block shape).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace ftbert::cuda {

// ---- dtype conversion (all arithmetic happens in fp32) -------------------------------------

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// Round-to-nearest-even, like PyTorch's .to(dtype).
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// ---- vector access -------------------------------------------------------------------------

// N consecutive elements moved as one aligned access; N * sizeof(T) == 16 is one 128-bit load.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// p must be aligned to N * sizeof(T); launchers guarantee it (see pick_vec).
template <int N, typename T>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& x) {
  *reinterpret_cast<Vec<T, N>*>(p) = x;
}

// ---- reductions (fp32) ---------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over a 1-D block whose size is a multiple of 32, returned to every thread. `scratch` holds
// 32 floats; the leading barrier lets the same scratch serve back-to-back reductions.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  return warp_sum(lane < warps ? scratch[lane] : 0.0f);
}

// Max over a 1-D block, like block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

// ---- host-side launch choices --------------------------------------------------------------

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Widest vector (in elements of T, at most 16 bytes) that divides `extent` and to which every
// pointer is aligned; 1 (scalar) when nothing wider fits. `extent` is the row length that vectors
// must tile exactly so that no vector straddles two rows (or heads).
template <typename T>
int pick_vec(int extent, std::initializer_list<const void*> ptrs) {
  for (int vec = static_cast<int>(16 / sizeof(T)); vec > 1; vec /= 2) {
    if (extent % vec != 0) continue;
    bool ok = true;
    for (const void* p : ptrs) ok = ok && is_aligned(p, vec * sizeof(T));
    if (ok) return vec;
  }
  return 1;
}

// Calls f(std::integral_constant<int, vec>{}) for a runtime vec from pick_vec, instantiating only
// widths that fit 16 bytes of T.
template <typename T, typename F>
void dispatch_vec(int vec, F&& f) {
  constexpr int kMax = static_cast<int>(16 / sizeof(T));
  if constexpr (kMax >= 8) {
    if (vec == 8) return f(std::integral_constant<int, 8>{});
  }
  if (vec == 4) return f(std::integral_constant<int, 4>{});
  if (vec == 2) return f(std::integral_constant<int, 2>{});
  return f(std::integral_constant<int, 1>{});
}

// Block shape for "a few rows per block, threads striding over a row's `chunks` vectors":
// x covers the row (a multiple of 32, at most `threads`), y packs several short rows per block.
inline dim3 row_block(int chunks, int threads = 256) {
  const int x = chunks >= threads ? threads : round_up(chunks > 0 ? chunks : 1, 32);
  return dim3(x, threads / x);
}

}  // namespace ftbert::cuda
