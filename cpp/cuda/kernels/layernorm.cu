// LayerNorm fused with what precedes it, one block per row (token):
//   add_bias_residual_layernorm: x = LN(x + bias + residual) · gamma + beta        (in place)
//   partials_residual_layernorm: out = LN(Σ_s partials[s] + bias + residual) · gamma + beta
//                                (a k-split GEMM's fp32 partials, summed as the row is read)
//   embed_layernorm:             out = LN(word[id] + position[s] + token_type[t]) · gamma + beta
//                                (no position table: LN(word[id] + token_type[t]); a template bool)
//   residual_add_layernorm:      residual = round(residual + (x + bias)), stored;
//                                out = LN(stored residual) · gamma + beta  (pre-LN residual step)
//   residual_add_rmsnorm:        the same with out = RMS(stored residual) · gamma
//   embed_rmsnorm:               embedded = word[id]; out = RMS(word[id]) · gamma
// where RMS(v) = v / sqrt(mean(v²) + eps) (RMSNorm: pre-RMSNorm encoders such as EuroBERT).
// The pre-norm row is summed in fp32 and kept in shared memory (hidden·4 bytes), so the statistics
// are exact two-pass ones (mean, then Σ(v - mean)²) for any hidden size, and the row is read from
// global memory once. Each thread only revisits the shared-memory vectors it wrote itself.
// From 128 rows, the residual LayerNorm of a GEMM's own output whose rows fit a warp's registers
// (up to 1024 16-bit values, BERT's sizes) runs one warp per row instead, with the same two-pass
// statistics; so do the embedding's and the pre-LN residual step's, at every row count.
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/gemm/split_k.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/e4m3.cuh"
#include "cuda/kernels/kernels.h"

namespace ftbert::cuda {
namespace {

constexpr int kMaxThreads = 256;

// kernels

// VEC fp32 values to/from an fp32 row (the shared-memory row, a split GEMM's partials), in
// pieces of at most 16 bytes (such rows are only guaranteed 16-byte alignment).
template <int VEC>
__device__ __forceinline__ void store_row(float* row, const float (&v)[VEC]) {
  constexpr int P = VEC < 4 ? VEC : 4;
#pragma unroll
  for (int j = 0; j < VEC; j += P) {
    Vec<float, P> piece;
#pragma unroll
    for (int i = 0; i < P; ++i) piece.v[i] = v[j + i];
    store_vec<P>(row + j, piece);
  }
}

template <int VEC>
__device__ __forceinline__ void load_row(const float* row, float (&v)[VEC]) {
  constexpr int P = VEC < 4 ? VEC : 4;
#pragma unroll
  for (int j = 0; j < VEC; j += P) {
    const Vec<float, P> piece = load_vec<P>(row + j);
#pragma unroll
    for (int i = 0; i < P; ++i) v[j + i] = piece.v[i];
  }
}

// A thread's first VEC-vector of a weight row (at c = threadIdx.x; with BERT's sizes its only
// one), loaded before the kernel's begin_dependent_kernel(): weights are uploaded by copies and
// no kernel writes them (launch.cuh), so the load overlaps the wait for the kernel before, and
// the value is in registers when the row needs it instead of costing a memory round trip then.
template <typename T, int VEC>
struct WeightAhead {
  const T* p;
  Vec<T, VEC> first;
  __device__ __forceinline__ WeightAhead(const T* weights, int chunks) : p(weights), first{} {
    if (static_cast<int>(threadIdx.x) < chunks) first = load_vec<VEC>(p + threadIdx.x * VEC);
  }
  __device__ __forceinline__ Vec<T, VEC> at(int c) const {
    return c == static_cast<int>(threadIdx.x) ? first : load_vec<VEC>(p + c * VEC);
  }
};

// Whether a row's outputs stored as T are finite, from the NaN-propagating max of their |y| in
// fp32 before rounding: the rounded value is ±inf exactly when |y| reaches kOverflow (round to
// nearest even), and a NaN stays NaN. One max per element, where converting each stored value
// back and testing it took three instructions (docs/performance.md, "Kernel choices").
template <typename T>
struct FiniteCheck {
  // The smallest |y| that rounds to ±inf in T: halfway between T's largest finite value and the
  // next power of two.
  static constexpr float kOverflow = std::is_same<T, __half>::value ? 65520.0f
                                     : std::is_same<T, __nv_bfloat16>::value
                                         ? 0x1.ffp+127f  // (2 - 2^-8) * 2^127
                                         : __builtin_huge_valf();
  float max_abs = 0.0f;
  __device__ __forceinline__ void add(float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("max.NaN.f32 %0, %0, %1;" : "+f"(max_abs) : "f"(fabsf(y)));
#else
    max_abs = isnan(y) || isnan(max_abs) ? __int_as_float(0x7fffffff) : fmaxf(max_abs, fabsf(y));
#endif
  }
  __device__ __forceinline__ bool finite() const { return max_abs < kOverflow; }  // false on NaN
};

// Given this row's pre-norm values in `row` (fp32, written by the calling thread at the vectors it
// visits) and this thread's partial sum, writes LN(row) · gamma + beta to out. A NaN or Inf
// among the values stored (after rounding to T, where fp16 overflows) sets *nonfinite when given.
template <typename T, int VEC>
__device__ __forceinline__ void layernorm_row(const float* row, float partial_sum, int hidden,
                                              const WeightAhead<T, VEC>& gamma,
                                              const WeightAhead<T, VEC>& beta,
                                              T* __restrict__ out, float eps, float* scratch,
                                              int32_t* nonfinite = nullptr) {
  const int chunks = hidden / VEC;
  const float mean = block_sum(partial_sum, scratch) / hidden;
  float sq = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[VEC];
    load_row<VEC>(row + c * VEC, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const float d = v[i] - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(block_sum(sq, scratch) / hidden + eps);
  FiniteCheck<T> check;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[VEC];
    load_row<VEC>(row + c * VEC, v);
    const Vec<T, VEC> g = gamma.at(c);
    const Vec<T, VEC> b = beta.at(c);
    Vec<T, VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const float yi = (v[i] - mean) * rstd * to_float(g.v[i]) + to_float(b.v[i]);
      check.add(yi);
      y.v[i] = from_float<T>(yi);
    }
    store_vec<VEC>(out + c * VEC, y);
  }
  // Any thread may set it; all write the same value, so no atomic is needed.
  if (nonfinite != nullptr && !check.finite()) *nonfinite = 1;
}

// Where the residual LayerNorm kernels read the GEMM output they normalize: the VEC values from
// element `offset` (row * hidden + column) on, in fp32.
template <typename T>
struct DenseOutput {  // the GEMM's own output, in T
  const T* x;        // [M, H]
  template <int VEC>
  __device__ __forceinline__ void load(int64_t offset, float (&v)[VEC]) const {
    const Vec<T, VEC> a = load_vec<VEC>(x + offset);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = to_float(a.v[i]);
  }
};

struct SplitPartials {  // the k-split GEMM's fp32 partial products, summed here in split order
  static constexpr int kMaxSplits = kDenseMaxSplits;
  const float* p;  // [splits, M, H]
  int splits;
  int64_t stride;  // M * H
  template <int VEC>
  __device__ __forceinline__ void load(int64_t offset, float (&v)[VEC]) const {
    // Every split's loads are issued before the first is summed: one memory round trip, not one
    // per split.
    float w[kMaxSplits][VEC];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < splits) load_row<VEC>(p + s * stride + offset, w[s]);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = w[0][i];
#pragma unroll
    for (int s = 1; s < kMaxSplits; ++s) {
      if (s < splits) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] += w[s][i];
      }
    }
  }
};

