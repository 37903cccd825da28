// Masked softmax over attention scores, in place: for every row (b, h, query i),
//   x[j] = scale·s[j] (+ rel[h, j - i] with a relative position bias)
//   p[j] = exp(x[j] - m) / Σ_k exp(x[k] - m) over keys with mask[b, j] != 0 (and, with a
//          sliding window W, |j - i| <= W), else 0,
// with m the row's max over kept keys. A row whose keys are all masked becomes zeros (the max is
// -inf, which is tested for explicitly instead of being subtracted, so no NaN can appear).
// Two variants selected by length, as in FasterTransformer:
//   warp per row  (seq <= 1024): the row lives in the warp's registers (ITERS·VEC values per
//                                lane); one read and one write of the scores.
//   block per row (seq > 1024):  256 threads per row. While the row fits in registers (ITEMS <= 8
//                                vectors per thread, i.e. seq <= 2048·VEC) it is cached there:
//                                block max, block sum, write. Longer rows are streamed: an online
//                                max/sum pass (the sum rescaled when the max grows), then a second
//                                read that writes the probabilities.
// Batch-invariant forwards take a third, ordered variant at every length: warp per row, lane l
// summing keys l, l + 32, ... in order, then the warp's fixed butterfly; keys past a sequence add
// exact zeros, so a row's probabilities do not depend on how long the batch pads it.
// The relative position bias is a template bool of every kernel (kRelBias): the kernels without
// it are those of plain BERT, their arithmetic unchanged. A bias of zeros gives the same bits.
// So is the sliding window (kWindow): a key outside the query's window is masked as padding is;
// a window as long as the sequence masks nothing and runs the kernels without one.
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {
namespace {

constexpr int kWarpRowsPerBlock = 4;
constexpr int kBlockThreads = 256;
constexpr int kBlockMaxItems = 8;  // vectors per thread the cached block kernel holds

// kernels

// The relative position bias of score row `row` = (b·heads + h)·S + i, shifted so that rel[j] is
// the bias of key j: table[h·(2·span − 1) + (j − i) + span − 1].
__device__ __forceinline__ const float* relative_bias_row(const float* table, int row,
                                                          int rows_per_batch, int seq, int span) {
  const int within = row % rows_per_batch;  // h·S + i
  const int h = within / seq;
  const int i = within - h * seq;
  return table + (static_cast<int64_t>(h) * (2 * span - 1) + (span - 1 - i));
}

// Whether key j lies in query i's window (kWindow; always without one).
template <bool kWindow>
__device__ __forceinline__ bool in_window(int j, int i, int window) {
  if constexpr (kWindow) {
    return abs(j - i) <= window;
  } else {
    return true;
  }
}

// The query index i of score row `row` = (b·heads + h)·S + i.
__device__ __forceinline__ int query_of_row(int row, int seq) { return row % seq; }

// A kept key's score as the softmax takes it: scaled, plus its relative bias if the kernel adds
// one (a table this small stays in the read-only cache).
template <bool kRelBias>
__device__ __forceinline__ float scaled_score(float s, float scale, const float* rel, int col) {
  if constexpr (kRelBias) {
    return s * scale + __ldg(rel + col);
  } else {
    return s * scale;
  }
}

// Lane `lane` holds vectors (it·32 + lane) for it < ITERS, each VEC keys wide (coalesced).
// rel_table: [heads, 2·span − 1], read only when kRelBias; window read only when kWindow.
template <typename T, int ITERS, int VEC, bool kRelBias, bool kWindow>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32)
    masked_softmax_warp_kernel(T* __restrict__ scores, const int32_t* __restrict__ mask, int rows,
                               int rows_per_batch, int seq, float scale,
                               const float* __restrict__ rel_table, int span, int window) {
  begin_dependent_kernel();
  const int row = blockIdx.x * kWarpRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // uniform across the warp
  const int lane = threadIdx.x & 31;
  T* p = scores + static_cast<int64_t>(row) * seq;
  const int32_t* keep = mask + static_cast<int64_t>(row / rows_per_batch) * seq;
  const float* rel = nullptr;
  if constexpr (kRelBias) rel = relative_bias_row(rel_table, row, rows_per_batch, seq, span);
  const int q = kWindow ? query_of_row(row, seq) : 0;

  float x[ITERS][VEC];
  float row_max = -INFINITY;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int col = (it * 32 + lane) * VEC;
    if (col < seq) {  // VEC divides seq: a vector is either all in or all out
      const Vec<T, VEC> s = load_vec<VEC>(p + col);
      const Vec<int32_t, VEC> m = load_vec<VEC>(keep + col);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        x[it][i] = m.v[i] != 0 && in_window<kWindow>(col + i, q, window)
                       ? scaled_score<kRelBias>(to_float(s.v[i]), scale, rel, col + i)
                       : -INFINITY;
        row_max = fmaxf(row_max, x[it][i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[it][i] = -INFINITY;
    }
  }
  row_max = warp_max(row_max);

  float sum = 0.0f;
  if (row_max != -INFINITY) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        x[it][i] = expf(x[it][i] - row_max);  // masked: exp(-inf) = 0
        sum += x[it][i];
      }
    }
  }
  sum = warp_sum(sum);
  // Fully masked row: sum == 0 and every x is -inf; write zeros.
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int col = (it * 32 + lane) * VEC;
    if (col < seq) {
      Vec<T, VEC> y;
#pragma unroll
      for (int i = 0; i < VEC; ++i) y.v[i] = from_float<T>(inv > 0.0f ? x[it][i] * inv : 0.0f);
      store_vec<VEC>(p + col, y);
    }
  }
}

