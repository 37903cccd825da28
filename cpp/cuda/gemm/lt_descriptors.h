// cuBLASLt's descriptors of one weight GEMM, owned together, and its ranked algorithms. A
// row-major c [m, n] = a [m, k] · W is cuBLASLt's column-major cᵀ = op(W) · aᵀ; `w`, `a` and `c`
// are those three operands' layouts (weight_gemm.cu: 16-bit, fp8_gemm.cu: e4m3).
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/cuda_check.h"

namespace ftbert::cuda {

struct LtDescriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;

  LtDescriptors() = default;
  ~LtDescriptors() { release(); }
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;

  void set(cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    FTBERT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, value, bytes));
  }
  void release() noexcept {
    if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {w, a, c})
      if (l != nullptr) (void)cublasLtMatrixLayoutDestroy(l);
    desc = nullptr;
    w = a = c = nullptr;
  }
};

// cuBLASLt's first `max` algorithms for `d` (C and D alike) that fit in `workspace` bytes, splits
// reduced only as `schemes` allows: none where it has none for the shape; other failures throw.
inline std::vector<cublasLtMatmulHeuristicResult_t> lt_ranked(cublasLtHandle_t lt,
                                                              const LtDescriptors& d,
                                                              size_t workspace, uint32_t schemes,
                                                              int max) {
  cublasLtMatmulPreference_t pref = nullptr;
  FTBERT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::vector<cublasLtMatmulHeuristicResult_t> found(max);
  int count = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &schemes, sizeof(schemes));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(lt, d.desc, d.w, d.a, d.c, d.c, pref, max,
                                            found.data(), &count);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) FTBERT_CUBLAS_CHECK(status);
  std::vector<cublasLtMatmulHeuristicResult_t> out;
  for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < count; ++i) {
    if (found[i].state == CUBLAS_STATUS_SUCCESS && found[i].workspaceSize <= workspace) {
      out.push_back(found[i]);
    }
  }
  return out;
}

// Whether `algo` splits k (or does not say): its partial sums, reduced after, may then change with
// the grid, which batch invariance cannot have.
inline bool lt_splits_k(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 1;
  size_t written = 0;
  return cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                              sizeof(splits), &written) != CUBLAS_STATUS_SUCCESS ||
         splits > 1;
}

}  // namespace ftbert::cuda
