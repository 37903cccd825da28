// The sequence layout on the device (ftbert/sequences.h): packing a mask into cu_seqlens and
// token_index, and the row moves around a packed forward: the first-token gather, the scatter back
// to the padded layout, and the clearing of a bucket's rows past the tokens.
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {
namespace {

constexpr int kPackThreads = 1024;

// One block: a warp per sequence counts its tokens, the block scans the counts into cu_seqlens,
// then a warp per sequence writes its tokens' padded positions in order (ballot + popc). Padded
// batches are small next to the forward they start (128 x 512 positions: a few microseconds).
__global__ void __launch_bounds__(kPackThreads)
    pack_sequences_kernel(const int32_t* __restrict__ mask, int batch, int seq,
                          int32_t* __restrict__ cu_seqlens, int32_t* __restrict__ token_index,
                          int64_t capacity, int32_t* __restrict__ first_unattended) {
  begin_dependent_kernel();
  __shared__ int partial[kPackThreads];
  __shared__ int unattended;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
  if (tid == 0) unattended = 0;
  __syncthreads();
  for (int b = warp; b < batch; b += warps) {
    const int32_t* row = mask + static_cast<int64_t>(b) * seq;
    int n = 0;
    for (int s = lane; s < seq; s += 32) n += row[s] != 0;
    n = __reduce_add_sync(0xffffffffu, n);
    if (lane == 0) cu_seqlens[b + 1] = n;
    if (lane == 0 && row[0] == 0) atomicOr(&unattended, 1);
  }
  __syncthreads();
  if (tid == 0 && first_unattended != nullptr) *first_unattended = unattended;
  // Exclusive scan: each thread sums a contiguous run of lengths, the block scans the run sums.
  const int per = (batch + blockDim.x - 1) / blockDim.x;
  const int lo = min(batch, tid * per), hi = min(batch, lo + per);
  int sum = 0;
  for (int b = lo; b < hi; ++b) sum += cu_seqlens[b + 1];
  partial[tid] = sum;
  __syncthreads();
  for (int off = 1; off < blockDim.x; off *= 2) {
    const int add = tid >= off ? partial[tid - off] : 0;
    __syncthreads();
    partial[tid] += add;
    __syncthreads();
  }
  int run = partial[tid] - sum;
  for (int b = lo; b < hi; ++b) {
    run += cu_seqlens[b + 1];
    cu_seqlens[b + 1] = run;
  }
  if (tid == 0) cu_seqlens[0] = 0;
  __syncthreads();
  for (int b = warp; b < batch; b += warps) {
    const int32_t* row = mask + static_cast<int64_t>(b) * seq;
    int next = cu_seqlens[b];
    for (int s0 = 0; s0 < seq; s0 += 32) {
      const int s = s0 + lane;
      const bool keep = s < seq && row[s] != 0;
      const unsigned votes = __ballot_sync(0xffffffffu, keep);
      if (keep) {
        token_index[next + __popc(votes & ((1u << lane) - 1u))] =
            static_cast<int32_t>(static_cast<int64_t>(b) * seq + s);
      }
      next += __popc(votes);
    }
  }
  const int64_t total = cu_seqlens[batch];
  for (int64_t r = total + tid; r < capacity; r += blockDim.x) token_index[r] = -1;
}

template <typename T, int VEC>
__global__ void first_tokens_kernel(const T* __restrict__ x, SequenceLayout layout,
                                    T* __restrict__ out, int hidden) {
  begin_dependent_kernel();
  const int b = blockIdx.x;
  int64_t first = static_cast<int64_t>(b) * layout.max_seq;
  if (layout.packed()) {
    first = layout.cu_seqlens[b] < layout.cu_seqlens[b + 1] ? layout.cu_seqlens[b] : -1;
  }
  T* dst = out + static_cast<int64_t>(b) * hidden;
  for (int c = threadIdx.x; c < hidden / VEC; c += blockDim.x) {
    Vec<T, VEC> v;
    if (first >= 0) {
      v = load_vec<VEC>(x + first * hidden + c * VEC);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v.v[i] = from_float<T>(0.0f);  // an empty sequence
    }
    store_vec<VEC>(dst + c * VEC, v);
  }
}

// One thread per column of a sequence's mean (blockIdx.x: the sequence), summing its tokens in
// order: the same sums whatever the batch.
template <typename T>
__global__ void mean_tokens_kernel(const T* __restrict__ x, SequenceLayout layout,
                                   T* __restrict__ out, int hidden) {
  begin_dependent_kernel();
  const int b = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  const int64_t first = layout.packed() ? layout.cu_seqlens[b] : static_cast<int64_t>(b) * layout.max_seq;
  const int64_t end = layout.packed() ? layout.cu_seqlens[b + 1] : first + layout.max_seq;
  float sum = 0.0f;
  int count = 0;
  for (int64_t r = first; r < end; ++r) {
    if (!layout.packed() && layout.mask[r] == 0) continue;
    sum += to_float(x[r * hidden + c]);
    ++count;
  }
  out[static_cast<int64_t>(b) * hidden + c] = from_float<T>(count > 0 ? sum / static_cast<float>(count) : 0.0f);
}

// Row moves in words of W (16, 4 or 1 bytes: the widest that the row size and pointers allow).
template <typename W>
__global__ void scatter_rows_kernel(const W* __restrict__ in, SequenceLayout layout,
                                    W* __restrict__ out, int words) {
  begin_dependent_kernel();
  const int r = blockIdx.x;
  const int dst = layout.token_index[r];
  if (dst < 0) return;  // past the tokens
  for (int c = threadIdx.x; c < words; c += blockDim.x) {
    out[static_cast<int64_t>(dst) * words + c] = in[static_cast<int64_t>(r) * words + c];
  }
}

template <typename W>
__global__ void clear_rows_kernel(W* __restrict__ x, SequenceLayout layout, int words) {
  begin_dependent_kernel();
  const int64_t begin = static_cast<int64_t>(layout.cu_seqlens[layout.batch]) * words;
  const int64_t end = static_cast<int64_t>(layout.rows) * words;
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < end;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = W{};
  }
}

// Calls f(W{}) with the widest word that divides the row size and aligns every pointer.
template <typename F>
void with_word(size_t row_bytes, std::initializer_list<const void*> ptrs, F&& f) {
  const auto fits = [&](size_t w) {
    if (row_bytes % w != 0) return false;
    for (const void* p : ptrs)
      if (reinterpret_cast<uintptr_t>(p) % w != 0) return false;
    return true;
  };
  if (fits(16)) {
    f(uint4{});
  } else if (fits(4)) {
    f(uint32_t{});
  } else {
    f(uint8_t{});
  }
}

}  // namespace