// Thread t holds vectors (it·blockDim + t) for it < ITEMS.
template <typename T, int VEC, int ITEMS, bool kRelBias, bool kWindow>
__global__ void __launch_bounds__(kBlockThreads)
    masked_softmax_block_cached_kernel(T* __restrict__ scores, const int32_t* __restrict__ mask,
                                       int rows_per_batch, int seq, float scale,
                                       const float* __restrict__ rel_table, int span,
                                       int window) {
  begin_dependent_kernel();
  __shared__ float scratch[32];
  T* p = scores + static_cast<int64_t>(blockIdx.x) * seq;
  const int32_t* keep = mask + static_cast<int64_t>(blockIdx.x / rows_per_batch) * seq;
  const float* rel = nullptr;
  if constexpr (kRelBias) rel = relative_bias_row(rel_table, blockIdx.x, rows_per_batch, seq, span);
  const int q = kWindow ? query_of_row(blockIdx.x, seq) : 0;
  const int chunks = seq / VEC;

  float x[ITEMS][VEC];
  float row_max = -INFINITY;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = it * blockDim.x + threadIdx.x;
    if (c < chunks) {
      const Vec<T, VEC> s = load_vec<VEC>(p + c * VEC);
      const Vec<int32_t, VEC> k = load_vec<VEC>(keep + c * VEC);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        x[it][i] = k.v[i] != 0 && in_window<kWindow>(c * VEC + i, q, window)
                       ? scaled_score<kRelBias>(to_float(s.v[i]), scale, rel, c * VEC + i)
                       : -INFINITY;
        row_max = fmaxf(row_max, x[it][i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[it][i] = -INFINITY;
    }
  }
  row_max = block_max(row_max, scratch);

  float sum = 0.0f;
  if (row_max != -INFINITY) {
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        x[it][i] = expf(x[it][i] - row_max);
        sum += x[it][i];
      }
    }
  }
  sum = block_sum(sum, scratch);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // 0: every key masked

#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = it * blockDim.x + threadIdx.x;
    if (c < chunks) {
      Vec<T, VEC> y;
#pragma unroll
      for (int i = 0; i < VEC; ++i) y.v[i] = from_float<T>(inv > 0.0f ? x[it][i] * inv : 0.0f);
      store_vec<VEC>(p + c * VEC, y);
    }
  }
}

// The ordered variant (batch-invariant forwards): three passes over the row, each lane over keys
// lane, lane + 32, ... in order; the same sums for any padded length S.
template <typename T, bool kRelBias, bool kWindow>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32)
    masked_softmax_ordered_kernel(T* __restrict__ scores, const int32_t* __restrict__ mask,
                                  int rows, int rows_per_batch, int seq, float scale,
                                  const float* __restrict__ rel_table, int span, int window) {
  begin_dependent_kernel();
  const int row = blockIdx.x * kWarpRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // uniform across the warp
  const int lane = threadIdx.x & 31;
  T* p = scores + static_cast<int64_t>(row) * seq;
  const int32_t* keep = mask + static_cast<int64_t>(row / rows_per_batch) * seq;
  const float* rel = nullptr;
  if constexpr (kRelBias) rel = relative_bias_row(rel_table, row, rows_per_batch, seq, span);
  const int q = kWindow ? query_of_row(row, seq) : 0;
  auto score = [&](int j) {
    return keep[j] != 0 && in_window<kWindow>(j, q, window)
               ? scaled_score<kRelBias>(to_float(p[j]), scale, rel, j)
               : -INFINITY;
  };
  float row_max = -INFINITY;
  for (int j = lane; j < seq; j += 32) row_max = fmaxf(row_max, score(j));
  row_max = warp_max(row_max);
  float sum = 0.0f;
  if (row_max != -INFINITY) {
    for (int j = lane; j < seq; j += 32) sum += expf(score(j) - row_max);  // masked: exp(-inf) = 0
  }
  sum = warp_sum(sum);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // 0: every key masked
  for (int j = lane; j < seq; j += 32) {
    p[j] = from_float<T>(inv > 0.0f ? expf(score(j) - row_max) * inv : 0.0f);
  }
}