template <typename T, int VEC, typename Source>
__global__ void __launch_bounds__(kMaxThreads)
    add_bias_residual_layernorm_kernel(Source source, const T* __restrict__ residual,
                                       const T* __restrict__ bias, const T* __restrict__ gamma,
                                       const T* __restrict__ beta, T* out, int hidden, float eps,
                                       int32_t* __restrict__ nonfinite) {
  const int chunks = hidden / VEC;
  const WeightAhead<T, VEC> bias_ahead(bias, chunks), gamma_ahead(gamma, chunks),
      beta_ahead(beta, chunks);
  begin_dependent_kernel();
  extern __shared__ float4 smem_row[];  // float4: 16-byte aligned for the vector accesses
  __shared__ float scratch[32];
  float* row = reinterpret_cast<float*>(smem_row);
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  const T* rr = residual + offset;

  // The whole row is read before layernorm_row's first barrier and written after it, so `out`
  // may be the source's own memory (in place).
  float sum = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Vec<T, VEC> r = load_vec<VEC>(rr + c * VEC);
    const Vec<T, VEC> b = bias_ahead.at(c);
    float v[VEC];
    source.template load<VEC>(offset + c * VEC, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      v[i] = v[i] + to_float(b.v[i]) + to_float(r.v[i]);
      sum += v[i];
    }
    store_row<VEC>(row + c * VEC, v);
  }
  layernorm_row<T, VEC>(row, sum, hidden, gamma_ahead, beta_ahead, out + offset, eps, scratch,
                        nonfinite);
}

// The same op with one warp per row and the row in registers (kChunks vectors per lane), for
// rows of up to 32 * kChunks vectors: no shared memory and no block barriers. With all of a row's
// loads in flight (below) it is the faster of the two on the GEMM's own output from 128 rows on;
// a k-split GEMM's partials keep the block kernel, whose threads share each row's split loads
// (docs/performance.md, "Kernel choices"; benchmarks/kernels/layernorm_variants.cu `small`).
constexpr int kWarpRowsPerBlock = 4;
// Blocks a multiprocessor must hold (__launch_bounds__): 6 lets ptxas use 72 registers instead
// of the 64 it chose by itself, which it met by reusing the first vectors' registers for the last
// vectors' loads, so those waited for the first to arrive. It keeps 7 blocks resident
// (docs/performance.md, "Kernel choices").
constexpr int kWarpMinBlocks = 6;
constexpr int kWarpMaxChunks = 4;   // hidden up to 1024 in 16-bit dtypes, 512 in float32
constexpr int kWarpMinRows = 128;   // from here on a warp per row (the GEMM's own output)

// A lane's vectors of a row held in registers are c = lane + 32 j (j < kChunks); a lane past
// the row's end (c >= chunks) works on the row's last vector instead (clamped, never out of
// bounds) and drops the result. So no load sits behind a branch, and all of a row's loads are in
// flight before the first is used. Behind `if (c < chunks)`, each vector's block used its values
// before the next one loaded: a memory round trip per vector (docs/performance.md, "Kernel
// choices").
__device__ __forceinline__ int lane_vector(int lane, int j, int chunks) {
  return min(lane + 32 * j, chunks - 1);
}

// The lane's vectors of a weight row (bias, gamma, beta), loaded before the kernel's
// begin_dependent_kernel() as WeightAhead's are.
template <typename T, int VEC, int kChunks>
__device__ __forceinline__ void load_lane_vectors(const T* __restrict__ weights, int lane,
                                                  int chunks, Vec<T, VEC> (&out)[kChunks]) {
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    out[j] = load_vec<VEC>(weights + lane_vector(lane, j, chunks) * VEC);
  }
}

// Given a row's pre-norm values spread over a warp (lane vectors as above, in fp32), writes
// LN(row) · gamma + beta to out_row with exact two-pass statistics from warp shuffles. A NaN or
// Inf among the values stored sets *nonfinite when given.
// With kCodes, the row's stored values also go to `codes` as e4m3 (e4m3.cuh), at row `row`.
template <typename T, int VEC, int kChunks, bool kCodes = false>
__device__ __forceinline__ void warp_layernorm_row(const float (&v)[kChunks][VEC], int lane,
                                                   int chunks, int hidden,
                                                   const Vec<T, VEC> (&gamma_v)[kChunks],
                                                   const Vec<T, VEC> (&beta_v)[kChunks],
                                                   T* __restrict__ out_row, float eps,
                                                   int32_t* __restrict__ nonfinite,
                                                   E4m3Rows codes = {}, int row = 0) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (lane + 32 * j < chunks) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) sum += v[j][i];
    }
  }
  const float mean = warp_sum(sum) / hidden;
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (lane + 32 * j < chunks) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float d = v[j][i] - mean;
        sq += d * d;
      }
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / hidden + eps);
  FiniteCheck<T> check;
  Vec<T, VEC> stored[kCodes ? kChunks : 1];
  float top = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) {
      const Vec<T, VEC>& g = gamma_v[j];
      const Vec<T, VEC>& b = beta_v[j];
      Vec<T, VEC> y;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float yi = (v[j][i] - mean) * rstd * to_float(g.v[i]) + to_float(b.v[i]);
        check.add(yi);
        y.v[i] = from_float<T>(yi);
      }
      store_vec<VEC>(out_row + c * VEC, y);
      if constexpr (kCodes) {
        stored[j] = y;
        e4m3_fold_top<T, VEC>(y, top);
      }
    }
  }
  if (nonfinite != nullptr && !check.finite()) *nonfinite = 1;
  if constexpr (kCodes) {
    top = warp_max(top);
    const float multiplier = e4m3_row_multiplier(top);
    unsigned char* code_row = codes.codes + static_cast<int64_t>(row) * hidden;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = lane + 32 * j;
      if (c < chunks) e4m3_store<T, VEC>(stored[j], multiplier, code_row + c * VEC);
    }
    if (lane == 0) codes.scales[row] = e4m3_row_scale(top);
  }
}

