// CUDA / cuBLAS error checks. Every runtime and cuBLAS call goes through one of these; failures
// throw ftbert::Error naming the call, so Python gets an exception instead of an abort.
// FTBERT_CUDA_SYNC_DEBUG=1 in the environment synchronizes after every launch, to pinpoint a
// failing kernel.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ftbert/check.h"

namespace ftbert::cuda {

bool sync_debug_enabled();  // reads FTBERT_CUDA_SYNC_DEBUG once

inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) {
    ::ftbert::detail::fail(file, line, std::string("CUDA error in ") + call + ": " +
                                           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

inline void check_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    ::ftbert::detail::fail(file, line, std::string("cuBLAS error in ") + call + ": " +
                                           cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
  }
}

// After a kernel launch: the launch error always; with sync debug, the kernel's own error too.
inline void check_launch(const char* kernel, cudaStream_t stream, const char* file, int line) {
  check_cuda(cudaGetLastError(), kernel, file, line);
  if (sync_debug_enabled()) check_cuda(cudaStreamSynchronize(stream), kernel, file, line);
}

}  // namespace ftbert::cuda

#define FTBERT_CUDA_CHECK(call) ::ftbert::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define FTBERT_CUBLAS_CHECK(call) ::ftbert::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define FTBERT_LAUNCH_CHECK(kernel, stream) \
  ::ftbert::cuda::check_launch(kernel, stream, __FILE__, __LINE__)
