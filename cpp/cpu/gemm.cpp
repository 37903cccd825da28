// GEMMs on the CPU: our own panel kernel (kernels.h), over the layers' weights packed at load
// (weight_gemm, below) and over operands packed per call for the model's other products (the
// pooler's, the heads', the projection, the unfused attention's). The kernel sums each element
// over k in order, whatever the row count: a sequence's outputs do not depend on its batch
// (tests/core/test_batch_invariance.py). OpenBLAS sgemm (row-major, single-threaded inside,
// threaded by our own pool) takes the scaled or transposed-A products, which the model does not run.
// bfloat16: the weight GEMMs on AVX512-BF16 dot products over bfloat16 panels; the others in
// float32 on widened copies, their results rounded once.
//
// Why not OpenBLAS's threads: they spin between calls and, beside the pool that runs the other
// ops, put two busy threads on every core; on a 2-core machine that cost more than the GEMMs'
// own threading gained. So OpenBLAS runs one thread, and each GEMM is cut into column (or row)
// slices that the pool runs: one pool, FTBERT_NUM_THREADS threads, for every op.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace ftbert {

namespace {

// Below this many multiply-adds a GEMM runs on the calling thread (waking the pool costs more).
constexpr int64_t kMinParallelMacs = int64_t{1} << 20;
// Slices narrower than this lose more to packing and edge kernels than they gain in threads.
constexpr int kMinSlice = 64;

void openblas_one_thread() {
  static const bool once = [] {
    FTBERT_OPENBLAS_SET_NUM_THREADS(1);
    return true;
  }();
  (void)once;
}

void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  FTBERT_SGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
               n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C = alpha op(A) op(B) + beta C in float32, cut into slices for the pool.
void sliced_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* A,
                  int lda, const float* Bm, int ldb, float beta, float* C, int ldc) {
  const int threads = cpu::num_threads();
  const int64_t macs = int64_t{m} * n * k;
  if (threads == 1 || macs < kMinParallelMacs || m == 0 || n == 0) {
    sgemm(trans_a, trans_b, m, n, k, alpha, A, lda, Bm, ldb, beta, C, ldc);
    return;
  }
  // Column slices when there are enough columns (each slice reads all of A and its own columns of
  // B, the weights), else row slices; one slice per thread: each slice is a BLAS call that packs
  // its operands again, and two slices per thread ran slower (docs/performance.md, "Kernel
  // choices").
  const bool by_cols = n >= kMinSlice * threads;
  const int extent = by_cols ? n : m;
  const int slices = std::max(1, std::min(threads, extent / kMinSlice));
  cpu::parallel_for(slices, macs, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      // Slice bounds on multiples of 16, the width of the BLAS kernels' register tiles.
      auto edge = [&](int64_t i) {
        const int64_t e = extent * i / slices;
        return i == slices ? extent : static_cast<int>(std::min<int64_t>(extent, (e + 15) / 16 * 16));
      };
      const int lo = edge(s), hi = edge(s + 1);
      if (hi <= lo) continue;
      if (by_cols) {
        // Columns lo..hi of op(B): B + lo (no transpose) or B + lo rows (transposed).
        const float* bs = trans_b ? Bm + static_cast<int64_t>(lo) * ldb : Bm + lo;
        sgemm(trans_a, trans_b, m, hi - lo, k, alpha, A, lda, bs, ldb, beta, C + lo, ldc);
      } else {
        const float* as = trans_a ? A + lo : A + static_cast<int64_t>(lo) * lda;
        sgemm(trans_a, trans_b, hi - lo, n, k, alpha, as, lda, Bm, ldb, beta,
              C + static_cast<int64_t>(lo) * ldc, ldc);
      }
    }
  });
}

// Elements from a matrix's first to its last, `rows` rows of `cols` at row stride ld.
int64_t span(int rows, int cols, int ld) {
  return rows == 0 || cols == 0 ? 0 : int64_t{rows - 1} * ld + cols;
}