// Whether the warp kernels write e4m3 codes in the same pass for T and VEC: 16-bit values in
// pairs. Other forms (and the block kernels) leave them to invoke_quantize_rows_e4m3 after.
template <typename T, int VEC>
constexpr bool kFusedCodes = !std::is_same<T, float>::value && VEC % 2 == 0;

template <typename T, int VEC, int kChunks, typename Source, bool kCodes>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock, kWarpMinBlocks)
    add_bias_residual_layernorm_warp_kernel(Source source, const T* __restrict__ residual,
                                            const T* __restrict__ bias,
                                            const T* __restrict__ gamma,
                                            const T* __restrict__ beta, T* out, int rows,
                                            int hidden, float eps,
                                            int32_t* __restrict__ nonfinite, E4m3Rows codes) {
  const int row = blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = hidden / VEC;
  Vec<T, VEC> bias_v[kChunks], gamma_v[kChunks], beta_v[kChunks];
  load_lane_vectors<T, VEC, kChunks>(bias, lane, chunks, bias_v);
  load_lane_vectors<T, VEC, kChunks>(gamma, lane, chunks, gamma_v);
  load_lane_vectors<T, VEC, kChunks>(beta, lane, chunks, beta_v);
  begin_dependent_kernel();
  if (row >= rows) return;  // whole warps: the shuffles below only ever see full warps
  const int64_t offset = static_cast<int64_t>(row) * hidden;
  float v[kChunks][VEC];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane_vector(lane, j, chunks);
    const Vec<T, VEC> r = load_vec<VEC>(residual + offset + c * VEC);
    source.template load<VEC>(offset + c * VEC, v[j]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[j][i] = v[j][i] + to_float(bias_v[j].v[i]) + to_float(r.v[i]);
  }
  warp_layernorm_row<T, VEC, kChunks, kCodes>(v, lane, chunks, hidden, gamma_v, beta_v,
                                              out + offset, eps, nonfinite, codes, row);
}

// ---- the pre-LN residual step: residual = round(residual + (x + bias)); out = LN(residual) ------
// x and bias may each be null (uniform branches: nothing is loaded for them). The sum is rounded
// to T and stored, and the LayerNorm normalizes the rounded value, as a separate add and
// LayerNorm would. A row is read whole before any of it is written, so out may be x.

// v = residual + (x + bias) for the VEC elements at column `col` of the row at `offset` (x and
// bias may be null), in fp32.
template <typename T, int VEC>
__device__ __forceinline__ void residual_sum(const T* residual, const T* x, const T* bias,
                                             int64_t offset, int col, float (&v)[VEC]) {
  const Vec<T, VEC> r = load_vec<VEC>(residual + offset + col);
  float a[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) a[i] = 0.0f;
  if (x != nullptr) {
    const Vec<T, VEC> xv = load_vec<VEC>(x + offset + col);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = to_float(xv.v[i]);
  }
  if (bias != nullptr) {
    const Vec<T, VEC> b = load_vec<VEC>(bias + col);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] += to_float(b.v[i]);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = to_float(r.v[i]) + a[i];
}

// v rounded to T, stored at p, and v replaced by the rounded values.
template <typename T, int VEC>
__device__ __forceinline__ void round_and_store(T* p, float (&v)[VEC], bool store) {
  Vec<T, VEC> y;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    y.v[i] = from_float<T>(v[i]);
    v[i] = to_float(y.v[i]);
  }
  if (store) store_vec<VEC>(p, y);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads)
    residual_add_layernorm_kernel(T* __restrict__ residual, const T* x, const T* __restrict__ bias,
                                  const T* __restrict__ gamma, const T* __restrict__ beta, T* out,
                                  int hidden, float eps, int32_t* __restrict__ nonfinite) {
  const int chunks = hidden / VEC;
  const WeightAhead<T, VEC> gamma_ahead(gamma, chunks), beta_ahead(beta, chunks);
  begin_dependent_kernel();
  extern __shared__ float4 smem_row[];  // float4: 16-byte aligned for the vector accesses
  __shared__ float scratch[32];
  float* row = reinterpret_cast<float*>(smem_row);
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  const bool adds = x != nullptr || bias != nullptr;  // else residual is left as it is

  float sum = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[VEC];
    residual_sum<T, VEC>(residual, x, bias, offset, c * VEC, v);
    round_and_store<T, VEC>(residual + offset + c * VEC, v, adds);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum += v[i];
    store_row<VEC>(row + c * VEC, v);
  }
  layernorm_row<T, VEC>(row, sum, hidden, gamma_ahead, beta_ahead, out + offset, eps, scratch,
                        nonfinite);
}

// The same with one warp per row and the row in registers (lane vectors as in
// add_bias_residual_layernorm_warp_kernel). Rows of 64 bytes a lane (1024 16-bit values) need
// more than the 80 registers kWarpMinBlocks leaves (ptxas spilled); 5 blocks leave 96.
template <typename T, int VEC, int kChunks>
constexpr int residual_warp_min_blocks() {
  return kChunks * VEC * sizeof(T) > 48 ? 5 : kWarpMinBlocks;
}

template <typename T, int VEC, int kChunks>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock,
                                  (residual_warp_min_blocks<T, VEC, kChunks>()))
    residual_add_layernorm_warp_kernel(T* __restrict__ residual, const T* x,
                                       const T* __restrict__ bias, const T* __restrict__ gamma,
                                       const T* __restrict__ beta, T* out, int rows, int hidden,
                                       float eps, int32_t* __restrict__ nonfinite) {
  const int row = blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = hidden / VEC;
  // gamma and beta ahead of the wait; the bias (often none) with the row, which keeps the
  // registers within the launch bounds' budget.
  Vec<T, VEC> gamma_v[kChunks], beta_v[kChunks];
  load_lane_vectors<T, VEC, kChunks>(gamma, lane, chunks, gamma_v);
  load_lane_vectors<T, VEC, kChunks>(beta, lane, chunks, beta_v);
  begin_dependent_kernel();
  if (row >= rows) return;  // whole warps: the shuffles below only ever see full warps
  const int64_t offset = static_cast<int64_t>(row) * hidden;
  const bool adds = x != nullptr || bias != nullptr;
  float v[kChunks][VEC];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    residual_sum<T, VEC>(residual, x, bias, offset, lane_vector(lane, j, chunks) * VEC, v[j]);
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;  // a lane past the row's end rounds a copy and stores nothing
    round_and_store<T, VEC>(residual + offset + min(c, chunks - 1) * VEC, v[j],
                            adds && c < chunks);
  }
  warp_layernorm_row<T, VEC, kChunks>(v, lane, chunks, hidden, gamma_v, beta_v, out + offset, eps,
                                      nonfinite);
}

