// The bodies of the CPU kernels (kernels.h), written once over GCC/Clang vector extensions and
// compiled once per instruction set: the including file defines FTBERT_ISA_NS (the namespace)
// and FTBERT_VBYTES (the vector width in bytes: 16 baseline SSE2, 32 AVX2, 64 AVX-512) and sets
// the matching compiler flags. Nothing here calls the standard library: an inline library
// function instantiated in the AVX-512 file could be the copy the linker keeps for every file, and
// run on a CPU without AVX-512.
//
// exp: range reduction to r in [-ln2/2, ln2/2] and a degree-7 Taylor polynomial (relative error
// below 1e-8 before rounding); erf: Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).
#include <cstdint>

#include "cpu/kernels.h"

#if defined(__AVX512BF16__) || defined(__FMA__) || defined(__AVX512VNNI__)
#include <immintrin.h>  // the bfloat16 dot product and FMA (inline, file-local functions)
#endif
#if defined(__AMX_INT8__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>
#endif

namespace ftbert::cpu::FTBERT_ISA_NS {

namespace {

constexpr int W = FTBERT_VBYTES / 4;  // floats per vector
typedef float vf __attribute__((vector_size(FTBERT_VBYTES)));
typedef int32_t vi __attribute__((vector_size(FTBERT_VBYTES)));
typedef uint32_t vu __attribute__((vector_size(FTBERT_VBYTES)));
typedef uint16_t vh __attribute__((vector_size(FTBERT_VBYTES / 2)));  // W bfloat16 values

constexpr float kInf = __builtin_inff();

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
// x - 0 is x exactly (-0 included), so this folds to a plain broadcast; x + 0 would not (-0 + 0 is
// +0), and the compiler would emit the add.
inline vf splat(float x) { return x - vf{}; }
// The first n < W floats of p; the other lanes hold `fill`.
inline vf load_part(const float* p, int n, float fill) {
  vf v = splat(fill);
  for (int i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
inline void store_part(float* p, vf v, int n) {
  for (int i = 0; i < n; ++i) p[i] = v[i];
}
// a * b + c. Fused (rounded once) wherever the instruction set has FMA, written as an instruction
// rather than left to the compiler's contraction of `a * b + c`, which one GCC release applies to
// some template instances and not to others (the GEMM's one-row tile against its full tile: a
// sequence alone then summed differently from the same sequence in a batch).
inline vf fmadd(vf a, vf b, vf c) {
#if defined(__FMA__) && FTBERT_VBYTES == 64
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) && FTBERT_VBYTES == 32
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__FMA__) && FTBERT_VBYTES == 16
  return (vf)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
#else
  return a * b + c;  // x86 without FMA: a product rounded, then the sum, in every instance
#endif
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }
inline float hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}
inline float hmin(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = v[i] < m ? v[i] : m;
  return m;
}
inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline int round_up(int x, int m) { return (x + m - 1) / m * m; }
inline int imin(int a, int b) { return a < b ? a : b; }

// y = n ln2 + r, |r| <= ln2/2: r, and 2^n as a float (n must keep 2^n a normal float).
struct ExpSplit {
  vf r;
  vf scale;
};
inline ExpSplit exp_split(vf y) {
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to integer
  const vf n = (y * 1.44269504088896341f + magic) - magic;
  vf r = y - n * 0.693145751953125f;  // ln 2 in two parts, so that r is exact
  r = r - n * 1.42860682030941723e-6f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;  // 2^n
  vf scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return {r, scale};
}

// exp(r) - 1 for |r| <= ln2/2: the degree-7 Taylor polynomial with its constant term left out, so
// that nothing cancels near r = 0.
inline vf expm1_reduced(vf r) {
  vf p = splat(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r;
}

inline vf vexp(vf x) {
  // Clamped so that 2^n stays a normal float; exp(-87) ~ 1.6e-38 stands in for 0.
  const ExpSplit e = exp_split(vmin(vmax(x, splat(-87.0f)), splat(88.0f)));
  return (expm1_reduced(e.r) + 1.0f) * e.scale;
}
inline float sexp(float x) { return vexp(splat(x))[0]; }

// 0.5 x (1 + erf(x / sqrt 2)). 1 + erf is formed directly on each side of 0, so the negative tail
// keeps its relative precision instead of cancelling against 1.
inline vf gelu_erf(vf x) {
  const vf z = x * 0.70710678118654752f;
  const vf a = vmax(z, -z);
  const vf t = splat(1.0f) / (a * 0.3275911f + 1.0f);
  vf poly = t * 1.061405429f - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  const vf q = poly * t * vexp(-(a * a));  // 1 - erf(|z|)
  const vf one_plus_erf = z >= 0.0f ? 2.0f - q : q;
  return x * 0.5f * one_plus_erf;
}

// 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
inline vf gelu_tanh(vf x) {
  const vf u = (x + x * x * x * 0.044715f) * 0.79788456080286536f;
  return x / (vexp(u * -2.0f) + 1.0f);
}

// exp(y) - 1 for y <= 0 without cancelling near 0: 2^n (exp(r) - 1) + (2^n - 1), exact to rounding
// when n = 0, and for n <= -1 the two terms do not cancel.
inline vf vexpm1_nonpositive(vf y) {
  const ExpSplit e = exp_split(vmax(y, splat(-87.0f)));
  return e.scale * expm1_reduced(e.r) + (e.scale - 1.0f);
}

// tanh|x| = -e / (2 + e), e = exp(-2|x|) - 1: no cancellation for small |x| (1 - 2/(exp(2|x|) + 1)
// loses the relative precision there, ~1e-4 at |x| = 6e-4).
inline vf vtanh(vf x) {
  const vf a = vmax(x, -x);
  const vf e = vexpm1_nonpositive(a * -2.0f);
  const vf t = -e / (e + 2.0f);
  return x < 0.0f ? -t : t;
}

// x·sigmoid(x) from e = exp(-|x|) <= 1: never overflows, and for x < 0 sigmoid = e / (1 + e).
inline vf vsilu(vf x) {
  const vf a = vmax(x, -x);
  const vf e = vexpm1_nonpositive(-a) + 1.0f;
  const vf s = (x < 0.0f ? e : splat(1.0f)) / (e + 1.0f);
  return x * s;
}

inline vf activate(vf x, Activation act) {
  switch (act) {
    case Activation::kGeluErf: return gelu_erf(x);
    case Activation::kGeluTanh: return gelu_tanh(x);
    case Activation::kRelu: return vmax(x, splat(0.0f));
    case Activation::kTanh: return vtanh(x);
    case Activation::kSilu: return vsilu(x);
    case Activation::kIdentity: return x;
  }
  return x;
}

template <Activation A>
void bias_activation_loop(float* x, const float* bias, int n) {
  int i = 0;
  for (; i + W <= n; i += W) store(x + i, activate(load(x + i) + load(bias + i), A));
  if (i < n) {
    const int r = n - i;
    store_part(x + i, activate(load_part(x + i, r, 0.0f) + load_part(bias + i, r, 0.0f), A), r);
  }
}

void bias_activation(float* x, const float* bias, int n, Activation act) {
  // One loop per activation, so that the switch is not inside it.
  switch (act) {
    case Activation::kGeluErf: return bias_activation_loop<Activation::kGeluErf>(x, bias, n);
    case Activation::kGeluTanh: return bias_activation_loop<Activation::kGeluTanh>(x, bias, n);
    case Activation::kRelu: return bias_activation_loop<Activation::kRelu>(x, bias, n);
    case Activation::kTanh: return bias_activation_loop<Activation::kTanh>(x, bias, n);
    case Activation::kSilu: return bias_activation_loop<Activation::kSilu>(x, bias, n);
    case Activation::kIdentity: return bias_activation_loop<Activation::kIdentity>(x, bias, n);
  }
}

void sum3_layernorm(const float* a, const float* b, const float* c, const float* gamma,
                    const float* beta, float* out, int n, float eps) {
  // Two passes over the row (mean, then the squared deviations), in float: rows are a few
  // hundred to a few thousand values, W partial sums each.
  const int tail = n % W, body = n - tail;
  vf sum = {};
  for (int i = 0; i < body; i += W) {
    const vf y = load(a + i) + load(b + i) + load(c + i);
    store(out + i, y);
    sum += y;
  }
  if (tail) {
    const vf y = load_part(a + body, tail, 0.0f) + load_part(b + body, tail, 0.0f) +
                 load_part(c + body, tail, 0.0f);
    store_part(out + body, y, tail);
    sum += y;
  }
  const float mean = hsum(sum) / n;
  vf sq = {};
  for (int i = 0; i < body; i += W) {
    const vf d = load(out + i) - mean;
    sq += d * d;
  }
  if (tail) {
    const vf d = load_part(out + body, tail, mean) - mean;
    sq += d * d;
  }
  const float var = hsum(sq) / n;
  // 1/sqrt through the vector unit's square root (no libm call here).
  vf rs = splat(var + eps);
  for (int i = 0; i < W; ++i) rs[i] = __builtin_sqrtf(rs[i]);
  const float rstd = 1.0f / rs[0];
  for (int i = 0; i < body; i += W) {
    store(out + i, (load(out + i) - mean) * rstd * load(gamma + i) + load(beta + i));
  }
  if (tail) {
    const vf y = (load_part(out + body, tail, 0.0f) - mean) * rstd *
                     load_part(gamma + body, tail, 0.0f) + load_part(beta + body, tail, 0.0f);
    store_part(out + body, y, tail);
  }
}

// The W mask values at m as a lane mask (-1 where attended); all attended when m is null.
inline vi attended(const int32_t* m, int n) {
  vi k = {};
  if (m == nullptr) return k == 0;
  for (int i = 0; i < n; ++i) k[i] = m[i];
  return k != 0;
}

void masked_softmax(float* row, const int32_t* mask, int n, float scale) {
  vf mx = splat(-kInf);
  for (int i = 0; i < n; i += W) {
    const int r = imin(W, n - i);
    const vf x = load_part(row + i, r, -kInf) * scale;
    const vi live = attended(mask ? mask + i : nullptr, r);
    mx = vmax(mx, live ? x : splat(-kInf));  // lanes past n hold -inf already
  }
  const float m = hmax(mx);
  if (m == -kInf) {  // every key masked: zeros, not NaN
    for (int i = 0; i < n; ++i) row[i] = 0.0f;
    return;
  }
  // The sum's lanes count from the first attended key, not from the row's start: a sequence's
  // probabilities are then the same bits wherever padding puts its keys (left or right).
  int first = 0;
  while (mask != nullptr && first < n && mask[first] == 0) row[first++] = 0.0f;
  vf sum = {};
  for (int i = first; i < n; i += W) {
    const int r = imin(W, n - i);
    vi live = attended(mask ? mask + i : nullptr, r);
    for (int j = r; j < W; ++j) live[j] = 0;
    const vf e = vexp(load_part(row + i, r, 0.0f) * scale - m);
    const vf p = live ? e : splat(0.0f);
    sum += p;
    if (r == W) store(row + i, p); else store_part(row + i, p, r);
  }
  const float inv = 1.0f / hsum(sum);
  for (int i = 0; i < n; i += W) {
    const int r = imin(W, n - i);
    if (r == W) store(row + i, load(row + i) * inv);
    else store_part(row + i, load_part(row + i, r, 0.0f) * inv, r);
  }
}

// ---- bfloat16 <-> float32 -----------------------------------------------------------------------
// bfloat16 is the upper half of a float32: widening shifts the bits up. Narrowing rounds to
// nearest even by adding 0x7FFF plus the kept part's lowest bit before dropping the lower half;
// a NaN is kept a (quiet) NaN instead, which that carry could turn into an infinity.
inline vf widen(vh h) {
  const vu bits = __builtin_convertvector(h, vu) << 16;
  vf f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
inline vh narrow(vf x) {
  vu bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  const vu rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const vu quiet_nan = (bits >> 16) | 0x40u;
  return __builtin_convertvector(x != x ? quiet_nan : rounded, vh);
}
inline vh load_h(const uint16_t* p) {
  vh v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store_h(uint16_t* p, vh v) { __builtin_memcpy(p, &v, sizeof v); }

void widen_bf16(const uint16_t* in, float* out, int n) {
  int i = 0;
  for (; i + W <= n; i += W) store(out + i, widen(load_h(in + i)));
  if (i < n) {
    vh h = {};
    for (int j = 0; j < n - i; ++j) h[j] = in[i + j];
    store_part(out + i, widen(h), n - i);
  }
}

void narrow_bf16(const float* in, uint16_t* out, int n) {
  int i = 0;
  for (; i + W <= n; i += W) store_h(out + i, narrow(load(in + i)));
  if (i < n) {
    const vh h = narrow(load_part(in + i, n - i, 0.0f));
    for (int j = 0; j < n - i; ++j) out[i + j] = h[j];
  }
}

// ---- attention ----------------------------------------------------------------------------
constexpr int kKeyBlock = 256;             // keys per block of the online softmax
constexpr int kQB = 64;                    // queries per score tile (a multiple of 4)
constexpr int kChunk = kAttentionQueries;  // queries per call (a multiple of kQB)
constexpr int kPadD = 32;                  // head dims padded to this (2 AVX-512 vectors)

// Register tiles of attention's two products: R queries x 2 vectors, 2R accumulators. R = 6 (12
// accumulators, as the GEMM's tile) keeps both FMA pipes busy across the FMA's latency within
// AVX2's 16 registers. The last rows of a block (a multiple of 4) take a tile of 4 or 2; the sums
// are written as fmadd, so that every tile height sums a query's products alike.
constexpr int kTileQueries = 6;

// s[i, j0 + :2W] = q[i] · kᵀ for R queries from q (rows d apart) and 2W keys of kt.
template <int R>
inline void scores_rows(const float* __restrict q, const float* __restrict kt, float* __restrict s,
                        int d) {
  vf a[R][2] = {};
  for (int c = 0; c < d; ++c) {
    const vf k0 = load(kt + c * kKeyBlock), k1 = load(kt + c * kKeyBlock + W);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const vf x = splat(q[r * d + c]);
      a[r][0] = fmadd(x, k0, a[r][0]);
      a[r][1] = fmadd(x, k1, a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    store(s + r * kKeyBlock, a[r][0]);
    store(s + r * kKeyBlock + W, a[r][1]);
  }
}

// s[i, :nkp] = q[i] · kᵀ for R queries.
template <int R>
inline void scores_block(const float* q, const float* kt, float* s, int nkp, int d) {
  for (int j0 = 0; j0 < nkp; j0 += 2 * W) scores_rows<R>(q, kt + j0, s + j0, d);
}

// s[i, :nkp] = q[i] · kᵀ for i < nq4 (a multiple of 4).
inline void scores_tile(const float* q, const float* kt, float* s, int nq4, int nkp, int d) {
  int i0 = 0;
  for (; i0 + kTileQueries <= nq4; i0 += kTileQueries) {
    scores_block<kTileQueries>(q + i0 * d, kt, s + i0 * kKeyBlock, nkp, d);
  }
  if (nq4 - i0 == 4) scores_block<4>(q + i0 * d, kt, s + i0 * kKeyBlock, nkp, d);
  if (nq4 - i0 == 2) scores_block<2>(q + i0 * d, kt, s + i0 * kKeyBlock, nkp, d);
}

// acc[i, c0 + :2W] += p[i, :nk] · v[:, c0 + :2W] for R queries (p's rows kKeyBlock apart, acc's
// dp apart).
template <int R>
inline void values_rows(const float* __restrict p, const float* __restrict vv, float* __restrict acc,
                        int nk, int dp) {
  vf a[R][2];
  for (int r = 0; r < R; ++r) {
    a[r][0] = load(acc + r * dp);
    a[r][1] = load(acc + r * dp + W);
  }
  for (int j = 0; j < nk; ++j) {
    const vf v0 = load(vv + j * dp), v1 = load(vv + j * dp + W);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const vf x = splat(p[r * kKeyBlock + j]);
      a[r][0] = fmadd(x, v0, a[r][0]);
      a[r][1] = fmadd(x, v1, a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    store(acc + r * dp, a[r][0]);
    store(acc + r * dp + W, a[r][1]);
  }
}

template <int R>
inline void values_block(const float* p, const float* vv, float* acc, int nk, int dp) {
  for (int c0 = 0; c0 < dp; c0 += 2 * W) values_rows<R>(p, vv + c0, acc + c0, nk, dp);
}

// acc[i, :dp] += p[i, :nk] · v for i < nq4 (a multiple of 4).
inline void values_tile(const float* p, const float* vv, float* acc, int nq4, int nk, int dp) {
  int i0 = 0;
  for (; i0 + kTileQueries <= nq4; i0 += kTileQueries) {
    values_block<kTileQueries>(p + i0 * kKeyBlock, vv, acc + i0 * dp, nk, dp);
  }
  if (nq4 - i0 == 4) values_block<4>(p + i0 * kKeyBlock, vv, acc + i0 * dp, nk, dp);
  if (nq4 - i0 == 2) values_block<2>(p + i0 * kKeyBlock, vv, acc + i0 * dp, nk, dp);
}

// A row element as float32: a float as it is, a bfloat16's bits widened (exact).
inline float as_float(float x) { return x; }
inline float as_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

inline vf load_row(const float* p) { return load(p); }
inline vf load_row(const uint16_t* p) { return widen(load_h(p)); }

// dst[c] = (x[c] + bias[c]) · mul for c < d.
template <typename T>
inline void biased_row(const T* __restrict x, const float* __restrict bias, float mul,
                       float* __restrict dst, int d) {
  int c = 0;
  for (; c + W <= d; c += W) store(dst + c, (load_row(x + c) + load(bias + c)) * mul);
  for (; c < d; ++c) dst[c] = (as_float(x[c]) + bias[c]) * mul;
}

// An output row from its float32 values: as they are, or rounded once to bfloat16.
inline void store_out_row(const float* x, float* o, int d) {
  for (int c = 0; c < d; ++c) o[c] = x[c];
}
inline void store_out_row(const float* x, uint16_t* o, int d) { narrow_bf16(x, o, d); }

// The largest of a score row's first nk values (nkp stored, a multiple of W; -inf if nk <= 0).
inline float row_max(const float* si, int nk, int nkp) {
  vf mx = splat(-kInf);
  for (int j = 0; j < nkp; j += W) {
    const int r = imin(W, nk - j);
    mx = vmax(mx, r >= W ? load(si + j) : load_part(si + j, r > 0 ? r : 0, -kInf));
  }
  return hmax(mx);
}

// The tile over rows of T (float, or bfloat16 bits): q, k, v and out are the tile's pointers of
// that type.
template <typename T>
void attention_rows(const AttentionTile& t, const T* tq, const T* tk, const T* tv, T* tout,
                    float* scratch) {
  const int d = t.head_dim, dp = round_up(d, kPadD), nq = t.n_queries, nq4 = round_up(nq, 4);
  const int64_t ld = t.ld;
  const float scale = t.scale;
  float* kt = scratch;                  // [d, kKeyBlock] keys of the block, transposed, + bias
  float* vv = kt + d * kKeyBlock;       // [kKeyBlock, dp] values of the block + bias
  float* q = vv + kKeyBlock * dp;       // [kChunk, d] scale * (query + bias)
  float* s = q + kChunk * d;            // [kQB, kKeyBlock] scores, then probabilities
  float* acc = s + kQB * kKeyBlock;     // [kChunk, dp] running sum of p * v
  float* mrow = acc + kChunk * dp;      // [kChunk] running max
  float* lrow = mrow + kChunk;          // [kChunk] running sum of p

  {
    const float* __restrict qb = t.q_bias;
    for (int i = 0; i < nq4; ++i) {
      float* __restrict qi = q + i * d;
      if (i < nq) {
        const T* __restrict src = tq + static_cast<int64_t>(t.query_rows[i]) * ld;
        biased_row(src, qb, scale, qi, d);
      } else {
        for (int c = 0; c < d; ++c) qi[c] = 0.0f;
      }
      for (int c = 0; c < dp; ++c) acc[i * dp + c] = 0.0f;
      mrow[i] = -kInf;
      lrow[i] = 0.0f;
    }
  }
  for (int kb = 0; kb < t.n_keys; kb += kKeyBlock) {
    const int nk = imin(kKeyBlock, t.n_keys - kb), nkp = round_up(nk, 2 * W);
    // A key block wholly outside every query's window adds nothing (positions ascend).
    if (t.window > 0 && (t.key_pos[kb] > t.query_pos[nq - 1] + t.window ||
                         t.key_pos[kb + nk - 1] < t.query_pos[0] - t.window)) {
      continue;
    }
    // The block's keys (transposed) and values, bias added, once for every query of the call.
    {
      const float* __restrict kbias = t.k_bias;
      const float* __restrict vbias = t.v_bias;
      float* __restrict ktr = kt;
      for (int j = 0; j < nkp; ++j) {
        float* __restrict vrow = vv + j * dp;
        if (j < nk) {
          const int64_t row = static_cast<int64_t>(t.key_rows[kb + j]) * ld;
          const T* __restrict kr = tk + row;
          const T* __restrict vr = tv + row;
          int c = 0;
          for (; c + W <= d; c += W) {
            const vf x = load_row(kr + c) + load(kbias + c);
            for (int l = 0; l < W; ++l) ktr[(c + l) * kKeyBlock + j] = x[l];
          }
          for (; c < d; ++c) ktr[c * kKeyBlock + j] = as_float(kr[c]) + kbias[c];
          biased_row(vr, vbias, 1.0f, vrow, d);
        } else {
          for (int c = 0; c < d; ++c) ktr[c * kKeyBlock + j] = 0.0f;
          for (int c = 0; c < d; ++c) vrow[c] = 0.0f;
        }
        for (int c = d; c < dp; ++c) vrow[c] = 0.0f;
      }
    }
    for (int q0 = 0; q0 < nq4; q0 += kQB) {
      const int rows = imin(kQB, nq4 - q0);
      // The block's keys [lo, hi) that this tile's queries may attend: all of them, or under a
      // window those within it of some query (from lo, a multiple of 2W, so that the score rows'
      // vectors stay where they are). A key left out would weigh exactly 0.
      int lo = 0, hi = nk;
      if (t.window > 0) {
        const int first = t.query_pos[q0], last = t.query_pos[imin(q0 + rows, nq) - 1];
        while (lo < nk && t.key_pos[kb + lo] < first - t.window) ++lo;
        while (hi > lo && t.key_pos[kb + hi - 1] > last + t.window) --hi;
        if (lo == hi) continue;
        lo = lo / (2 * W) * (2 * W);
      }
      const int span = round_up(hi - lo, 2 * W);  // within nkp: lo + span <= round_up(hi, 2W)
      scores_tile(q + q0 * d, kt + lo, s + lo, rows, span, d);
      if (t.relative_bias != nullptr) {
        for (int i = 0; i < rows && q0 + i < nq; ++i) {
          const float* bias = t.relative_bias - t.query_pos[q0 + i];
          float* si = s + i * kKeyBlock;
          for (int j = lo; j < hi; ++j) si[j] += bias[t.key_pos[kb + j]];
        }
      }
      if (t.c2p != nullptr || t.p2c != nullptr) {
        for (int i = 0; i < rows && q0 + i < nq; ++i) {
          const int qp = t.query_pos[q0 + i];
          const float* q_terms =
              t.c2p != nullptr ? t.c2p + static_cast<int64_t>(t.query_rows[q0 + i]) * t.term_width
                               : nullptr;
          float* si = s + i * kKeyBlock;
          for (int j = lo; j < hi; ++j) {
            const int col = t.term_column[qp - t.key_pos[kb + j]] - t.term_first;
            float add = 0.0f;
            if (q_terms != nullptr) add += q_terms[col];
            if (t.p2c != nullptr) {
              add += t.p2c[static_cast<int64_t>(t.key_rows[kb + j]) * t.term_width + col];
            }
            si[j] += add * scale;
          }
        }
      }
      if (t.window > 0) {
        for (int i = 0; i < rows && q0 + i < nq; ++i) {
          const int qp = t.query_pos[q0 + i];
          float* si = s + i * kKeyBlock;
          for (int j = lo; j < hi; ++j) {
            const int dist = t.key_pos[kb + j] - qp;
            if (dist > t.window || dist < -t.window) si[j] = -kInf;
          }
        }
      }
      // Online softmax: p = exp(s - new max); earlier sums rescaled by exp(old max - new max).
      for (int i = 0; i < rows; ++i) {
        float* si = s + i * kKeyBlock + lo;
        const float top = row_max(si, hi - lo, span);
        float& m = mrow[q0 + i];
        const float m_new = m > top ? m : top;
        if (m_new == -kInf) {  // no key of the window yet: nothing to add (exp would give NaN)
          for (int j = 0; j < span; j += W) store(si + j, splat(0.0f));
          continue;
        }
        const float alpha = m == -kInf ? 0.0f : sexp(m - m_new);
        vf sum = {};
        for (int j = 0; j < span; j += W) {
          const int r = imin(W, hi - lo - j);
          const vf x = load(si + j);
          // A key outside the window (-inf) weighs exactly 0 (vexp clamps to ~1e-38).
          vf p = x == splat(-kInf) ? splat(0.0f) : vexp(x - m_new);
          if (r < W) {
            for (int l = (r > 0 ? r : 0); l < W; ++l) p[l] = 0.0f;  // keys past the range's end
          }
          store(si + j, p);
          sum += p;
        }
        lrow[q0 + i] = lrow[q0 + i] * alpha + hsum(sum);
        m = m_new;
        if (alpha != 1.0f) {
          float* ai = acc + (q0 + i) * dp;
          for (int c = 0; c < dp; c += W) store(ai + c, load(ai + c) * alpha);
        }
      }
      values_tile(s + lo, vv + lo * dp, acc + q0 * dp, rows, hi - lo, dp);
    }
  }
  for (int i = 0; i < nq; ++i) {
    T* o = tout + static_cast<int64_t>(t.query_rows[i]) * t.ldo;
    // No keys at all: zeros, as the unfused path's all-masked softmax gives.
    const float inv = lrow[i] > 0.0f ? 1.0f / lrow[i] : 0.0f;
    float* ai = acc + i * dp;
    for (int c = 0; c < d; ++c) ai[c] *= inv;
    store_out_row(ai, o, d);
  }
}

#if defined(__AVX512BF16__)
// ---- attention's two products on vdpbf16ps (bfloat16 rows) -------------------------------------
// For bfloat16 rows without a relative bias, a window or DeBERTa's terms, head dims a multiple of
// 16. Both products take their operands as bfloat16 pairs, twice the multiply-adds of a float32
// FMA per instruction:
//   - Q + its bias, scaled, is rounded to bfloat16 once per call; K and V are the rows as they
//     are: a key bias adds q · b_k to every score of a query row, which the softmax cancels, and
//     the value bias adds b_v to a row of weights summing to 1, so it is added to the output.
//   - K is transposed per key block into pairs of the head dim by key ([d/2][kKeyBlock] 32-bit:
//     the pair (k[2c], k[2c + 1]) of key j at c·kKeyBlock + j), so a vector holds 16 keys; V into
//     pairs of keys by column ([nk/2][d]: (v[2p][c], v[2p + 1][c])), so a vector holds 16 columns.
//   - The probabilities are rounded to bfloat16 for P · V, as torch's bfloat16 attention has
//     them; the scores, the online softmax and the sums stay float32.
inline __m512 as_m512(vf x) {
  __m512 m;
  __builtin_memcpy(&m, &x, sizeof m);
  return m;
}

// s[i, :nkp] = q[i] · kᵀ for i < nq4 (4 queries x 2 vectors of keys per step); q [nq4][d/2] and
// kp [d/2][kKeyBlock] as bfloat16 pairs.
inline void scores_tile_bf16(const uint32_t* __restrict q, const uint32_t* __restrict kp,
                             float* __restrict s, int nq4, int nkp, int half_d) {
  for (int i0 = 0; i0 < nq4; i0 += 4) {
    const uint32_t* qi = q + i0 * half_d;
    for (int j0 = 0; j0 < nkp; j0 += 2 * W) {
      __m512 a[4][2];
      for (int r = 0; r < 4; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
      for (int c = 0; c < half_d; ++c) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kp + c * kKeyBlock + j0);
        const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kp + c * kKeyBlock + j0 + W);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512bh qr = (__m512bh)_mm512_set1_epi32(static_cast<int>(qi[r * half_d + c]));
          a[r][0] = _mm512_dpbf16_ps(a[r][0], qr, k0);
          a[r][1] = _mm512_dpbf16_ps(a[r][1], qr, k1);
        }
      }
      for (int r = 0; r < 4; ++r) {
        _mm512_storeu_ps(s + (i0 + r) * kKeyBlock + j0, a[r][0]);
        _mm512_storeu_ps(s + (i0 + r) * kKeyBlock + j0 + W, a[r][1]);
      }
    }
  }
}

// acc[i, :d] += p[i, :2·pairs] · v for i < nq4 (4 queries x 2 vectors of columns per step); p's
// rows bfloat16 (kKeyBlock·2 apart in elements), vp [pairs][d] as bfloat16 pairs of keys.
inline void values_tile_bf16(const uint16_t* __restrict p, const uint32_t* __restrict vp,
                             float* __restrict acc, int nq4, int pairs, int d, int dp) {
  for (int i0 = 0; i0 < nq4; i0 += 4) {
    for (int c0 = 0; c0 < d; c0 += 2 * W) {
      const bool two = c0 + W < d;  // d is a multiple of 16: one or two vectors here
      float* ai = acc + i0 * dp + c0;
      __m512 a[4][2];
      for (int r = 0; r < 4; ++r) {
        a[r][0] = _mm512_loadu_ps(ai + r * dp);
        a[r][1] = two ? _mm512_loadu_ps(ai + r * dp + W) : _mm512_setzero_ps();
      }
      for (int j = 0; j < pairs; ++j) {
        const __m512bh v0 = (__m512bh)_mm512_loadu_si512(vp + j * d + c0);
        const __m512bh v1 = two ? (__m512bh)_mm512_loadu_si512(vp + j * d + c0 + W) : v0;
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          uint32_t w;
          __builtin_memcpy(&w, p + (i0 + r) * 2 * kKeyBlock + 2 * j, sizeof w);
          const __m512bh pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
          a[r][0] = _mm512_dpbf16_ps(a[r][0], pr, v0);
          if (two) a[r][1] = _mm512_dpbf16_ps(a[r][1], pr, v1);
        }
      }
      for (int r = 0; r < 4; ++r) {
        _mm512_storeu_ps(ai + r * dp, a[r][0]);
        if (two) _mm512_storeu_ps(ai + r * dp + W, a[r][1]);
      }
    }
  }
}

bool attention_bf16_dots_takes(const AttentionTile& t) {
  return t.q16 != nullptr && t.relative_bias == nullptr && t.window == 0 && t.c2p == nullptr &&
         t.p2c == nullptr && t.head_dim % W == 0 && t.head_dim <= kPadD * 8;
}

// The tile as attention_rows<uint16_t> runs it, its two products on vdpbf16ps (see above).
void attention_bf16_dots(const AttentionTile& t, float* scratch) {
  const int d = t.head_dim, half_d = d / 2, dp = round_up(d, kPadD), nq = t.n_queries,
            nq4 = round_up(nq, 4);
  const int64_t ld = t.ld;
  // The float32 layout's regions (attention_scratch_floats), each holding no more here.
  auto* kp = reinterpret_cast<uint32_t*>(scratch);                       // [d/2, kKeyBlock]
  auto* vp = reinterpret_cast<uint32_t*>(scratch + d * kKeyBlock);       // [kKeyBlock/2, d]
  auto* q = reinterpret_cast<uint32_t*>(scratch + d * kKeyBlock + kKeyBlock * dp);  // [kChunk, d/2]
  float* s = scratch + d * kKeyBlock + kKeyBlock * dp + kChunk * d;      // [kQB, kKeyBlock]
  float* acc = s + kQB * kKeyBlock;                                      // [kChunk, dp]
  float* mrow = acc + kChunk * dp;
  float* lrow = mrow + kChunk;

  {
    float row[kPadD * 8];  // head dims up to 256
    for (int i = 0; i < nq4; ++i) {
      uint16_t* qi = reinterpret_cast<uint16_t*>(q + i * half_d);
      if (i < nq) {
        biased_row(t.q16 + static_cast<int64_t>(t.query_rows[i]) * ld, t.q_bias, t.scale, row, d);
        for (int c = 0; c < d; c += W) store_h(qi + c, narrow(load(row + c)));
      } else {
        for (int c = 0; c < d; ++c) qi[c] = 0;
      }
      for (int c = 0; c < dp; ++c) acc[i * dp + c] = 0.0f;
      mrow[i] = -kInf;
      lrow[i] = 0.0f;
    }
  }
  // Two keys' rows of 16 columns, interleaved: [a0, b0, a1, b1, ...].
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                              9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                              17, 1, 16, 0);
  for (int kb = 0; kb < t.n_keys; kb += kKeyBlock) {
    const int nk = imin(kKeyBlock, t.n_keys - kb), nkp = round_up(nk, 2 * W), pairs = (nk + 1) / 2;
    for (int j = 0; j < nkp; ++j) {
      if (j < nk) {
        const uint16_t* kr = t.k16 + static_cast<int64_t>(t.key_rows[kb + j]) * ld;
        for (int c = 0; c < half_d; ++c) __builtin_memcpy(kp + c * kKeyBlock + j, kr + 2 * c, 4);
      } else {
        for (int c = 0; c < half_d; ++c) kp[c * kKeyBlock + j] = 0;
      }
    }
    for (int j = 0; j < pairs; ++j) {
      const uint16_t* va = t.v16 + static_cast<int64_t>(t.key_rows[kb + 2 * j]) * ld;
      const bool has_b = 2 * j + 1 < nk;  // past the block's end: a zero row
      const uint16_t* vb =
          has_b ? t.v16 + static_cast<int64_t>(t.key_rows[kb + 2 * j + 1]) * ld : nullptr;
      for (int c = 0; c < d; c += W) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(va + c));
        const __m256i b = has_b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + c))
                                : _mm256_setzero_si256();
        const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        _mm512_storeu_si512(vp + j * d + c, _mm512_permutexvar_epi16(interleave, ab));
      }
    }
    for (int q0 = 0; q0 < nq4; q0 += kQB) {
      const int rows = imin(kQB, nq4 - q0);
      scores_tile_bf16(q + q0 * half_d, kp, s, rows, nkp, half_d);
      // The online softmax as attention_rows', then each row's probabilities rounded to bfloat16
      // in place (its first half: a row's 16 values are read before their 16 halves are written).
      for (int i = 0; i < rows; ++i) {
        float* si = s + i * kKeyBlock;
        const float top = row_max(si, nk, nkp);
        float& m = mrow[q0 + i];
        const float m_new = m > top ? m : top;
        uint16_t* pi = reinterpret_cast<uint16_t*>(si);
        const float alpha = m == -kInf ? 0.0f : sexp(m - m_new);
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < nkp; j += W) {
          const int r = imin(W, nk - j);
          // Keys past the block's end weigh 0.
          const __mmask16 keys = r >= W ? __mmask16(0xFFFF) : __mmask16((1u << (r > 0 ? r : 0)) - 1);
          const __m512 p = _mm512_maskz_mov_ps(keys, as_m512(vexp(load(si + j) - m_new)));
          sum = _mm512_add_ps(sum, p);
          // Rounded to nearest even (a probability is never NaN, and one below 2^-126, which
          // this flushes to 0, weighs nothing next to the row's largest, 1).
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(pi + j), (__m256i)_mm512_cvtneps_pbh(p));
        }
        lrow[q0 + i] = lrow[q0 + i] * alpha + _mm512_reduce_add_ps(sum);
        m = m_new;
        if (alpha != 1.0f) {
          float* ai = acc + (q0 + i) * dp;
          for (int c = 0; c < dp; c += W) store(ai + c, load(ai + c) * alpha);
        }
      }
      values_tile_bf16(reinterpret_cast<const uint16_t*>(s), vp, acc + q0 * dp, rows, pairs, d, dp);
    }
  }
  for (int i = 0; i < nq; ++i) {
    uint16_t* o = t.out16 + static_cast<int64_t>(t.query_rows[i]) * t.ldo;
    // No keys at all: zeros (and no value bias), as the unfused path's all-masked softmax gives.
    const bool any = lrow[i] > 0.0f;
    const float inv = any ? 1.0f / lrow[i] : 0.0f;
    float* ai = acc + i * dp;
    for (int c = 0; c < d; c += W) {
      store(ai + c, any ? load(ai + c) * inv + load(t.v_bias + c) : splat(0.0f));
    }
    store_out_row(ai, o, d);
  }
}
#endif

