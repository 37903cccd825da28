// Rotary position embedding (RoPE, transformers' rotate_half convention), in place on the Q and K
// columns of the QKV GEMM output: in each head, column c < d/2 pairs with column c + d/2 and the
// pair (x1, x2) of the token at position p becomes
//   (x1·cos(θ[p, c]) − x2·sin(θ[p, c]),  x2·cos(θ[p, c]) + x1·sin(θ[p, c]))
// with cos and sin read from a float32 table [P, d] = [cos of the d/2 angles | sin of them], in
// fp32, rounded to T once. p is the position in the padded row, so packing changes no angle.
// With a bias, its Q and K parts are added to the pair first (in fp32). With dynamic rope scaling
// (RotaryDynamic), a packed sequence longer than `original` computes its cos and sin from its own
// frequencies instead (sincosf, accurate for the large angles of long sequences).
// A few rows per block (threadIdx.y); a thread takes VEC consecutive pairs of one head (VEC
// divides d/2, so a vector never crosses a head) and owns both halves of them: no thread reads
// what another writes.
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {
namespace {

// kernels

// VEC floats of the table, in pieces of at most 16 bytes (its rows are only that aligned).
template <int VEC>
__device__ __forceinline__ void load_floats(const float* __restrict__ p, float (&v)[VEC]) {
  constexpr int P = VEC < 4 ? VEC : 4;
#pragma unroll
  for (int j = 0; j < VEC; j += P) {
    const Vec<float, P> piece = load_vec<P>(p + j);
#pragma unroll
    for (int i = 0; i < P; ++i) v[j + i] = piece.v[i];
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
    rotary_embedding_kernel(T* __restrict__ qkv, const float* __restrict__ rotary,
                            const T* __restrict__ bias, SequenceLayout layout, int heads,
                            int head_dim, RotaryDynamic dynamic) {
  begin_dependent_kernel();
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= layout.rows) return;
  const int token = layout.packed() ? layout.token_index[row] : row;  // b·S + s
  if (token < 0) return;  // past the packed tokens
  const int pos = token % layout.max_seq;
  const int half = head_dim / 2;
  const float* cos_row = rotary + static_cast<int64_t>(pos) * head_dim;
  const float* sin_row = cos_row + half;
  // A scaled sequence's frequencies [d/2], or null: the table's angles.
  const float* inv = nullptr;
  if (dynamic.on()) {
    const int extent = layout.sequence_extent(token);
    if (extent > dynamic.original) {
      inv = dynamic.inv_freq + static_cast<int64_t>(extent - dynamic.original - 1) * half;
    }
  }
  T* x = qkv + static_cast<int64_t>(row) * 3 * heads * head_dim;
  // Pairs of a row: 2·heads head parts (Q's heads, then K's) of d/2 pairs each.
  const int chunks = heads * head_dim / VEC;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const int pair = c * VEC;
    const int part = pair / half;  // Q's head h is part h, K's head h is part heads + h
    const int i0 = pair - part * half;
    T* x1p = x + part * head_dim + i0;
    T* x2p = x1p + half;
    const Vec<T, VEC> a = load_vec<VEC>(x1p);
    const Vec<T, VEC> b = load_vec<VEC>(x2p);
    float cs[VEC], sn[VEC], b1[VEC] = {}, b2[VEC] = {};
    if (inv == nullptr) {
      load_floats<VEC>(cos_row + i0, cs);
      load_floats<VEC>(sin_row + i0, sn);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) sincosf(static_cast<float>(pos) * inv[i0 + i], &sn[i], &cs[i]);
    }
    if (bias != nullptr) {
      const T* b1p = bias + part * head_dim + i0;
      const Vec<T, VEC> ba = load_vec<VEC>(b1p);
      const Vec<T, VEC> bb = load_vec<VEC>(b1p + half);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        b1[i] = to_float(ba.v[i]);
        b2[i] = to_float(bb.v[i]);
      }
    }
    Vec<T, VEC> y1, y2;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const float x1 = to_float(a.v[i]) + b1[i], x2 = to_float(b.v[i]) + b2[i];
      y1.v[i] = from_float<T>(x1 * cs[i] - x2 * sn[i]);
      y2.v[i] = from_float<T>(x2 * cs[i] + x1 * sn[i]);
    }
    store_vec<VEC>(x1p, y1);
    store_vec<VEC>(x2p, y2);
  }
}

}  // namespace

// launchers

template <typename T>
void invoke_rotary_embedding(T* qkv, const float* rotary, const SequenceLayout& layout, int heads,
                             int head_dim, cudaStream_t stream, const T* bias,
                             const RotaryDynamic& dynamic) {
  FTBERT_CHECK(head_dim > 0 && head_dim % 2 == 0,
               "rotary_embedding: head dim " << head_dim << " must be even");
  FTBERT_CHECK(!dynamic.on() || layout.packed() || layout.rows == 0,
               "rotary_embedding: dynamic rope scaling needs a packed layout");
  FTBERT_CHECK(layout.max_seq > 0 || layout.rows == 0,
               "rotary_embedding: a layout with rows needs max_seq > 0");
  FTBERT_CHECK(!layout.packed() || layout.token_index != nullptr || layout.rows == 0,
               "rotary_embedding: a packed layout needs token_index");
  const int rows = layout.rows;
  if (rows == 0 || heads == 0) return;
  const int half = head_dim / 2;
  // The table is read VEC floats at a time in 16-byte pieces at most: its alignment caps VEC too.
  int vec = pick_vec<T>(half, {qkv, bias});
  while (vec > 1 && !is_aligned(rotary, (vec < 4 ? vec : 4) * sizeof(float))) vec /= 2;
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const dim3 block = row_block(heads * head_dim / VEC);
    launch(rotary_embedding_kernel<T, VEC>, ceil_div(rows, block.y), block, 0, stream, qkv,
           rotary, bias, layout, heads, head_dim, dynamic);
  });
  FTBERT_LAUNCH_CHECK("rotary_embedding_kernel", stream);
}

template void invoke_rotary_embedding<float>(float*, const float*, const SequenceLayout&, int, int,
                                             cudaStream_t, const float*, const RotaryDynamic&);
template void invoke_rotary_embedding<__half>(__half*, const float*, const SequenceLayout&, int,
                                              int, cudaStream_t, const __half*,
                                              const RotaryDynamic&);
template void invoke_rotary_embedding<__nv_bfloat16>(__nv_bfloat16*, const float*,
                                                     const SequenceLayout&, int, int,
                                                     cudaStream_t, const __nv_bfloat16*,
                                                     const RotaryDynamic&);

}  // namespace ftbert::cuda