// The three table rows a token's embedding sums: its word's, its position s's and its token
// type's (0 without types). Ids and types are clamped so that bad input on the device reads a
// valid row instead of out of bounds. kPosition = false: there is no position table (rotary
// models) and `position` stays null.
template <typename T>
struct EmbeddingRows {
  const T* word;
  const T* position;
  const T* type;
};

template <typename T, bool kPosition>
__device__ __forceinline__ EmbeddingRows<T> embedding_rows(
    const int32_t* __restrict__ input_ids, const int32_t* __restrict__ token_type_ids,
    const T* word, const T* position, const T* token_type, int at, int s, int hidden, int vocab,
    int type_vocab) {
  const int id = min(max(input_ids[at], 0), vocab - 1);
  const int type = token_type_ids ? min(max(token_type_ids[at], 0), type_vocab - 1) : 0;
  return {word + static_cast<int64_t>(id) * hidden,
          kPosition ? position + static_cast<int64_t>(s) * hidden : nullptr,
          token_type + static_cast<int64_t>(type) * hidden};
}

// Vector c of a token's embedding sum, in fp32: word + position + type, or word + type; each
// value is also added to *sum when it is given.
template <typename T, int VEC, bool kPosition>
__device__ __forceinline__ void embedding_sum(const T* w, const T* p, const T* t, int c,
                                              float (&v)[VEC], float* sum = nullptr) {
  if constexpr (kPosition) {
    const Vec<T, VEC> a = load_vec<VEC>(w + c * VEC);
    const Vec<T, VEC> b = load_vec<VEC>(p + c * VEC);
    const Vec<T, VEC> e = load_vec<VEC>(t + c * VEC);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      v[i] = to_float(a.v[i]) + to_float(b.v[i]) + to_float(e.v[i]);
      if (sum != nullptr) *sum += v[i];
    }
  } else {
    const Vec<T, VEC> a = load_vec<VEC>(w + c * VEC);
    const Vec<T, VEC> e = load_vec<VEC>(t + c * VEC);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      v[i] = to_float(a.v[i]) + to_float(e.v[i]);
      if (sum != nullptr) *sum += v[i];
    }
  }
}

template <typename T, int VEC, bool kPosition>
__global__ void __launch_bounds__(kMaxThreads)
    embed_layernorm_kernel(const int32_t* __restrict__ input_ids,
                           const int32_t* __restrict__ token_type_ids, const T* __restrict__ word,
                           const T* __restrict__ position, const T* __restrict__ token_type,
                           const T* __restrict__ gamma, const T* __restrict__ beta,
                           T* __restrict__ out, SequenceLayout layout, int hidden, int vocab,
                           int type_vocab, float eps, int position_pad_id) {
  const WeightAhead<T, VEC> gamma_ahead(gamma, hidden / VEC), beta_ahead(beta, hidden / VEC);
  begin_dependent_kernel();
  extern __shared__ float4 smem_row[];
  __shared__ float scratch[32];
  float* row = reinterpret_cast<float*>(smem_row);
  T* out_row = out + static_cast<int64_t>(blockIdx.x) * hidden;
  // The token at this row's padded position (packed: token_index; -1 past the tokens: zeros).
  const int token = layout.packed() ? layout.token_index[blockIdx.x] : blockIdx.x;
  if (token < 0) {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) out_row[c] = from_float<T>(0.0f);
    return;
  }
  int s = token % layout.max_seq;
  // Where its ids are: at its row when they came packed, else at its padded position.
  const int at = layout.ids_packed ? blockIdx.x : token;
  if (kPosition && position_pad_id >= 0) {
    // The RoBERTa family's position: the non-pad ids up to this token, counted by the block.
    const int32_t* row_ids = input_ids + (at - s);
    float real = 0.0f;
    for (int j = threadIdx.x; j <= s; j += blockDim.x) real += row_ids[j] != position_pad_id;
    const int counted = static_cast<int>(block_sum(real, scratch));
    s = row_ids[s] != position_pad_id ? position_pad_id + counted : position_pad_id;
  }
  const EmbeddingRows<T> tables = embedding_rows<T, kPosition>(
      input_ids, token_type_ids, word, position, token_type, at, s, hidden, vocab, type_vocab);
  const T *w = tables.word, *p = tables.position, *t = tables.type;

  float sum = 0.0f;
  for (int c = threadIdx.x; c < hidden / VEC; c += blockDim.x) {
    float v[VEC];
    embedding_sum<T, VEC, kPosition>(w, p, t, c, v, &sum);
    store_row<VEC>(row + c * VEC, v);
  }
  layernorm_row<T, VEC>(row, sum, hidden, gamma_ahead, beta_ahead, out_row, eps, scratch);
}

// embed_layernorm_kernel's op with one warp per row, the row in registers as in
// add_bias_residual_layernorm_warp_kernel, for rows of up to 32 * kChunks vectors. It runs at
// every row count (not only from kWarpMinRows on), so that a packed forward's rows and the same
// tokens' padded rows come from the same arithmetic. BERT-base float16 on an H100, us per
// embedding in the forward (profiler), block kernel against this one: 4,096 rows 9.8 vs 6.9,
// 16,384 rows 37.5 vs 21.9.
template <typename T, int VEC, int kChunks, bool kPosition, bool kCodes>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock, kWarpMinBlocks)
    embed_layernorm_warp_kernel(const int32_t* __restrict__ input_ids,
                                const int32_t* __restrict__ token_type_ids,
                                const T* __restrict__ word, const T* __restrict__ position,
                                const T* __restrict__ token_type, const T* __restrict__ gamma,
                                const T* __restrict__ beta, T* __restrict__ out,
                                SequenceLayout layout, int hidden, int vocab, int type_vocab,
                                float eps, int position_pad_id, E4m3Rows codes) {
  const int row = blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = hidden / VEC;
  Vec<T, VEC> gamma_v[kChunks], beta_v[kChunks];
  load_lane_vectors<T, VEC, kChunks>(gamma, lane, chunks, gamma_v);
  load_lane_vectors<T, VEC, kChunks>(beta, lane, chunks, beta_v);
  begin_dependent_kernel();
  if (row >= layout.rows) return;  // whole warps, as the shuffles need
  T* out_row = out + static_cast<int64_t>(row) * hidden;
  // The token at this row's padded position (packed: token_index; -1 past the tokens: zeros).
  const int token = layout.packed() ? layout.token_index[row] : row;
  if (token < 0) {
    Vec<T, VEC> zeros;
#pragma unroll
    for (int i = 0; i < VEC; ++i) zeros.v[i] = from_float<T>(0.0f);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (lane + 32 * j < chunks) store_vec<VEC>(out_row + (lane + 32 * j) * VEC, zeros);
    }
    if constexpr (kCodes) {  // a zero row's codes are zeros, its scale 1 (e4m3.cuh)
      unsigned char* code_row = codes.codes + static_cast<int64_t>(row) * hidden;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = lane + 32 * j;
        if (c < chunks) e4m3_store<T, VEC>(zeros, 1.0f, code_row + c * VEC);
      }
      if (lane == 0) codes.scales[row] = e4m3_row_scale(0.0f);
    }
    return;
  }
  int s = token % layout.max_seq;
  // Where its ids are: at its row when they came packed, else at its padded position.
  const int at = layout.ids_packed ? row : token;
  if (kPosition && position_pad_id >= 0) {
    // The RoBERTa family's position: the non-pad ids up to this token, counted by the warp.
    const int32_t* row_ids = input_ids + (at - s);
    int counted = 0;
    for (int j0 = 0; j0 <= s; j0 += 32) {
      const int j = j0 + lane;
      counted += __popc(__ballot_sync(0xffffffffu, j <= s && row_ids[j] != position_pad_id));
    }
    s = row_ids[s] != position_pad_id ? position_pad_id + counted : position_pad_id;
  }
  const EmbeddingRows<T> tables = embedding_rows<T, kPosition>(
      input_ids, token_type_ids, word, position, token_type, at, s, hidden, vocab, type_vocab);
  const T *w = tables.word, *p = tables.position, *t = tables.type;
  float v[kChunks][VEC];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    embedding_sum<T, VEC, kPosition>(w, p, t, lane_vector(lane, j, chunks), v[j]);
  }
  warp_layernorm_row<T, VEC, kChunks, kCodes>(v, lane, chunks, hidden, gamma_v, beta_v, out_row,
                                              eps, nullptr, codes, row);
}