void attention(const AttentionTile& t, float* scratch) {
#if defined(__AVX512BF16__)
  if (attention_bf16_dots_takes(t)) {
    attention_bf16_dots(t, scratch);
    return;
  }
#endif
  if (t.q16 != nullptr) {
    attention_rows<uint16_t>(t, t.q16, t.k16, t.v16, t.out16, scratch);
  } else {
    attention_rows<float>(t, t.q, t.k, t.v, t.out, scratch);
  }
}

// ---- packed-panel GEMM --------------------------------------------------------------------------
// A register tile of R rows x one panel (kPV vectors): R·kPV accumulators, each step p loads the
// panel's row p once and broadcasts a[i, p] per row. 12 accumulators on every ISA (16 vector
// registers on SSE2 and AVX2) leave room for the panel row and the broadcast.
constexpr int kPV = kGemmPanel / W;
constexpr int kPanelRows = 12 / kPV;

template <int R>
void panel_rows(const float* __restrict a, int64_t lda, const float* __restrict panel, int k,
                float* __restrict c, int64_t ldc, int cols, const float* bias, Activation act) {
  vf acc[R][kPV] = {};
  for (int p = 0; p < k; ++p) {
    vf b[kPV];
#pragma GCC unroll 4
    for (int v = 0; v < kPV; ++v) b[v] = load(panel + p * kGemmPanel + v * W);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const vf x = splat(a[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < kPV; ++v) acc[r][v] = fmadd(x, b[v], acc[r][v]);
    }
  }
  if (bias != nullptr) {  // the epilogue, while the tile is in registers: no second pass over c
    vf bv[kPV];
    for (int v = 0; v < kPV; ++v) {
      const int left = cols - v * W;
      bv[v] = left >= W ? load(bias + v * W) : load_part(bias + v * W, left > 0 ? left : 0, 0.0f);
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kPV; ++v) acc[r][v] = activate(acc[r][v] + bv[v], act);
  }
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    if (cols == kGemmPanel) {
      for (int v = 0; v < kPV; ++v) store(cr + v * W, acc[r][v]);
    } else {
      for (int v = 0; v < kPV && v * W < cols; ++v) store_part(cr + v * W, acc[r][v], imin(W, cols - v * W));
    }
  }
}

