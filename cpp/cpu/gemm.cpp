// GEMMs on the CPU: OpenBLAS sgemm (row-major), single-threaded inside, threaded by our own pool;
// the layers' weight GEMMs by our own kernel over weights packed at load (weight_gemm, below).
//
// Why not OpenBLAS's threads: they spin between calls and, beside the pool that runs the other
// ops, put two busy threads on every core; on a 2-core machine that cost more than the GEMMs'
// own threading gained. So OpenBLAS runs one thread, and each GEMM is cut into column (or row)
// slices that the pool runs: one pool, FTBERT_NUM_THREADS threads, for every op.
#include <algorithm>

#include "cpu/blas.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

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

}  // namespace

void CpuBackend::gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                      int lda, const void* b, int ldb, void* c, int ldc, float alpha, float beta) {
  require_cpu_float32(dt, "gemm");
  openblas_one_thread();
  const auto* A = static_cast<const float*>(a);
  const auto* Bm = static_cast<const float*>(b);
  auto* C = static_cast<float*>(c);
  const int threads = cpu::num_threads();
  const int64_t macs = int64_t{m} * n * k;
  if (threads == 1 || macs < kMinParallelMacs || m == 0 || n == 0) {
    sgemm(trans_a, trans_b, m, n, k, alpha, A, lda, Bm, ldb, beta, C, ldc);
    return;
  }
  // Column slices when there are enough columns (each slice reads all of A and its own columns of
  // B, the weights), else row slices; one slice per thread: each slice is a BLAS call that packs
  // its operands again, and on MiniLM (2 threads, same process, alternated 3 times) one slice per
  // thread ran 8 x 128 in 332-370 ms against 353-425 ms with two.
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

// ---- weight GEMMs: our own kernel over weights packed once ------------------------------------
// OpenBLAS packs B into panels on every call; for the layers' weights that is the same work each
// forward, and at batch 1 (tens of rows) it is a large share of the GEMM. So the weights are
// packed once, at load, into cpu::kGemmPanel-wide panels, and weight_gemm runs the register-tiled
// panel kernel of the CPU's instruction set (kernels.h) over them.

namespace {
constexpr int kPanel = cpu::kGemmPanel;
// Rows of A per pass over the panels: 192 rows of up to 384 floats (288 KiB) stay in L2 while
// every panel of the thread's share streams past them.
constexpr int kRowBlock = 192;
int panels_of(int n) { return (n + kPanel - 1) / kPanel; }
}  // namespace

size_t CpuBackend::weight_bytes(DType, int k, int n) const {
  return static_cast<size_t>(k) * panels_of(n) * kPanel * sizeof(float);
}

void CpuBackend::upload_weight(DType dt, const void* host_w, int k, int n, void* dst) {
  require_cpu_float32(dt, "upload_weight");
  const auto* w = static_cast<const float*>(host_w);  // [k, n]
  auto* out = static_cast<float*>(dst);               // [panels, k, kPanel]
  for (int j = 0; j < panels_of(n); ++j) {
    const int c0 = j * kPanel, cols = std::min(kPanel, n - c0);
    for (int p = 0; p < k; ++p) {
      float* row = out + (static_cast<int64_t>(j) * k + p) * kPanel;
      std::copy(w + static_cast<int64_t>(p) * n + c0, w + static_cast<int64_t>(p) * n + c0 + cols, row);
      std::fill(row + cols, row + kPanel, 0.0f);
    }
  }
}

void CpuBackend::weight_gemm(DType dt, int m, int n, int k, const void* a, int lda, const void* w,
                             void* c, int ldc, const void* bias, Activation act) {
  require_cpu_float32(dt, "weight_gemm");
  const auto* A = static_cast<const float*>(a);
  const auto* panels = static_cast<const float*>(w);
  const auto* B = static_cast<const float*>(bias);  // applied in the kernel's epilogue
  auto* C = static_cast<float*>(c);
  const auto& kernels = cpu::kernels();
  // Threads take whole panels (columns): each reads all of A and only its own weights.
  cpu::parallel_for(panels_of(n), int64_t{m} * n * k, [&](int64_t begin, int64_t end) {
    for (int i0 = 0; i0 < m; i0 += kRowBlock) {
      const int rows = std::min(kRowBlock, m - i0);
      for (int64_t j = begin; j < end; ++j) {
        const int c0 = static_cast<int>(j) * kPanel;
        kernels.panel_gemm(A + static_cast<int64_t>(i0) * lda, lda, panels + j * k * kPanel, k,
                           C + static_cast<int64_t>(i0) * ldc + c0, ldc, rows,
                           std::min(kPanel, n - c0), B == nullptr ? nullptr : B + c0, act);
      }
    }
  });
}

void CpuBackend::batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k,
                              const void* a, int lda, int64_t stride_a, const void* b, int ldb,
                              int64_t stride_b, void* c, int ldc, int64_t stride_c, int batch,
                              float alpha, float beta) {
  require_cpu_float32(dt, "batched_gemm");
  openblas_one_thread();
  const auto* A = static_cast<const float*>(a);
  const auto* Bm = static_cast<const float*>(b);
  auto* C = static_cast<float*>(c);
  // Attention's products are small (S x S x d per head): the batch is spread over the pool, one
  // whole product per step.
  cpu::parallel_for(batch, int64_t{batch} * m * n * k / 32, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      sgemm(trans_a, trans_b, m, n, k, alpha, A + i * stride_a, lda, Bm + i * stride_b, ldb, beta,
            C + i * stride_c, ldc);
    }
  });
}

}  // namespace ftbert