// ---- RMSNorm: residual_add_rmsnorm, embed_rmsnorm -----------------------------------------------
// The LayerNorm kernels' structure (a block per row with the row in shared memory, or a warp per
// row with it in registers) with one statistic: Σv² in fp32, then y = v · rsqrt(Σv² / hidden +
// eps) · gamma, rounded to T once.

// Given this row's values in `row` (fp32, written by the calling thread at the vectors it visits)
// and this thread's partial sum of their squares, writes RMS(row) · gamma to out; a NaN or Inf
// among the values stored sets *nonfinite when given.
template <typename T, int VEC>
__device__ __forceinline__ void rmsnorm_row(const float* row, float partial_sq, int hidden,
                                            const WeightAhead<T, VEC>& gamma, T* __restrict__ out,
                                            float eps, float* scratch, int32_t* nonfinite) {
  const int chunks = hidden / VEC;
  const float rstd = rsqrtf(block_sum(partial_sq, scratch) / hidden + eps);
  FiniteCheck<T> check;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[VEC];
    load_row<VEC>(row + c * VEC, v);
    const Vec<T, VEC> g = gamma.at(c);
    Vec<T, VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const float yi = v[i] * rstd * to_float(g.v[i]);
      check.add(yi);
      y.v[i] = from_float<T>(yi);
    }
    store_vec<VEC>(out + c * VEC, y);
  }
  if (nonfinite != nullptr && !check.finite()) *nonfinite = 1;
}

// rmsnorm_row for a row spread over a warp (lane vectors as in warp_layernorm_row).
template <typename T, int VEC, int kChunks>
__device__ __forceinline__ void warp_rmsnorm_row(const float (&v)[kChunks][VEC], int lane,
                                                 int chunks, int hidden,
                                                 const Vec<T, VEC> (&gamma_v)[kChunks],
                                                 T* __restrict__ out_row, float eps,
                                                 int32_t* __restrict__ nonfinite) {
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (lane + 32 * j < chunks) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) sq += v[j][i] * v[j][i];
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / hidden + eps);
  FiniteCheck<T> check;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) {
      Vec<T, VEC> y;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float yi = v[j][i] * rstd * to_float(gamma_v[j].v[i]);
        check.add(yi);
        y.v[i] = from_float<T>(yi);
      }
      store_vec<VEC>(out_row + c * VEC, y);
    }
  }
  if (nonfinite != nullptr && !check.finite()) *nonfinite = 1;
}

// residual_add_layernorm_kernel's step with RMSNorm.
template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads)
    residual_add_rmsnorm_kernel(T* __restrict__ residual, const T* x, const T* __restrict__ bias,
                                const T* __restrict__ gamma, T* out, int hidden, float eps,
                                int32_t* __restrict__ nonfinite) {
  const int chunks = hidden / VEC;
  const WeightAhead<T, VEC> gamma_ahead(gamma, chunks);
  begin_dependent_kernel();
  extern __shared__ float4 smem_row[];  // float4: 16-byte aligned for the vector accesses
  __shared__ float scratch[32];
  float* row = reinterpret_cast<float*>(smem_row);
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  const bool adds = x != nullptr || bias != nullptr;  // else residual is left as it is

  float sq = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[VEC];
    residual_sum<T, VEC>(residual, x, bias, offset, c * VEC, v);
    round_and_store<T, VEC>(residual + offset + c * VEC, v, adds);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sq += v[i] * v[i];
    store_row<VEC>(row + c * VEC, v);
  }
  rmsnorm_row<T, VEC>(row, sq, hidden, gamma_ahead, out + offset, eps, scratch, nonfinite);
}

// residual_add_layernorm_warp_kernel's step with RMSNorm (no beta: fewer registers, the same
// launch bounds).
template <typename T, int VEC, int kChunks>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock,
                                  (residual_warp_min_blocks<T, VEC, kChunks>()))
    residual_add_rmsnorm_warp_kernel(T* __restrict__ residual, const T* x,
                                     const T* __restrict__ bias, const T* __restrict__ gamma,
                                     T* out, int rows, int hidden, float eps,
                                     int32_t* __restrict__ nonfinite) {
  const int row = blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = hidden / VEC;
  Vec<T, VEC> gamma_v[kChunks];
  load_lane_vectors<T, VEC, kChunks>(gamma, lane, chunks, gamma_v);
  begin_dependent_kernel();
  if (row >= rows) return;  // whole warps: the shuffles below only ever see full warps
  const int64_t offset = static_cast<int64_t>(row) * hidden;
  const bool adds = x != nullptr || bias != nullptr;
  float v[kChunks][VEC];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    residual_sum<T, VEC>(residual, x, bias, offset, lane_vector(lane, j, chunks) * VEC, v[j]);
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;  // a lane past the row's end rounds a copy and stores nothing
    round_and_store<T, VEC>(residual + offset + min(c, chunks - 1) * VEC, v[j],
                            adds && c < chunks);
  }
  warp_rmsnorm_row<T, VEC, kChunks>(v, lane, chunks, hidden, gamma_v, out + offset, eps,
                                    nonfinite);
}