// The last m < R rows: Tile<m>::run, the tile of exactly that height.
template <template <int> class Tile, int R, class... Args>
void rows_tail(int m, Args... args) {
  if constexpr (R > 0) {
    if (m == R) return Tile<R>::run(args...);
    rows_tail<Tile, R - 1>(m, args...);
  }
}

// A panel's m rows in tiles of R (Tile<R>::run), the last m % R rows in one tile of that height.
// T is the element type of a, the panel and c.
template <template <int> class Tile, int R, typename T>
void panel_tiles(const T* a, int64_t lda, const T* panel, int k, T* c, int64_t ldc, int m,
                 int cols, const float* bias, Activation act) {
  int i = 0;
  for (; i + R <= m; i += R) {
    Tile<R>::run(a + i * lda, lda, panel, k, c + i * ldc, ldc, cols, bias, act);
  }
  if (i < m) {
    rows_tail<Tile, R - 1>(m - i, a + i * lda, lda, panel, k, c + i * ldc, ldc, cols, bias, act);
  }
}

template <int R>
struct PanelRows {
  static void run(const float* a, int64_t lda, const float* panel, int k, float* c, int64_t ldc,
                  int cols, const float* bias, Activation act) {
    panel_rows<R>(a, lda, panel, k, c, ldc, cols, bias, act);
  }
};