// Merges a running (max, sum) pair with another: sums are rescaled to the larger max.
__device__ __forceinline__ void merge_max_sum(float& m, float& l, float m2, float l2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  l = l * expf(m - mx) + l2 * expf(m2 - mx);
  m = mx;
}

template <typename T, int VEC, bool kRelBias, bool kWindow>
__global__ void __launch_bounds__(kBlockThreads)
    masked_softmax_block_streaming_kernel(T* __restrict__ scores, const int32_t* __restrict__ mask,
                                int rows_per_batch, int seq, float scale,
                                const float* __restrict__ rel_table, int span, int window) {
  begin_dependent_kernel();
  __shared__ float scratch_m[32];
  __shared__ float scratch_l[32];
  const int row = blockIdx.x;
  T* p = scores + static_cast<int64_t>(row) * seq;
  const int32_t* keep = mask + static_cast<int64_t>(row / rows_per_batch) * seq;
  const float* rel = nullptr;
  if constexpr (kRelBias) rel = relative_bias_row(rel_table, row, rows_per_batch, seq, span);
  const int q = kWindow ? query_of_row(row, seq) : 0;
  const int chunks = seq / VEC;

  // Pass 1: this thread's running max m and sum l of exp(x - m). The max moves once per vector,
  // so the VEC exponentials of a vector are independent of each other.
  float m = -INFINITY, l = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Vec<T, VEC> s = load_vec<VEC>(p + c * VEC);
    const Vec<int32_t, VEC> k = load_vec<VEC>(keep + c * VEC);
    float x[VEC];
    float vec_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      x[i] = k.v[i] != 0 && in_window<kWindow>(c * VEC + i, q, window)
                 ? scaled_score<kRelBias>(to_float(s.v[i]), scale, rel, c * VEC + i)
                 : -INFINITY;
      vec_max = fmaxf(vec_max, x[i]);
    }
    if (vec_max == -INFINITY) continue;  // all masked: nothing to add
    if (vec_max > m) {
      l *= expf(m - vec_max);  // m == -inf: l is 0 and stays 0
      m = vec_max;
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) l += expf(x[i] - m);  // masked: exp(-inf) = 0
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, offset);
    merge_max_sum(m, l, m2, l2);
  }
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    scratch_m[threadIdx.x >> 5] = m;
    scratch_l[threadIdx.x >> 5] = l;
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
  m = lane < warps ? scratch_m[lane] : -INFINITY;
  l = lane < warps ? scratch_l[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, offset);
    merge_max_sum(m, l, m2, l2);
  }
  const bool empty = m == -INFINITY;  // every key masked
  const float inv = empty ? 0.0f : 1.0f / l;

  // Pass 2: re-read (mostly from L2) and write the probabilities.
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Vec<T, VEC> s = load_vec<VEC>(p + c * VEC);
    const Vec<int32_t, VEC> k = load_vec<VEC>(keep + c * VEC);
    Vec<T, VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const bool kept = k.v[i] != 0 && in_window<kWindow>(c * VEC + i, q, window);
      float e;
      if constexpr (kRelBias) {
        // The bias is added after the max is subtracted: the scaled score and the max then meet
        // in the same (possibly fused) operation as without a bias, so zeros change no bit.
        e = (empty || !kept)
                ? 0.0f
                : expf((to_float(s.v[i]) * scale - m) + __ldg(rel + c * VEC + i)) * inv;
      } else {
        e = (empty || !kept) ? 0.0f : expf(to_float(s.v[i]) * scale - m) * inv;
      }
      y.v[i] = from_float<T>(e);
    }
    store_vec<VEC>(p + c * VEC, y);
  }
}

// launchers