// The word row of the token at layout row `row` (read as embed_layernorm's kernels read it), or
// null for a packed row past the tokens (token_index -1). The id is clamped as embedding_rows
// clamps it.
template <typename T>
__device__ __forceinline__ const T* token_word_row(const int32_t* __restrict__ input_ids,
                                                   const T* word, const SequenceLayout& layout,
                                                   int row, int hidden, int vocab) {
  const int token = layout.packed() ? layout.token_index[row] : row;
  if (token < 0) return nullptr;
  const int at = layout.ids_packed ? row : token;
  const int id = min(max(input_ids[at], 0), vocab - 1);
  return word + static_cast<int64_t>(id) * hidden;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads)
    embed_rmsnorm_kernel(const int32_t* __restrict__ input_ids, const T* __restrict__ word,
                         const T* __restrict__ gamma, T* __restrict__ embedded,
                         T* __restrict__ out, SequenceLayout layout, int hidden, int vocab,
                         float eps) {
  const int chunks = hidden / VEC;
  const WeightAhead<T, VEC> gamma_ahead(gamma, chunks);
  begin_dependent_kernel();
  extern __shared__ float4 smem_row[];
  __shared__ float scratch[32];
  float* row = reinterpret_cast<float*>(smem_row);
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * hidden;
  const T* w = token_word_row<T>(input_ids, word, layout, blockIdx.x, hidden, vocab);
  if (w == nullptr) {  // the whole block returns: no barrier below is left waiting
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      embedded[offset + c] = from_float<T>(0.0f);
      out[offset + c] = from_float<T>(0.0f);
    }
    return;
  }
  float sq = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Vec<T, VEC> a = load_vec<VEC>(w + c * VEC);
    store_vec<VEC>(embedded + offset + c * VEC, a);
    float v[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      v[i] = to_float(a.v[i]);
      sq += v[i] * v[i];
    }
    store_row<VEC>(row + c * VEC, v);
  }
  rmsnorm_row<T, VEC>(row, sq, hidden, gamma_ahead, out + offset, eps, scratch, nullptr);
}

// embed_rmsnorm_kernel's op with one warp per row, at every row count as
// embed_layernorm_warp_kernel (packed rows and padded rows from the same arithmetic).
template <typename T, int VEC, int kChunks>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock, kWarpMinBlocks)
    embed_rmsnorm_warp_kernel(const int32_t* __restrict__ input_ids, const T* __restrict__ word,
                              const T* __restrict__ gamma, T* __restrict__ embedded,
                              T* __restrict__ out, SequenceLayout layout, int hidden, int vocab,
                              float eps) {
  const int row = blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = hidden / VEC;
  Vec<T, VEC> gamma_v[kChunks];
  load_lane_vectors<T, VEC, kChunks>(gamma, lane, chunks, gamma_v);
  begin_dependent_kernel();
  if (row >= layout.rows) return;  // whole warps, as the shuffles need
  const int64_t offset = static_cast<int64_t>(row) * hidden;
  const T* w = token_word_row<T>(input_ids, word, layout, row, hidden, vocab);
  if (w == nullptr) {
    Vec<T, VEC> zeros;
#pragma unroll
    for (int i = 0; i < VEC; ++i) zeros.v[i] = from_float<T>(0.0f);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = lane + 32 * j;
      if (c < chunks) {
        store_vec<VEC>(embedded + offset + c * VEC, zeros);
        store_vec<VEC>(out + offset + c * VEC, zeros);
      }
    }
    return;
  }
  Vec<T, VEC> a[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) a[j] = load_vec<VEC>(w + lane_vector(lane, j, chunks) * VEC);
  float v[kChunks][VEC];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) store_vec<VEC>(embedded + offset + c * VEC, a[j]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[j][i] = to_float(a[j].v[i]);
  }
  warp_rmsnorm_row<T, VEC, kChunks>(v, lane, chunks, hidden, gamma_v, out + offset, eps, nullptr);
}

// Dynamic shared memory for one row; above the 48 KiB default the kernel must opt in, up to what
// the device allows per block (227 KiB on H100: hidden up to ~58k).
template <typename Kernel>
size_t row_smem_bytes(Kernel kernel, int hidden) {
  const size_t bytes = static_cast<size_t>(hidden) * sizeof(float);
  if (bytes > 48 * 1024) {
    int device = 0, optin = 0;
    FTBERT_CUDA_CHECK(cudaGetDevice(&device));
    FTBERT_CUDA_CHECK(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t limit = static_cast<size_t>(optin) - 32 * sizeof(float);  // minus the scratch
    FTBERT_CHECK(bytes <= limit, "layernorm: hidden size " << hidden << " needs " << bytes
                                     << " bytes of shared memory per row; this device allows "
                                     << limit);
    FTBERT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  }
  return bytes;
}

int row_threads(int chunks) { return round_up(chunks < kMaxThreads ? chunks : kMaxThreads, 32); }

// f(std::integral_constant<int, per_lane>) for the warp kernels' vectors per lane, 1 to
// kWarpMaxChunks.
template <typename F>
void with_warp_chunks(int per_lane, F&& f) {
  static_assert(kWarpMaxChunks == 4, "one case per count");
  if (per_lane == 1) f(std::integral_constant<int, 1>{});
  else if (per_lane == 2) f(std::integral_constant<int, 2>{});
  else if (per_lane == 3) f(std::integral_constant<int, 3>{});
  else f(std::integral_constant<int, 4>{});
}

// Runs the residual LayerNorm over `source` with VEC-wide vectors: a warp per row for the GEMM's
// own output from kWarpMinRows rows (at every row count when batch_invariant) when each row fits
// kWarpMaxChunks vectors per lane, else a block per row.
// Where `codes` are given, out's rows also go there in e4m3: written by the warp kernel in the same
// pass where it runs (kFusedCodes), else by invoke_quantize_rows_e4m3 after.
template <typename T, int VEC, typename Source>
void launch_residual_layernorm(const Source& source, const T* residual, const T* bias,
                               const T* gamma, const T* beta, T* out, int rows, int hidden,
                               float eps, int32_t* nonfinite, cudaStream_t stream,
                               bool batch_invariant = false, E4m3Rows codes = {}) {
  const int chunks = hidden / VEC;
  if constexpr (!std::is_same<Source, SplitPartials>::value) {
    const int per_lane = ceil_div(chunks, 32);
    if ((rows >= kWarpMinRows || batch_invariant) && per_lane <= kWarpMaxChunks) {
      const int blocks = ceil_div(rows, kWarpRowsPerBlock);
      bool fused = false;
      with_warp_chunks(per_lane, [&](auto chunks_c) {
        constexpr int kChunks = decltype(chunks_c)::value;
        if constexpr (kFusedCodes<T, VEC>) {
          if (codes.codes != nullptr) {
            launch(add_bias_residual_layernorm_warp_kernel<T, VEC, kChunks, Source, true>, blocks,
                   32 * kWarpRowsPerBlock, 0, stream, source, residual, bias, gamma, beta, out,
                   rows, hidden, eps, nonfinite, codes);
            fused = true;
            return;
          }
        }
        launch(add_bias_residual_layernorm_warp_kernel<T, VEC, kChunks, Source, false>, blocks,
               32 * kWarpRowsPerBlock, 0, stream, source, residual, bias, gamma, beta, out, rows,
               hidden, eps, nonfinite, E4m3Rows{});
      });
      if (codes.codes != nullptr && !fused) {
        invoke_quantize_rows_e4m3(out, hidden, rows, hidden, codes, stream);
      }
      return;
    }
  }
  auto kernel = add_bias_residual_layernorm_kernel<T, VEC, Source>;
  const size_t smem = row_smem_bytes(kernel, hidden);
  launch(kernel, rows, row_threads(chunks), smem, stream, source, residual, bias, gamma, beta,
         out, hidden, eps, nonfinite);
  if (codes.codes != nullptr) invoke_quantize_rows_e4m3(out, hidden, rows, hidden, codes, stream);
}

}  // namespace