void panel_gemm(const float* a, int64_t lda, const float* panel, int k, float* c, int64_t ldc,
                int m, int cols, const float* bias, Activation act) {
  panel_tiles<PanelRows, kPanelRows>(a, lda, panel, k, c, ldc, m, cols, bias, act);
}

#if defined(__AVX512BF16__)
// ---- bfloat16 packed-panel GEMM (AVX512-BF16) -----------------------------------------------
// The panel's 16 columns are one vector of float32 accumulators. Each step takes two rows of the
// panel at once (interleaved: column j's pair at 2j, 2j + 1) and a row of a's two values as one
// broadcast 32-bit pair; vdpbf16ps adds both products to every column: twice the multiply-adds
// of a float32 FMA per instruction, from half the bytes.
static_assert(W == kGemmPanel, "the bfloat16 panel kernel keeps a panel row in one vector");
constexpr int kBf16Rows = 12;

template <int R>
void panel_rows_bf16(const uint16_t* __restrict a, int64_t lda, const uint16_t* __restrict panel,
                     int k, uint16_t* __restrict c, int64_t ldc, int cols, const float* bias,
                     Activation act) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int pairs = k / 2;
  for (int q = 0; q < pairs; ++q) {
    const __m512bh b = (__m512bh)_mm512_loadu_si512(panel + q * 2 * kGemmPanel);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      uint32_t x;
      __builtin_memcpy(&x, a + r * lda + 2 * q, sizeof x);
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(x)), b);
    }
  }
  if (k % 2 != 0) {  // the last value alone: its partner is a zero, not whatever follows a's row
    const __m512bh b = (__m512bh)_mm512_loadu_si512(panel + pairs * 2 * kGemmPanel);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(a[r * lda + k - 1]), b);
    }
  }
  vf bv = {};
  if (bias != nullptr) bv = cols >= W ? load(bias) : load_part(bias, cols, 0.0f);
  for (int r = 0; r < R; ++r) {
    vf y;
    __builtin_memcpy(&y, &acc[r], sizeof y);
    if (bias != nullptr) y = activate(y + bv, act);
    const vh h = narrow(y);
    uint16_t* cr = c + r * ldc;
    if (cols == kGemmPanel) {
      store_h(cr, h);
    } else {
      for (int j = 0; j < cols; ++j) cr[j] = h[j];
    }
  }
}