// C as float32 for a GEMM that writes it: C itself, or a widened copy (only read when beta != 0)
// that narrow_back() rounds into C's m rows of n.
class GemmOutput {
 public:
  GemmOutput(DType dt, void* c, int64_t elements, float beta)
      : dt_(dt), c_(c), copy_(dt == DType::kFloat32 ? 0 : elements) {
    if (dt != DType::kFloat32 && beta != 0.0f) {
      const cpu::Floats old(dt, c, elements);
      std::copy(old.data(), old.data() + elements, copy_.begin());
    }
  }
  float* data() { return dt_ == DType::kFloat32 ? static_cast<float*>(c_) : copy_.data(); }
  // Rounds the matrix at element `at`, rows of cols at stride ld, back into C (bfloat16);
  // nothing for float32.
  void narrow_back(int64_t at, int rows, int cols, int ld) {
    if (dt_ == DType::kFloat32) return;
    if (ld == cols) return cpu::store_floats(dt_, cpu::element(dt_, c_, at), copy_.data() + at,
                                             int64_t{rows} * cols);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t e = at + i * ld;
      cpu::store_floats(dt_, cpu::element(dt_, c_, e), copy_.data() + e, cols);
    }
  }

 private:
  DType dt_;
  void* c_;
  std::vector<float> copy_;
};

constexpr int kPanel = cpu::kGemmPanel;
// Rows of A per pass over the panels: 192 rows of up to 384 floats (288 KiB) stay in L2 while
// every panel of the thread's share streams past them.
constexpr int kRowBlock = 192;
int panels_of(int n) { return (n + kPanel - 1) / kPanel; }
// bfloat16 panels hold rows in pairs (kernels.h): an odd k gets a zero row.
int panel_rows_of(DType dt, int k) { return dt == DType::kBFloat16 ? (k + 1) / 2 * 2 : k; }

// W [k, n] (row stride ldw; trans: W is stored as its transpose [n, k]) as float32 panels
// [panels, k, kPanel], columns past n zero.
void pack_panels(const float* w, int64_t ldw, bool trans, int k, int n, float* out) {
  for (int j = 0; j < panels_of(n); ++j) {
    const int c0 = j * kPanel, cols = std::min(kPanel, n - c0);
    for (int p = 0; p < k; ++p) {
      float* row = out + (static_cast<int64_t>(j) * k + p) * kPanel;
      if (trans) {
        for (int c = 0; c < cols; ++c) row[c] = w[(c0 + c) * ldw + p];
      } else {
        const float* src = w + p * ldw + c0;
        std::copy(src, src + cols, row);
      }
      std::fill(row + cols, row + kPanel, 0.0f);
    }
  }
}

// c [m, n] = a [m, k] · panels on the calling thread (one product of a batch).
void panels_product(int m, int n, int k, const float* a, int64_t lda, const float* panels, float* c,
                    int64_t ldc) {
  const auto& kernels = cpu::kernels();
  for (int i0 = 0; i0 < m; i0 += kRowBlock) {
    const int rows = std::min(kRowBlock, m - i0);
    for (int j = 0; j < panels_of(n); ++j) {
      kernels.panel_gemm(a + i0 * lda, lda, panels + j * int64_t{k} * kPanel, k, c + i0 * ldc + j * kPanel,
                         ldc, rows, std::min(kPanel, n - j * kPanel), nullptr, Activation::kIdentity);
    }
  }
}

// c [m, n] = act(a [m, k] · panels + bias) over packed float32 panels, threads taking whole panels
// (each reads all of a and only its own columns), rows in blocks that stay in L2.
void run_panels(int m, int n, int k, const float* a, int64_t lda, const float* panels, float* c,
                int64_t ldc, const float* bias, Activation act) {
  const auto& kernels = cpu::kernels();
  cpu::parallel_for(panels_of(n), int64_t{m} * n * k, [&](int64_t begin, int64_t end) {
    for (int i0 = 0; i0 < m; i0 += kRowBlock) {
      const int rows = std::min(kRowBlock, m - i0);
      for (int64_t j = begin; j < end; ++j) {
        const int c0 = static_cast<int>(j) * kPanel, cols = std::min(kPanel, n - c0);
        kernels.panel_gemm(a + i0 * lda, lda, panels + j * int64_t{k} * kPanel, k,
                           c + i0 * ldc + c0, ldc, rows, cols,
                           bias == nullptr ? nullptr : bias + c0, act);
      }
    }
  });
}

}  // namespace