template <typename T, bool kRelBias, bool kWindow>
void launch_masked_softmax(T* scores, const int32_t* mask, int batch, int heads, int seq,
                           float scale, const float* rel_table, int span, int window,
                           bool ordered, cudaStream_t stream) {
  const int rows = batch * heads * seq;
  if (ordered) {
    launch(masked_softmax_ordered_kernel<T, kRelBias, kWindow>, ceil_div(rows, kWarpRowsPerBlock),
           kWarpRowsPerBlock * 32, 0, stream, scores, mask, rows, heads * seq, seq, scale,
           rel_table, span, window);
    FTBERT_LAUNCH_CHECK("masked_softmax_ordered_kernel", stream);
    return;
  }
  // The vector must fit the scores and the int32 mask alike (the mask vector is 4/sizeof(T) wider
  // in bytes), so alignment is checked on both.
  int vec = pick_vec<T>(seq, {scores});
  while (vec > 1 && !is_aligned(mask, vec * sizeof(int32_t))) vec /= 2;

  if (seq <= kSoftmaxWarpMaxSeq) {
    // Keys per lane rounded up to a power of two (1..32), then split into ITERS vectors of VEC.
    int per_lane = 1;
    while (per_lane * 32 < seq) per_lane *= 2;
    while (vec > per_lane) vec /= 2;  // keep all 32 lanes busy on short rows
    const int iters = per_lane / vec;
    const int grid = ceil_div(rows, kWarpRowsPerBlock);
    dispatch_vec<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      auto run = [&](auto iters_c) {
        constexpr int ITERS = decltype(iters_c)::value;
        if constexpr (ITERS * VEC <= 32) {
          launch(masked_softmax_warp_kernel<T, ITERS, VEC, kRelBias, kWindow>, grid,
                 kWarpRowsPerBlock * 32, 0, stream, scores, mask, rows, heads * seq, seq, scale,
                 rel_table, span, window);
        }
      };
      switch (iters) {
        case 1: run(std::integral_constant<int, 1>{}); break;
        case 2: run(std::integral_constant<int, 2>{}); break;
        case 4: run(std::integral_constant<int, 4>{}); break;
        case 8: run(std::integral_constant<int, 8>{}); break;
        case 16: run(std::integral_constant<int, 16>{}); break;
        default: run(std::integral_constant<int, 32>{}); break;
      }
    });
    FTBERT_LAUNCH_CHECK("masked_softmax_warp_kernel", stream);
  } else {
    const int chunks = seq / vec;
    int items = 1;
    while (items * kBlockThreads < chunks) items *= 2;
    dispatch_vec<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      auto cached = [&](auto items_c) {
        launch(masked_softmax_block_cached_kernel<T, VEC, decltype(items_c)::value, kRelBias,
                                                  kWindow>,
               rows, kBlockThreads, 0, stream, scores, mask, heads * seq, seq, scale, rel_table,
               span, window);
      };
      switch (items) {
        case 1: cached(std::integral_constant<int, 1>{}); break;
        case 2: cached(std::integral_constant<int, 2>{}); break;
        case 4: cached(std::integral_constant<int, 4>{}); break;
        case kBlockMaxItems: cached(std::integral_constant<int, kBlockMaxItems>{}); break;
        default:
          launch(masked_softmax_block_streaming_kernel<T, VEC, kRelBias, kWindow>, rows,
                 kBlockThreads, 0, stream, scores, mask, heads * seq, seq, scale, rel_table, span,
                 window);
      }
    });
    FTBERT_LAUNCH_CHECK("masked_softmax_block_kernel", stream);
  }
}

}  // namespace

const char* masked_softmax_variant(int seq) { return seq <= kSoftmaxWarpMaxSeq ? "warp" : "block"; }

template <typename T>
void invoke_masked_softmax(T* scores, const int32_t* mask, int batch, int heads, int seq,
                           float scale, const float* relative_bias, int relative_span, int window,
                           bool ordered, cudaStream_t stream) {
  FTBERT_CHECK(window >= 0, "masked_softmax: window " << window << " < 0");
  if (batch * heads * seq == 0) return;
  // Every distance j - i of a row is at most S - 1: a window that long masks nothing.
  const bool windowed = window > 0 && window < seq;
  if (relative_bias == nullptr) {
    if (windowed) {
      launch_masked_softmax<T, false, true>(scores, mask, batch, heads, seq, scale, nullptr, 0,
                                            window, ordered, stream);
    } else {
      launch_masked_softmax<T, false, false>(scores, mask, batch, heads, seq, scale, nullptr, 0,
                                             0, ordered, stream);
    }
    return;
  }
  // Every distance j - i of a row lies in [-(S - 1), S - 1], inside the table.
  FTBERT_CHECK(relative_span >= seq, "masked_softmax: relative bias span " << relative_span
                                                                           << " < sequence length "
                                                                           << seq);
  if (windowed) {
    launch_masked_softmax<T, true, true>(scores, mask, batch, heads, seq, scale, relative_bias,
                                         relative_span, window, ordered, stream);
  } else {
    launch_masked_softmax<T, true, false>(scores, mask, batch, heads, seq, scale, relative_bias,
                                          relative_span, 0, ordered, stream);
  }
}

template void invoke_masked_softmax<float>(float*, const int32_t*, int, int, int, float,
                                           const float*, int, int, bool, cudaStream_t);
template void invoke_masked_softmax<__half>(__half*, const int32_t*, int, int, int, float,
                                            const float*, int, int, bool, cudaStream_t);
template void invoke_masked_softmax<__nv_bfloat16>(__nv_bfloat16*, const int32_t*, int, int, int,
                                                   float, const float*, int, int, bool,
                                                   cudaStream_t);

}  // namespace ftbert::cuda