template <int R>
struct PanelRowsBf16 {
  static void run(const uint16_t* a, int64_t lda, const uint16_t* panel, int k, uint16_t* c,
                  int64_t ldc, int cols, const float* bias, Activation act) {
    panel_rows_bf16<R>(a, lda, panel, k, c, ldc, cols, bias, act);
  }
};

void panel_gemm_bf16(const uint16_t* a, int64_t lda, const uint16_t* panel, int k, uint16_t* c,
                     int64_t ldc, int m, int cols, const float* bias, Activation act) {
  if (cols > kGemmPanel) {  // the next panel's columns too, one panel at a time
    panel_gemm_bf16(a, lda, panel, k, c, ldc, m, kGemmPanel, bias, act);
    panel_gemm_bf16(a, lda, panel + int64_t{(k + 1) / 2 * 2} * kGemmPanel, k, c + kGemmPanel, ldc, m,
                    cols - kGemmPanel, bias == nullptr ? nullptr : bias + kGemmPanel, act);
    return;
  }
  panel_tiles<PanelRowsBf16, kBf16Rows>(a, lda, panel, k, c, ldc, m, cols, bias, act);
}
#endif

// ---- int8 packed-panel GEMM (quantization "int8") ----------------------------------------------
// One row of a tile from its int32 sums: y = act((S · a_scale + a_min · w_sums) · w_scale + bias),
// written the same way by every int8 kernel of this instruction set.
inline void store_s8_row(const int32_t* sums, float a_scale, float a_min, const float* w_scale,
                         const int32_t* w_sums, const float* bias, Activation act, float* c, int cols) {
  for (int v = 0; v < kGemmPanel / W; ++v) {
    vi s, ws;
    __builtin_memcpy(&s, sums + v * W, sizeof s);
    __builtin_memcpy(&ws, w_sums + v * W, sizeof ws);
    const vf scale = load(w_scale + v * W);
    const vf x = fmadd(__builtin_convertvector(s, vf), splat(a_scale),
                       __builtin_convertvector(ws, vf) * a_min);  // Σ_p a[p] · q[p, j]
    vf y;
    if (bias != nullptr) {
      const int left = cols - v * W;
      const vf b = left >= W ? load(bias + v * W) : load_part(bias + v * W, left > 0 ? left : 0, 0.0f);
      y = activate(fmadd(x, scale, b), act);
    } else {
      y = x * scale;
    }
    if (cols == kGemmPanel) {
      store(c + v * W, y);
    } else if (v * W < cols) {
      store_part(c + v * W, y, imin(W, cols - v * W));
    }
  }
}