// launchers

template <typename T>
void invoke_dense_residual_layernorm(const T* x, const T* residual, const T* bias, const T* gamma,
                                     const T* beta, T* out, int rows, int hidden, float eps,
                                     int32_t* nonfinite, cudaStream_t stream,
                                     bool batch_invariant, E4m3Rows codes) {
  if (rows == 0 || hidden == 0) return;
  const int vec = pick_vec<T>(hidden, {x, residual, bias, gamma, beta, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    launch_residual_layernorm<T, VEC>(DenseOutput<T>{x}, residual, bias, gamma, beta, out, rows,
                                      hidden, eps, nonfinite, stream, batch_invariant, codes);
  });
  FTBERT_LAUNCH_CHECK("add_bias_residual_layernorm_kernel", stream);
}

template <typename T>
void invoke_add_bias_residual_layernorm(T* x, const T* residual, const T* bias, const T* gamma,
                                        const T* beta, int rows, int hidden, float eps,
                                        int32_t* nonfinite, cudaStream_t stream,
                                        bool batch_invariant) {
  invoke_dense_residual_layernorm(x, residual, bias, gamma, beta, x, rows, hidden, eps, nonfinite,
                                  stream, batch_invariant);
}

template <typename T>
void invoke_partials_residual_layernorm(const float* partials, int splits, const T* residual,
                                        const T* bias, const T* gamma, const T* beta, T* out,
                                        int rows, int hidden, float eps, int32_t* nonfinite,
                                        cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  FTBERT_CHECK(splits >= 1 && splits <= SplitPartials::kMaxSplits,
               "partials_residual_layernorm: " << splits << " splits; 1 to "
                                               << SplitPartials::kMaxSplits << " are summed");
  // The partials are read VEC floats at a time, in 16-byte pieces at most.
  int vec = pick_vec<T>(hidden, {residual, bias, gamma, beta, out});
  while (vec > 1 && !is_aligned(partials, (vec < 4 ? vec : 4) * sizeof(float))) vec /= 2;
  const SplitPartials source{partials, splits, static_cast<int64_t>(rows) * hidden};
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    launch_residual_layernorm<T, VEC>(source, residual, bias, gamma, beta, out, rows, hidden, eps,
                                      nonfinite, stream);
  });
  FTBERT_LAUNCH_CHECK("add_bias_residual_layernorm_kernel (split partials)", stream);
}

template <typename T>
void invoke_residual_add_layernorm(T* residual, const T* x, const T* bias, const T* gamma,
                                   const T* beta, T* out, int rows, int hidden, float eps,
                                   int32_t* nonfinite, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  FTBERT_CHECK(out != residual, "residual_add_layernorm: out must not be the residual");
  const int vec = pick_vec<T>(hidden, {residual, x, bias, gamma, beta, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const int chunks = hidden / VEC;
    // A warp per row whenever the row fits its registers, at every row count: a packed forward's
    // rows and the same tokens' padded rows then come from the same arithmetic.
    const int per_lane = ceil_div(chunks, 32);
    if (per_lane <= kWarpMaxChunks) {
      const int blocks = ceil_div(rows, kWarpRowsPerBlock);
      with_warp_chunks(per_lane, [&](auto chunks_c) {
        constexpr int kChunks = decltype(chunks_c)::value;
        launch(residual_add_layernorm_warp_kernel<T, VEC, kChunks>, blocks,
               32 * kWarpRowsPerBlock, 0, stream, residual, x, bias, gamma, beta, out, rows,
               hidden, eps, nonfinite);
      });
      return;
    }
    auto kernel = residual_add_layernorm_kernel<T, VEC>;
    const size_t smem = row_smem_bytes(kernel, hidden);
    launch(kernel, rows, row_threads(chunks), smem, stream, residual, x, bias, gamma, beta, out,
           hidden, eps, nonfinite);
  });
  FTBERT_LAUNCH_CHECK("residual_add_layernorm_kernel", stream);
}

