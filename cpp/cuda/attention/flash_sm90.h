// Fused attention on Hopper's warpgroup MMA (see flash_sm90.cu): head dim 64, float16/bfloat16.
// Built only when the CUDA architectures include 90 (FTBERT_FLASH_SM90), as sm_90a code that runs
// on compute capability 9.0 devices only; flash.cu dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/flash_common.cuh"

namespace ftbert::cuda {

// invoke_flash_attention's contract for head dim 64 on a compute capability 9.0 device, after its
// checks; T is __half or __nv_bfloat16.
template <typename T>
void launch_flash_sm90(const flash_detail::FlashParams& p, int batch, int device,
                       cudaStream_t stream);

}  // namespace ftbert::cuda
