// Fused attention on Hopper's warpgroup MMA (see flash_sm90.cu): head dims 64 and 128,
// float16/bfloat16.
// Built only when the CUDA architectures include 90 (FTBERT_FLASH_SM90), as sm_90a code that runs
// on compute capability 9.0 devices only; flash.cu dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/flash_common.cuh"

namespace ftbert::cuda {

// The head dims launch_flash_sm90 runs.
constexpr bool flash_sm90_takes(int head_dim) { return head_dim == 64 || head_dim == 128; }

// invoke_flash_attention's contract for a head dim flash_sm90_takes on a compute capability 9.0
// device, after its checks, without a relative position bias (p.relative_bias null); T is __half
// or __nv_bfloat16. batch_invariant: the one-warpgroup kernel at every grid size.
template <typename T>
void launch_flash_sm90(const flash_detail::FlashParams& p, int batch, int head_dim, int device,
                       cudaStream_t stream, bool batch_invariant = false);

}  // namespace ftbert::cuda