void invoke_pack_sequences(const int32_t* mask, int batch, int seq, int32_t* cu_seqlens,
                           int32_t* token_index, int64_t capacity, int32_t* first_unattended,
                           cudaStream_t stream) {
  if (batch == 0) return;
  launch(pack_sequences_kernel, 1, kPackThreads, 0, stream, mask, batch, seq, cu_seqlens,
         token_index, capacity, first_unattended);
  FTBERT_LAUNCH_CHECK("pack_sequences_kernel", stream);
}

template <typename T>
void invoke_first_tokens(const T* x, const SequenceLayout& layout, T* out, int hidden,
                         cudaStream_t stream) {
  if (layout.batch == 0 || hidden == 0) return;
  const int vec = pick_vec<T>(hidden, {x, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    launch(first_tokens_kernel<T, VEC>, layout.batch, round_up(std::min(hidden / VEC, 256), 32),
           0, stream, x, layout, out, hidden);
  });
  FTBERT_LAUNCH_CHECK("first_tokens_kernel", stream);
}

template <typename T>
void invoke_mean_tokens(const T* x, const SequenceLayout& layout, T* out, int hidden,
                        cudaStream_t stream) {
  if (layout.batch == 0 || hidden == 0) return;
  constexpr int kThreads = 128;
  launch(mean_tokens_kernel<T>, dim3(layout.batch, (hidden + kThreads - 1) / kThreads), kThreads, 0,
         stream, x, layout, out, hidden);
  FTBERT_LAUNCH_CHECK("mean_tokens_kernel", stream);
}

void invoke_unpack_rows(const void* in, const SequenceLayout& layout, void* out, size_t row_bytes,
                        cudaStream_t stream) {
  const size_t padded = static_cast<size_t>(layout.batch) * layout.max_seq;
  if (padded == 0 || row_bytes == 0) return;
  FTBERT_CUDA_CHECK(cudaMemsetAsync(out, 0, padded * row_bytes, stream));
  if (layout.rows == 0) return;
  with_word(row_bytes, {in, out}, [&](auto word) {
    using W = decltype(word);
    const int words = static_cast<int>(row_bytes / sizeof(W));
    launch(scatter_rows_kernel<W>, layout.rows, round_up(std::min(words, 256), 32), 0, stream,
           static_cast<const W*>(in), layout, static_cast<W*>(out), words);
  });
  FTBERT_LAUNCH_CHECK("scatter_rows_kernel", stream);
}

void invoke_clear_rows_past_tokens(void* x, const SequenceLayout& layout, size_t row_bytes,
                                   cudaStream_t stream) {
  if (layout.rows == 0 || row_bytes == 0) return;
  with_word(row_bytes, {x}, [&](auto word) {
    using W = decltype(word);
    const int words = static_cast<int>(row_bytes / sizeof(W));
    const int64_t total = static_cast<int64_t>(layout.rows) * words;
    const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 1024));
    launch(clear_rows_kernel<W>, blocks, 256, 0, stream, static_cast<W*>(x), layout, words);
  });
  FTBERT_LAUNCH_CHECK("clear_rows_kernel", stream);
}

#define FTBERT_INSTANTIATE_SEQUENCES(T) \
  template void invoke_first_tokens<T>(const T*, const SequenceLayout&, T*, int, cudaStream_t); \
  template void invoke_mean_tokens<T>(const T*, const SequenceLayout&, T*, int, cudaStream_t);
FTBERT_INSTANTIATE_SEQUENCES(float)
FTBERT_INSTANTIATE_SEQUENCES(__half)
FTBERT_INSTANTIATE_SEQUENCES(__nv_bfloat16)
#undef FTBERT_INSTANTIATE_SEQUENCES

}  // namespace ftbert::cuda