void CpuBackend::gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                      int lda, const void* b, int ldb, void* c, int ldc, float alpha, float beta) {
  require_cpu_dtype(dt, "gemm");
  openblas_one_thread();
  const cpu::Floats a_floats(dt, a, trans_a ? span(k, m, lda) : span(m, k, lda));
  const cpu::Floats b_floats(dt, b, trans_b ? span(n, k, ldb) : span(k, n, ldb));
  GemmOutput out(dt, c, span(m, n, ldc), beta);
  const float* A = a_floats.data();
  const float* Bm = b_floats.data();
  float* C = out.data();
  if (!trans_a && !trans_b && alpha == 1.0f && beta == 0.0f && m > 0 && n > 0) {
    // The model's products with a weight it does not keep packed (the pooler's, the heads', the
    // embedding projection): on the panel kernel, B packed here, so that each row of C is summed
    // in the same order whatever m is. A sequence's pooled output and logits then do not depend
    // on what else is in its batch; OpenBLAS runs a one-row product as a matrix-vector one, in
    // another order.
    std::vector<float> panels(static_cast<size_t>(panels_of(n)) * k * kPanel);
    pack_panels(Bm, ldb, false, k, n, panels.data());
    run_panels(m, n, k, A, lda, panels.data(), C, ldc, nullptr, Activation::kIdentity);
  } else {
    sliced_sgemm(trans_a, trans_b, m, n, k, alpha, A, lda, Bm, ldb, beta, C, ldc);
  }
  out.narrow_back(0, m, n, ldc);
}

// ---- weight GEMMs: our own kernel over weights packed once ------------------------------------
// OpenBLAS packs B into panels on every call; for the layers' weights that is the same work each
// forward, and at batch 1 (tens of rows) it is a large share of the GEMM. So the weights are
// packed once, at load, into cpu::kGemmPanel-wide panels, and weight_gemm runs the register-tiled
// panel kernel of the CPU's instruction set (kernels.h) over them.

// ---- int8 weights (quantization "int8") ---------------------------------------------------------
// W's column j as int8 q[p, j] = round(W[p, j] / s_j), s_j = max_p |W[p, j]| / 127 (symmetric,
// per output channel). Each GEMM's row i of a as uint8 u[i, p] = round((a[i, p] - lo_i) / t_i),
// t_i = (hi_i - lo_i) / 255 over the row's range (asymmetric, per token, computed as the GEMM
// starts: a GELU's output, mostly positive, keeps twice the levels of a symmetric range);
// c = (Σ_p u · q · t_i + lo_i · Σ_p q) · s_j + bias, the sum exact in int32 (k · 255 · 127 stays
// far below 2³¹ for any k a model has). The weight buffer: the scales [n4] floats, the column sums
// [n4] int32 (kernels.h, panel_gemm_s8), then the panels [panels, k4, 16, 4] int8.
namespace {
int k4_of(int k) { return (k + 4 * cpu::kS8KGroups - 1) / (4 * cpu::kS8KGroups) * cpu::kS8KGroups; }
int64_t s8_header_bytes(int n) { return int64_t{panels_of(n)} * kPanel * 8; }

// Rows of a [m, k] (row stride lda) as uint8 rows of 4·k4 (zeros past k, where the weights are
// zero too), their scales and their lows.
void quantize_rows(const float* a, int64_t lda, int m, int k, uint8_t* out, float* scales,
                   float* lows) {
  const int64_t ldq = int64_t{k4_of(k)} * 4;
  const auto& kernels = cpu::kernels();
  cpu::parallel_for(m, int64_t{m} * k / 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      kernels.quantize_row_u8(a + i * lda, k, out + i * ldq, static_cast<int>(ldq), scales + i, lows + i);
    }
  });
}

void run_s8_panels(int m, int n, int k, const float* a, int64_t lda, const void* w, float* c,
                   int64_t ldc, const float* bias, Activation act) {
  const int k4 = k4_of(k);
  const int64_t ldq = int64_t{k4} * 4;
  // The quantized rows, kept per calling thread (forwards run on many threads at once).
  thread_local std::vector<uint8_t> rows;
  thread_local std::vector<float> row_scales, row_lows;
  const size_t padded = static_cast<size_t>((m + cpu::kS8RowPad - 1) / cpu::kS8RowPad * cpu::kS8RowPad);
  rows.resize(padded * ldq);
  row_scales.resize(padded);
  row_lows.resize(padded);
  quantize_rows(a, lda, m, k, rows.data(), row_scales.data(), row_lows.data());
  const auto* scales = static_cast<const float*>(w);
  const auto* sums = reinterpret_cast<const int32_t*>(static_cast<const char*>(w) + s8_header_bytes(n) / 2);
  const auto* panels = reinterpret_cast<const int8_t*>(static_cast<const char*>(w) + s8_header_bytes(n));
  const auto& kernels = cpu::kernels();
  const uint8_t* q = rows.data();
  const float* t = row_scales.data();
  const float* lo = row_lows.data();
  // Threads take pairs of panels (the kernel's widest tile).
  const int pairs = (panels_of(n) + 1) / 2;
  cpu::parallel_for(pairs, int64_t{m} * n * k / 4, [&](int64_t begin, int64_t end) {
    for (int i0 = 0; i0 < m; i0 += kRowBlock) {
      const int block = std::min(kRowBlock, m - i0);
      for (int64_t u = begin; u < end; ++u) {
        const int64_t j = 2 * u;
        const int c0 = static_cast<int>(j) * kPanel, cols = std::min(2 * kPanel, n - c0);
        kernels.panel_gemm_s8(q + i0 * ldq, ldq, t + i0, lo + i0, panels + j * int64_t{k4} * 4 * kPanel,
                              scales + c0, sums + c0, k4, c + i0 * ldc + c0, ldc, block, cols,
                              bias == nullptr ? nullptr : bias + c0, act);
      }
    }
  });
}
}  // namespace