typedef uint8_t vb __attribute__((vector_size(FTBERT_VBYTES / 4)));  // W bytes

void quantize_row_u8(const float* x, int k, uint8_t* out, int padded, float* scale, float* low) {
  float lo = x[0], hi = x[0];
  int p = 0;
  if (k >= W) {
    vf vlo = load(x), vhi = vlo;
    for (; p + W <= k; p += W) {
      const vf v = load(x + p);
      vlo = vmin(vlo, v);
      vhi = vmax(vhi, v);
    }
    lo = hmin(vlo);
    hi = hmax(vhi);
  }
  for (; p < k; ++p) {
    lo = x[p] < lo ? x[p] : lo;
    hi = x[p] > hi ? x[p] : hi;
  }
  *scale = (hi - lo) / 255.0f;
  *low = lo;
  const float inv = hi > lo ? 255.0f / (hi - lo) : 0.0f;
  // Adding and taking off 1.5 · 2^23 rounds to the nearest integer (ties to even), as nearbyint.
  const vf magic = splat(12582912.0f);
  for (p = 0; p + W <= k; p += W) {
    vf y = vmin(vmax((load(x + p) - lo) * inv, splat(0.0f)), splat(255.0f));
    y = (y + magic) - magic;
    const vb b = __builtin_convertvector(__builtin_convertvector(y, vi), vb);
    __builtin_memcpy(out + p, &b, sizeof b);
  }
  for (; p < k; ++p) {
    float y = (x[p] - lo) * inv;
    y = y < 0.0f ? 0.0f : (y > 255.0f ? 255.0f : y);
    out[p] = static_cast<uint8_t>((y + 12582912.0f) - 12582912.0f);
  }
  for (; p < padded; ++p) out[p] = 0;
}

// An int8 GEMM kernel and its name (Kernels::s8_kernel).
struct S8Kernel {
  decltype(Kernels::panel_gemm_s8) gemm;
  const char* name;
};

