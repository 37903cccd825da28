// GEMMs on the CPU: OpenBLAS sgemm (row-major), threaded by OpenBLAS itself.
#include "cpu/blas.h"
#include "cpu/cpu_backend.h"

namespace ftbert {

void CpuBackend::gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                      int lda, const void* b, int ldb, void* c, int ldc, float alpha, float beta) {
  require_cpu_float32(dt, "gemm");
  FTBERT_SGEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, static_cast<const float*>(a),
               lda, static_cast<const float*>(b), ldb, beta, static_cast<float*>(c), ldc);
}

void CpuBackend::batched_gemm(DType dt, bool trans_a, bool trans_b, int m, int n, int k,
                              const void* a, int lda, int64_t stride_a, const void* b, int ldb,
                              int64_t stride_b, void* c, int ldc, int64_t stride_c, int batch,
                              float alpha, float beta) {
  require_cpu_float32(dt, "batched_gemm");
  // Attention's products are small (S x S x d per head): OpenBLAS's strided batch spreads the
  // batch over its threads instead of threading inside each tiny product.
  FTBERT_SGEMM_BATCH_STRIDED(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                             trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                             static_cast<const float*>(a), lda, static_cast<blasint>(stride_a),
                             static_cast<const float*>(b), ldb, static_cast<blasint>(stride_b),
                             beta, static_cast<float*>(c), ldc, static_cast<blasint>(stride_c),
                             batch);
}

}  // namespace ftbert