std::string CpuBackend::quantization_unsupported_reason(Quantization q, DType dt) const {
  if (q == Quantization::kFp8) {
    return "quantization 'fp8' runs on a GPU of compute capability 9.0 (Hopper) or later, not on "
           "the CPU (quantization='int8' is the CPU's)";
  }
  if (q == Quantization::kInt8 && dt != DType::kFloat32) {
    return std::string("quantization 'int8' runs float32 activations on the CPU (got dtype ") +
           dtype_name(dt) + "); load it with dtype='float32'";
  }
  return "";
}

size_t CpuBackend::weight_bytes(DType dt, int k, int n) const {
  if (quantization_ == Quantization::kInt8) {
    return static_cast<size_t>(s8_header_bytes(n) + int64_t{panels_of(n)} * k4_of(k) * 4 * kPanel);
  }
  return static_cast<size_t>(panel_rows_of(dt, k)) * panels_of(n) * kPanel * dtype_size(dt);
}

void CpuBackend::upload_weight(DType dt, const void* host_w, int k, int n, void* dst) {
  require_cpu_dtype(dt, "upload_weight");
  if (quantization_ == Quantization::kInt8) {
    FTBERT_CHECK(dt == DType::kFloat32, "int8 weights are quantized from float32");
    const auto* w = static_cast<const float*>(host_w);  // [k, n]
    const int n4 = panels_of(n) * kPanel, k4 = k4_of(k);
    auto* scales = static_cast<float*>(dst);
    auto* sums = reinterpret_cast<int32_t*>(static_cast<char*>(dst) + s8_header_bytes(n) / 2);
    auto* panels = reinterpret_cast<int8_t*>(static_cast<char*>(dst) + s8_header_bytes(n));
    std::fill(panels, panels + int64_t{panels_of(n)} * k4 * 4 * kPanel, int8_t{0});
    for (int j = 0; j < n4; ++j) {
      float top = 0.0f;
      for (int p = 0; j < n && p < k; ++p) top = std::max(top, std::fabs(w[int64_t{p} * n + j]));
      scales[j] = top / 127.0f;
      const float inv = top > 0.0f ? 127.0f / top : 0.0f;
      int32_t sum = 0;
      int8_t* panel = panels + int64_t{j / kPanel} * k4 * 4 * kPanel;
      for (int p = 0; j < n && p < k; ++p) {
        const auto v = static_cast<int8_t>(std::nearbyint(w[int64_t{p} * n + j] * inv));
        panel[(p / 4) * 4 * kPanel + (j % kPanel) * 4 + p % 4] = v;
        sum += v;
      }
      sums[j] = sum;
    }
    return;
  }
  if (dt == DType::kBFloat16) {
    // [panels, ceil(k / 2), kPanel, 2]: column j's values of rows 2q and 2q + 1 side by side.
    const auto* w = static_cast<const uint16_t*>(host_w);  // [k, n]
    auto* out = static_cast<uint16_t*>(dst);
    const int kp = panel_rows_of(dt, k);
    for (int j = 0; j < panels_of(n); ++j) {
      for (int p = 0; p < kp; ++p) {
        uint16_t* pair = out + (static_cast<int64_t>(j) * kp + p / 2 * 2) * kPanel + p % 2;
        for (int c = 0; c < kPanel; ++c) {
          const int col = j * kPanel + c;
          pair[2 * c] = p < k && col < n ? w[static_cast<int64_t>(p) * n + col] : 0;
        }
      }
    }
    return;
  }
  pack_panels(static_cast<const float*>(host_w), n, false, k, n, static_cast<float*>(dst));
}