// The portable int8 tile: R rows, int32 sums (the compiler vectorizes the inner loop).
template <int R>
void panel_rows_s8(const uint8_t* __restrict a, int64_t lda, const float* a_scale, const float* a_min,
                   const int8_t* __restrict panel, const float* w_scale, const int32_t* w_sums, int k4,
                   float* c, int64_t ldc, int cols, const float* bias, Activation act) {
  int32_t acc[R][kGemmPanel] = {};
  for (int q = 0; q < k4; ++q) {
    const int8_t* b = panel + q * 4 * kGemmPanel;
    for (int r = 0; r < R; ++r) {
      const uint8_t* x = a + r * lda + 4 * q;
      const int32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
      for (int j = 0; j < kGemmPanel; ++j) {
        acc[r][j] += x0 * b[4 * j] + x1 * b[4 * j + 1] + x2 * b[4 * j + 2] + x3 * b[4 * j + 3];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    store_s8_row(acc[r], a_scale[r], a_min[r], w_scale, w_sums, bias, act, c + r * ldc, cols);
  }
}

template <int R>
struct PanelRowsS8 {
  static void run(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                  const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4, float* c,
                  int64_t ldc, int cols, const float* bias, Activation act) {
    panel_rows_s8<R>(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, cols, bias, act);
  }
};

void panel_gemm_s8(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                   const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4, float* c,
                   int64_t ldc, int m, int cols, const float* bias, Activation act) {
  if (cols > kGemmPanel) {  // the next panel's columns too, one panel at a time
    panel_gemm_s8(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, m, kGemmPanel, bias, act);
    panel_gemm_s8(a, lda, a_scale, a_min, panel + 4 * k4 * kGemmPanel, w_scale + kGemmPanel,
                  w_sums + kGemmPanel, k4, c + kGemmPanel, ldc, m, cols - kGemmPanel,
                  bias == nullptr ? nullptr : bias + kGemmPanel, act);
    return;
  }
  constexpr int kRows = 4;
  int i = 0;
  for (; i + kRows <= m; i += kRows) {
    PanelRowsS8<kRows>::run(a + i * lda, lda, a_scale + i, a_min + i, panel, w_scale, w_sums, k4,
                            c + i * ldc, ldc, cols, bias, act);
  }
  for (; i < m; ++i) {
    PanelRowsS8<1>::run(a + i * lda, lda, a_scale + i, a_min + i, panel, w_scale, w_sums, k4,
                        c + i * ldc, ldc, cols, bias, act);
  }
}

#if defined(__AVX512VNNI__)
// AVX512-VNNI: vpdpbusd adds four u8 x s8 products into each of 16 int32 lanes, one k-group of a
// whole panel per instruction: the same exact sums as the portable tile.
static_assert(W == kGemmPanel, "the int8 VNNI kernel keeps a panel's sums in one vector");
constexpr int kVnniRows = 12;  // one panel: 12 accumulators
constexpr int kVnniRows2 = 6;   // two panels: 12 accumulators (more spilled or ran slower)

// R rows x P panels (P <= 2): a broadcast of a's four values serves P panels, so two panels take
// fewer loads per multiply-add.
template <int R, int P>
void panel_rows_s8_vnni(const uint8_t* __restrict a, int64_t lda, const float* a_scale,
                        const float* a_min, const int8_t* __restrict panel, const float* w_scale,
                        const int32_t* w_sums, int k4, float* c, int64_t ldc, int cols,
                        const float* bias, Activation act) {
  const int64_t next = int64_t{4} * k4 * kGemmPanel;  // the second panel
  __m512i acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < P; ++j) acc[r][j] = _mm512_setzero_si512();
  for (int q = 0; q < k4; ++q) {
    __m512i b[P];
    for (int j = 0; j < P; ++j) b[j] = _mm512_loadu_si512(panel + j * next + q * 4 * kGemmPanel);
    for (int r = 0; r < R; ++r) {
      int32_t x;
      __builtin_memcpy(&x, a + r * lda + 4 * q, sizeof x);
      const __m512i xs = _mm512_set1_epi32(x);
      for (int j = 0; j < P; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xs, b[j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < P; ++j) {
      const int left = cols - j * kGemmPanel;
      int32_t sums[kGemmPanel];
      __builtin_memcpy(sums, &acc[r][j], sizeof sums);
      store_s8_row(sums, a_scale[r], a_min[r], w_scale + j * kGemmPanel, w_sums + j * kGemmPanel,
                   bias == nullptr ? nullptr : bias + j * kGemmPanel, act,
                   c + r * ldc + j * kGemmPanel, left < kGemmPanel ? left : kGemmPanel);
    }
  }
}

// panel_rows_s8_vnni over P panels as a tile of R rows (rows_tail's Tile<R>).
template <int P>
struct S8Vnni {
  template <int R>
  struct Rows {
    static void run(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                    const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4,
                    float* c, int64_t ldc, int cols, const float* bias, Activation act) {
      panel_rows_s8_vnni<R, P>(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, cols,
                               bias, act);
    }
  };
};

template <template <int> class Tile, int Rows>
void s8_vnni_tiles(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                   const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4, float* c,
                   int64_t ldc, int m, int cols, const float* bias, Activation act) {
  int i = 0;
  for (; i + Rows <= m; i += Rows) {
    Tile<Rows>::run(a + i * lda, lda, a_scale + i, a_min + i, panel, w_scale, w_sums, k4,
                    c + i * ldc, ldc, cols, bias, act);
  }
  if (i < m) {
    rows_tail<Tile, Rows - 1>(m - i, a + i * lda, lda, a_scale + i, a_min + i, panel, w_scale,
                                   w_sums, k4, c + i * ldc, ldc, cols, bias, act);
  }
}

void panel_gemm_s8_vnni(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                        const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4,
                        float* c, int64_t ldc, int m, int cols, const float* bias, Activation act) {
  if (cols > kGemmPanel) {
    s8_vnni_tiles<S8Vnni<2>::Rows, kVnniRows2>(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, m, cols,
                             bias, act);
  } else {
    s8_vnni_tiles<S8Vnni<1>::Rows, kVnniRows>(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, m, cols,
                             bias, act);
  }
}
#if defined(__AMX_INT8__)
// The AMX tiles, shared by the int8 kernel below and the bfloat16 one after it.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Whether this CPU has AMX-TILE and the AMX feature of CPUID.(7, 0):EDX bit `feature` (22 BF16,
// 25 INT8), and the kernel lets this process use the tile state (Linux gives it only when asked:
// ARCH_REQ_XCOMP_PERM for XTILEDATA).
bool amx_usable(int feature) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 24)) || !(edx & (1u << feature))) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Tiles 0-3 the accumulators (rows 0-15 and 16-31 of panels 0 and 1), 4-5 a's two row tiles, 6-7
// the two panels' tiles: all 16 rows of 64 bytes.
void load_amx_tiles() {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// The accumulator tiles into out [32][2 · kGemmPanel] (4-byte values), the second panel's where
// there is one.
template <typename T>
void store_amx_accumulators(T (&out)[32][2 * kGemmPanel], bool two) {
  constexpr int64_t stride = sizeof(out[0]);
  _tile_stored(0, &out[0][0], stride);
  _tile_stored(2, &out[16][0], stride);
  if (two) {
    _tile_stored(1, &out[0][kGemmPanel], stride);
    _tile_stored(3, &out[16][kGemmPanel], stride);
  }
}

// AMX-INT8: a tile instruction multiplies a 16 x 64 u8 tile by a 64 x 16 s8 tile into 16 x 16 int32,
// the latter in exactly the panels' layout (16 k-groups of 16 columns x 4). A step takes 32 rows x
// 2 panels: four accumulator tiles, two of a's, two of the panels'. The tile configuration is
// loaded at each call and released after it: other code on the same thread (oneDNN, under torch)
// may configure the tiles its own way.
void panel_gemm_s8_amx(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                       const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4,
                       float* c, int64_t ldc, int m, int cols, const float* bias, Activation act) {
  load_amx_tiles();
  const int64_t next = int64_t{4} * k4 * kGemmPanel;  // the second panel
  const bool two = cols > kGemmPanel;
  alignas(64) int32_t out[kS8RowPad][2 * kGemmPanel];
  for (int i = 0; i < m; i += kS8RowPad) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint8_t* rows = a + i * lda;
    for (int g = 0; g < k4; g += kS8KGroups) {
      _tile_loadd(4, rows + 4 * g, lda);
      _tile_loadd(5, rows + 16 * lda + 4 * g, lda);
      _tile_loadd(6, panel + g * 4 * kGemmPanel, 4 * kGemmPanel);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(2, 5, 6);
      if (two) {
        _tile_loadd(7, panel + next + g * 4 * kGemmPanel, 4 * kGemmPanel);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(3, 5, 7);
      }
    }
    store_amx_accumulators(out, two);
    const int n_rows = m - i < kS8RowPad ? m - i : kS8RowPad;
    for (int r = 0; r < n_rows; ++r) {
      float* cr = c + (i + r) * ldc;
      store_s8_row(out[r], a_scale[i + r], a_min[i + r], w_scale, w_sums, bias, act, cr,
                   two ? kGemmPanel : cols);
      if (two) {
        store_s8_row(out[r] + kGemmPanel, a_scale[i + r], a_min[i + r], w_scale + kGemmPanel,
                     w_sums + kGemmPanel, bias == nullptr ? nullptr : bias + kGemmPanel, act,
                     cr + kGemmPanel, cols - kGemmPanel);
      }
    }
  }
  _tile_release();
}
#endif

// Chosen when the table is built: AMX-INT8 where the CPU has it and the OS lets this process use
// it (FTBERT_CPU_AMX=0 leaves it out), else VNNI (a CPU with AVX512-BF16 but neither gets the
// portable tile).
S8Kernel s8_kernel_for_cpu() {
  __builtin_cpu_init();
  const bool vnni = __builtin_cpu_supports("avx512vnni");
#if defined(__AMX_INT8__)
  const char* amx = std::getenv("FTBERT_CPU_AMX");
  if (vnni && (amx == nullptr || std::strcmp(amx, "0") != 0) && amx_usable(25)) {
    return {panel_gemm_s8_amx, "amx"};
  }
#endif
  return vnni ? S8Kernel{panel_gemm_s8_vnni, "vnni"} : S8Kernel{panel_gemm_s8, "portable"};
}
#elif defined(__AVX2__)
// AVX2 without VNNI: vpmaddubsw's 16-bit sums of u8 x s8 pairs would saturate (255 · 127 · 2 >
// 32,767), so both sides are widened to 16 bits and vpmaddwd adds each pair of products into a
// 32-bit lane: exact, the same S as every other kernel. A k-group of 4 columns is one vector of
// 8 lanes, each column's sum split over two of them until the end. (Half panels of 6 rows with
// a's rows widened ahead ran slower: docs/performance.md, "CPU int8".)
constexpr int kAvx2S8Rows = 2;  // 2 rows x 4 vectors of sums and 4 of weights: 13 of 16 registers

