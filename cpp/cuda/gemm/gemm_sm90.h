// The FFN-in GEMM with its bias and erf-GELU in the epilogue, for Hopper (sm_90a):
// c = gelu(a · w + bias) as one kernel, CUTLASS's TMA warp-specialized GEMM with the bias and the
// activation applied to the fp32 accumulators before the single rounding to T. cuBLASLt has bias
// epilogues, but its GELU is the tanh approximation (4.8e-4 from erf-GELU), and BERT-family
// checkpoints say erf. Built only when the CUDA architectures include 90 and the CUTLASS headers
// are found (FTBERT_GEMM_SM90).
#pragma once

#include <cuda_runtime.h>

namespace ftbert::cuda {

// c [m, n] (row stride n) = gelu_erf(a [m, k] (row stride k) · w [k, n] (row stride n) + bias [n]).
// T is __half or __nv_bfloat16. Returns false, enqueuing nothing, when the kernel cannot take the
// shape (TMA needs 16-byte aligned rows: k and n multiples of 8, and aligned pointers); the
// caller then runs the unfused path. `sm_count` is the device's multiprocessor count (the
// persistent kernel sizes its grid to it).
template <typename T>
bool gemm_bias_gelu_sm90(int m, int n, int k, const T* a, const T* w, const T* bias, T* c,
                         int sm_count, cudaStream_t stream);

}  // namespace ftbert::cuda
