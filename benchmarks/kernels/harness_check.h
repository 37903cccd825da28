// Error checks of the kernel harnesses (standalone programs): a failed CUDA or cuBLAS call
// prints where and why, and exits.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// cuBLAS and cuBLASLt statuses: 0 is success.
#define CHECK_BLAS(call)                                                            \
  do {                                                                              \
    int s_ = static_cast<int>(call);                                                \
    if (s_ != 0) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #call, s_); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)
