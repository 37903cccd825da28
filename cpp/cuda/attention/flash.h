// Fused FlashAttention-2-style attention for BERT encoders (see flash.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ftbert/dtype.h"

namespace ftbert::cuda {

// "" when the fused kernel runs for this dtype/head dim, else why not (names the property).
std::string flash_attention_unsupported_reason(DType dt, int head_dim);

// out[b, s, h*d + :] = softmax(scale * q·kᵀ over keys with mask==1) · v, with q/k/v read from
// the QKV GEMM output plus bias. Fully masked rows give zeros.
void invoke_flash_attention(DType dt,
                            const void* qkv,       // [B, S, 3H] (Q|K|V, bias not added)
                            const void* qkv_bias,  // [3H]
                            const int32_t* mask,   // [B, S]
                            void* out,             // [B, S, H]
                            int batch, int seq, int heads, int head_dim, float scale,
                            cudaStream_t stream);

}  // namespace ftbert::cuda