template <typename T>
void invoke_embed_layernorm(const int32_t* input_ids, const int32_t* token_type_ids, const T* word,
                            const T* position, const T* token_type, const T* gamma, const T* beta,
                            T* out, const SequenceLayout& layout, int hidden, int vocab,
                            int type_vocab, float eps, int position_pad_id, cudaStream_t stream,
                            E4m3Rows codes) {
  const int rows = layout.rows;
  if (rows == 0 || hidden == 0) return;
  FTBERT_CHECK(vocab > 0 && type_vocab > 0,
               "embed_layernorm: vocab " << vocab << " and type_vocab " << type_vocab
                                         << " must be positive");
  // A null position table (null is aligned to anything) adds no position: kPosition = false.
  const int vec = pick_vec<T>(hidden, {word, position, token_type, gamma, beta, out});
  auto run = [&](auto vec_c, auto position_c) {
    constexpr int VEC = decltype(vec_c)::value;
    constexpr bool kPosition = decltype(position_c)::value;
    const int per_lane = ceil_div(hidden / VEC, 32);
    if (per_lane <= kWarpMaxChunks) {
      const int blocks = ceil_div(rows, kWarpRowsPerBlock);
      bool fused = false;
      with_warp_chunks(per_lane, [&](auto chunks_c) {
        constexpr int kChunks = decltype(chunks_c)::value;
        if constexpr (kFusedCodes<T, VEC>) {
          if (codes.codes != nullptr) {
            launch(embed_layernorm_warp_kernel<T, VEC, kChunks, kPosition, true>, blocks,
                   32 * kWarpRowsPerBlock, 0, stream, input_ids, token_type_ids, word, position,
                   token_type, gamma, beta, out, layout, hidden, vocab, type_vocab, eps,
                   position_pad_id, codes);
            fused = true;
            return;
          }
        }
        launch(embed_layernorm_warp_kernel<T, VEC, kChunks, kPosition, false>, blocks,
               32 * kWarpRowsPerBlock, 0, stream, input_ids, token_type_ids, word, position,
               token_type, gamma, beta, out, layout, hidden, vocab, type_vocab, eps,
               position_pad_id, E4m3Rows{});
      });
      if (codes.codes != nullptr && !fused) {
        invoke_quantize_rows_e4m3(out, hidden, rows, hidden, codes, stream);
      }
      return;
    }
    auto kernel = embed_layernorm_kernel<T, VEC, kPosition>;
    const size_t smem = row_smem_bytes(kernel, hidden);
    launch(kernel, rows, row_threads(hidden / VEC), smem, stream, input_ids, token_type_ids, word,
           position, token_type, gamma, beta, out, layout, hidden, vocab, type_vocab, eps,
           position_pad_id);
    if (codes.codes != nullptr) invoke_quantize_rows_e4m3(out, hidden, rows, hidden, codes, stream);
  };
  dispatch_vec<T>(vec, [&](auto vec_c) {
    if (position != nullptr) {
      run(vec_c, std::true_type{});
    } else {
      run(vec_c, std::false_type{});
    }
  });
  FTBERT_LAUNCH_CHECK("embed_layernorm_kernel", stream);
}

template <typename T>
void invoke_residual_add_rmsnorm(T* residual, const T* x, const T* bias, const T* gamma, T* out,
                                 int rows, int hidden, float eps, int32_t* nonfinite,
                                 cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  FTBERT_CHECK(out != residual, "residual_add_rmsnorm: out must not be the residual");
  const int vec = pick_vec<T>(hidden, {residual, x, bias, gamma, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const int chunks = hidden / VEC;
    // A warp per row whenever the row fits its registers, at every row count, as
    // invoke_residual_add_layernorm.
    const int per_lane = ceil_div(chunks, 32);
    if (per_lane <= kWarpMaxChunks) {
      const int blocks = ceil_div(rows, kWarpRowsPerBlock);
      with_warp_chunks(per_lane, [&](auto chunks_c) {
        constexpr int kChunks = decltype(chunks_c)::value;
        launch(residual_add_rmsnorm_warp_kernel<T, VEC, kChunks>, blocks, 32 * kWarpRowsPerBlock,
               0, stream, residual, x, bias, gamma, out, rows, hidden, eps, nonfinite);
      });
      return;
    }
    auto kernel = residual_add_rmsnorm_kernel<T, VEC>;
    const size_t smem = row_smem_bytes(kernel, hidden);
    launch(kernel, rows, row_threads(chunks), smem, stream, residual, x, bias, gamma, out, hidden,
           eps, nonfinite);
  });
  FTBERT_LAUNCH_CHECK("residual_add_rmsnorm_kernel", stream);
}

template <typename T>
void invoke_embed_rmsnorm(const int32_t* input_ids, const T* word, const T* gamma, T* embedded,
                          T* out, const SequenceLayout& layout, int hidden, int vocab, float eps,
                          cudaStream_t stream) {
  const int rows = layout.rows;
  if (rows == 0 || hidden == 0) return;
  FTBERT_CHECK(vocab > 0, "embed_rmsnorm: vocab " << vocab << " must be positive");
  FTBERT_CHECK(embedded != out, "embed_rmsnorm: embedded and out must be different buffers");
  const int vec = pick_vec<T>(hidden, {word, gamma, embedded, out});
  dispatch_vec<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const int chunks = hidden / VEC;
    const int per_lane = ceil_div(chunks, 32);
    if (per_lane <= kWarpMaxChunks) {
      const int blocks = ceil_div(rows, kWarpRowsPerBlock);
      with_warp_chunks(per_lane, [&](auto chunks_c) {
        constexpr int kChunks = decltype(chunks_c)::value;
        launch(embed_rmsnorm_warp_kernel<T, VEC, kChunks>, blocks, 32 * kWarpRowsPerBlock, 0,
               stream, input_ids, word, gamma, embedded, out, layout, hidden, vocab, eps);
      });
      return;
    }
    auto kernel = embed_rmsnorm_kernel<T, VEC>;
    const size_t smem = row_smem_bytes(kernel, hidden);
    launch(kernel, rows, row_threads(chunks), smem, stream, input_ids, word, gamma, embedded, out,
           layout, hidden, vocab, eps);
  });
  FTBERT_LAUNCH_CHECK("embed_rmsnorm_kernel", stream);
}

#define FTBERT_INSTANTIATE_LAYERNORM(T)                                                          \
  template void invoke_dense_residual_layernorm<T>(const T*, const T*, const T*, const T*,        \
                                                   const T*, T*, int, int, float, int32_t*,       \
                                                   cudaStream_t, bool, E4m3Rows);                 \
  template void invoke_add_bias_residual_layernorm<T>(T*, const T*, const T*, const T*, const T*, \
                                                      int, int, float, int32_t*, cudaStream_t,    \
                                                      bool);                                      \
  template void invoke_partials_residual_layernorm<T>(const float*, int, const T*, const T*,      \
                                                      const T*, const T*, T*, int, int, float,    \
                                                      int32_t*, cudaStream_t);                    \
  template void invoke_residual_add_layernorm<T>(T*, const T*, const T*, const T*, const T*, T*,  \
                                                 int, int, float, int32_t*, cudaStream_t);       \
  template void invoke_embed_layernorm<T>(const int32_t*, const int32_t*, const T*, const T*,     \
                                          const T*, const T*, const T*, T*,                       \
                                          const SequenceLayout&, int, int, int, float, int,       \
                                          cudaStream_t, E4m3Rows);                                \
  template void invoke_residual_add_rmsnorm<T>(T*, const T*, const T*, const T*, T*, int, int,    \
                                               float, int32_t*, cudaStream_t);                    \
  template void invoke_embed_rmsnorm<T>(const int32_t*, const T*, const T*, T*, T*,               \
                                        const SequenceLayout&, int, int, float, cudaStream_t);
FTBERT_INSTANTIATE_LAYERNORM(float)
FTBERT_INSTANTIATE_LAYERNORM(__half)
FTBERT_INSTANTIATE_LAYERNORM(__nv_bfloat16)
#undef FTBERT_INSTANTIATE_LAYERNORM

}  // namespace ftbert::cuda