void CpuBackend::weight_gemm(DType dt, int m, int n, int k, const void* a, int lda, const void* w,
                             void* c, int ldc, const void* bias, Activation act,
                             const void* /*a_codes: none on the CPU*/) {
  require_cpu_dtype(dt, "weight_gemm");
  const cpu::Floats bias_floats(dt, bias, n);  // applied in the kernel's epilogue, in float32
  const float* B = bias_floats.data();
  if (quantization_ == Quantization::kInt8) {
    FTBERT_CHECK(dt == DType::kFloat32, "int8 weights run float32 activations");
    run_s8_panels(m, n, k, static_cast<const float*>(a), lda, w, static_cast<float*>(c), ldc, B, act);
    return;
  }
  if (dt == DType::kFloat32) {
    run_panels(m, n, k, static_cast<const float*>(a), lda, static_cast<const float*>(w),
               static_cast<float*>(c), ldc, B, act);
    return;
  }
  const auto& kernels = cpu::kernels();
  const int64_t panel_elements = int64_t{panel_rows_of(dt, k)} * kPanel;
  // As run_panels, on the bfloat16 panels, threads taking pairs of panels (the kernels' widest tile).
  cpu::parallel_for((panels_of(n) + 1) / 2, int64_t{m} * n * k, [&](int64_t begin, int64_t end) {
    for (int i0 = 0; i0 < m; i0 += kRowBlock) {
      const int rows = std::min(kRowBlock, m - i0);
      for (int64_t u = begin; u < end; ++u) {
        const int64_t j = 2 * u;
        const int c0 = static_cast<int>(j) * kPanel, cols = std::min(2 * kPanel, n - c0);
        kernels.panel_gemm_bf16(static_cast<const uint16_t*>(a) + int64_t{i0} * lda, lda,
                                static_cast<const uint16_t*>(w) + j * panel_elements, k,
                                static_cast<uint16_t*>(c) + int64_t{i0} * ldc + c0, ldc, rows,
                                cols, B == nullptr ? nullptr : B + c0, act);
      }
    }
  });
}

void CpuBackend::batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k,
                              const void* a, int lda, int64_t stride_a, const void* b, int ldb,
                              int64_t stride_b, void* c, int ldc, int64_t stride_c, int batch,
                              float alpha, float beta) {
  require_cpu_dtype(dt, "batched_gemm");
  openblas_one_thread();
  // Elements from the first matrix's first to the last one's last.
  auto whole = [batch](int64_t stride, int64_t one) {
    return batch == 0 ? 0 : (batch - 1) * stride + one;
  };
  const cpu::Floats a_floats(dt, a, whole(stride_a, trans_a ? span(k, m, lda) : span(m, k, lda)));
  const cpu::Floats b_floats(dt, b, whole(stride_b, trans_b ? span(n, k, ldb) : span(k, n, ldb)));
  GemmOutput out(dt, c, whole(stride_c, span(m, n, ldc)), beta);
  const float* A = a_floats.data();
  const float* Bm = b_floats.data();
  float* C = out.data();
  // Attention's products are small (S x S x d per head): the batch is spread over the pool, one
  // whole product per step. Unscaled and unaccumulated, they run on the panel kernel, which sums
  // each element over k in order: a sequence's scores and context then do not depend on where its
  // tokens sit in the padded row (OpenBLAS's kernels group the sum by the element's offset).
  const bool panel = !trans_a && alpha == 1.0f && beta == 0.0f && m > 0 && n > 0;
  cpu::parallel_for(batch, int64_t{batch} * m * n * k / 32, [&](int64_t begin, int64_t end) {
    std::vector<float> panels(panel ? static_cast<size_t>(panels_of(n)) * k * kPanel : 0);
    for (int64_t i = begin; i < end; ++i) {
      if (panel) {
        pack_panels(Bm + i * stride_b, ldb, trans_b, k, n, panels.data());
        panels_product(m, n, k, A + i * stride_a, lda, panels.data(), C + i * stride_c, ldc);
      } else {
        sgemm(trans_a, trans_b, m, n, k, alpha, A + i * stride_a, lda, Bm + i * stride_b, ldb,
              beta, C + i * stride_c, ldc);
      }
    }
  });
  for (int i = 0; i < batch; ++i) out.narrow_back(i * stride_c, m, n, ldc);
}

}  // namespace ftbert