template <int R>
void panel_rows_s8_avx2(const uint8_t* __restrict a, int64_t lda, const float* a_scale,
                        const float* a_min, const int8_t* __restrict panel, const float* w_scale,
                        const int32_t* w_sums, int k4, float* c, int64_t ldc, int cols,
                        const float* bias, Activation act) {
  constexpr int V = kGemmPanel / 4;  // vectors of 4 columns
  __m256i acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_si256();
  for (int q = 0; q < k4; ++q) {
    const int8_t* b = panel + q * 4 * kGemmPanel;
    __m256i w[V];
    for (int v = 0; v < V; ++v) {
      w[v] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * v)));
    }
    for (int r = 0; r < R; ++r) {
      int32_t x;
      __builtin_memcpy(&x, a + r * lda + 4 * q, sizeof x);
      // a's four values as 16-bit lanes, repeated for each of a vector's four columns.
      const __m256i xs = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(x)));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(xs, w[v]));
    }
  }
  for (int r = 0; r < R; ++r) {
    int32_t halves[2 * kGemmPanel];
    __builtin_memcpy(halves, acc[r], sizeof halves);
    int32_t sums[kGemmPanel];
    for (int j = 0; j < kGemmPanel; ++j) sums[j] = halves[2 * j] + halves[2 * j + 1];
    store_s8_row(sums, a_scale[r], a_min[r], w_scale, w_sums, bias, act, c + r * ldc, cols);
  }
}

template <int R>
struct PanelRowsS8Avx2 {
  static void run(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                  const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4, float* c,
                  int64_t ldc, int cols, const float* bias, Activation act) {
    panel_rows_s8_avx2<R>(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, cols, bias,
                          act);
  }
};

void panel_gemm_s8_avx2(const uint8_t* a, int64_t lda, const float* a_scale, const float* a_min,
                        const int8_t* panel, const float* w_scale, const int32_t* w_sums, int k4,
                        float* c, int64_t ldc, int m, int cols, const float* bias, Activation act) {
  if (cols > kGemmPanel) {  // the next panel's columns too, one panel at a time
    panel_gemm_s8_avx2(a, lda, a_scale, a_min, panel, w_scale, w_sums, k4, c, ldc, m, kGemmPanel,
                       bias, act);
    panel_gemm_s8_avx2(a, lda, a_scale, a_min, panel + 4 * k4 * kGemmPanel, w_scale + kGemmPanel,
                       w_sums + kGemmPanel, k4, c + kGemmPanel, ldc, m, cols - kGemmPanel,
                       bias == nullptr ? nullptr : bias + kGemmPanel, act);
    return;
  }
  int i = 0;
  for (; i + kAvx2S8Rows <= m; i += kAvx2S8Rows) {
    PanelRowsS8Avx2<kAvx2S8Rows>::run(a + i * lda, lda, a_scale + i, a_min + i, panel, w_scale,
                                      w_sums, k4, c + i * ldc, ldc, cols, bias, act);
  }
  if (i < m) {
    rows_tail<PanelRowsS8Avx2, kAvx2S8Rows - 1>(m - i, a + i * lda, lda, a_scale + i, a_min + i,
                                                panel, w_scale, w_sums, k4, c + i * ldc, ldc, cols,
                                                bias, act);
  }
}

S8Kernel s8_kernel_for_cpu() { return {panel_gemm_s8_avx2, "avx2"}; }
#else
S8Kernel s8_kernel_for_cpu() { return {panel_gemm_s8, "portable"}; }
#endif

#if defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__) && defined(__AVX512BF16__)
// AMX-BF16: one tile instruction multiplies 16 rows x 32 bfloat16 values by 32 x 16 into float32,
// the weights' bfloat16 panels ([k/2, 16, 2]) being the tile's layout; 32 rows x 2 panels a step,
// on the int8 kernel's tiles (whose helpers it shares, hence the guard). For k a multiple of 32; other k run the AVX512-BF16 kernel (the choice is the
// weight's, never the batch's). Rows past the last multiple of 32 are copied, zero-padded, so that
// no tile reads past a's last row.

inline void store_bf16_row(const float* acc, const float* bias, Activation act, uint16_t* c, int cols) {
  vf y;
  __builtin_memcpy(&y, acc, sizeof y);
  if (bias != nullptr) {
    const vf bv = cols >= W ? load(bias) : load_part(bias, cols, 0.0f);
    y = activate(y + bv, act);
  }
  const vh h = narrow(y);
  if (cols == kGemmPanel) {
    store_h(c, h);
  } else {
    for (int j = 0; j < cols; ++j) c[j] = h[j];
  }
}

void panel_gemm_bf16_amx(const uint16_t* a, int64_t lda, const uint16_t* panel, int k, uint16_t* c,
                         int64_t ldc, int m, int cols, const float* bias, Activation act) {
  if (k % 32 != 0) return panel_gemm_bf16(a, lda, panel, k, c, ldc, m, cols, bias, act);
  load_amx_tiles();
  const int64_t next = int64_t{k} * kGemmPanel;  // the second panel
  const bool two = cols > kGemmPanel;
  thread_local std::vector<uint16_t> tail;
  alignas(64) float out[32][2 * kGemmPanel];
  for (int i = 0; i < m; i += 32) {
    const int n_rows = m - i < 32 ? m - i : 32;
    const uint16_t* rows = a + i * lda;
    int64_t stride = lda;
    if (n_rows < 32) {
      tail.assign(static_cast<size_t>(32) * k, 0);
      for (int r = 0; r < n_rows; ++r) std::memcpy(tail.data() + int64_t{r} * k, rows + r * lda, 2 * k);
      rows = tail.data();
      stride = k;
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int p = 0; p < k; p += 32) {
      _tile_loadd(4, rows + p, 2 * stride);
      _tile_loadd(5, rows + 16 * stride + p, 2 * stride);
      _tile_loadd(6, panel + int64_t{p} * kGemmPanel, 4 * kGemmPanel);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, panel + next + int64_t{p} * kGemmPanel, 4 * kGemmPanel);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    store_amx_accumulators(out, two);
    for (int r = 0; r < n_rows; ++r) {
      uint16_t* cr = c + (i + r) * ldc;
      store_bf16_row(out[r], bias, act, cr, two ? kGemmPanel : cols);
      if (two) {
        store_bf16_row(out[r] + kGemmPanel, bias == nullptr ? nullptr : bias + kGemmPanel, act,
                       cr + kGemmPanel, cols - kGemmPanel);
      }
    }
  }
  _tile_release();
}
#endif

#if defined(__AVX512BF16__)
float bf16_dot_peak(int64_t steps) {
  constexpr int kChains = 12;  // more than the instruction's latency in cycles: no chain waits
  __m512 acc[kChains];
  for (int r = 0; r < kChains; ++r) acc[r] = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // pairs of 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x3a803a80);  // pairs of 2^-10
  for (int64_t i = 0; i < steps; ++i) {
#pragma GCC unroll 12
    for (int r = 0; r < kChains; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], x, y);
    __asm__ volatile("" : "+v"(x));  // x unknown to the compiler each round: no folding
  }
  float sum = 0.0f;
  for (int r = 0; r < kChains; ++r) {
    vf v;
    __builtin_memcpy(&v, &acc[r], sizeof v);
    sum += v[0];
  }
  return sum;
}
#endif

// The bfloat16 weight GEMM: AMX-BF16 where the CPU has it and the OS lets this process use it
// (FTBERT_CPU_AMX=0 leaves it out), else AVX512-BF16's dot product; null without either.
decltype(Kernels::panel_gemm_bf16) bf16_kernel_for_cpu() {
#if defined(__AVX512BF16__)
#if defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__)
  const char* amx = std::getenv("FTBERT_CPU_AMX");
  if ((amx == nullptr || std::strcmp(amx, "0") != 0) && amx_usable(22)) return panel_gemm_bf16_amx;
#endif
  return panel_gemm_bf16;
#else
  return nullptr;
#endif
}

}  // namespace

const Kernels& table() {
  static const S8Kernel s8 = s8_kernel_for_cpu();
  static const Kernels k{bias_activation, sum3_layernorm, masked_softmax, attention, panel_gemm,
                         widen_bf16,      narrow_bf16,    bf16_kernel_for_cpu(), s8.gemm,
                         quantize_row_u8, s8.name,
#if defined(__AVX512BF16__)
                         bf16_dot_peak
#else
                         nullptr
#endif
  };
  return k;
}

}  // namespace ftbert::cpu::FTBERT_ISA_NS
