// Fused FlashAttention-2-style attention for BERT encoders (see flash.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ftbert/backend.h"
#include "ftbert/dtype.h"
#include "ftbert/sequences.h"

namespace ftbert::cuda {

// "" when the fused kernel runs for this dtype/head dim, else why not (names the property).
std::string flash_attention_unsupported_reason(DType dt, int head_dim);

// Whether the fused kernel computes DeBERTa's terms itself for this dtype/head dim
// (DisentangledTerms::positions): at head dim 64, unless FTBERT_DEBERTA_TERM_TABLES=1 keeps the
// term tables (to compare the two).
bool flash_computes_terms(DType dt, int head_dim);

// out[row, h*d + :] = softmax(scale * q·kᵀ + rel over the sequence's keys) · v, with q/k/v read
// from the QKV GEMM output plus bias: padded batches attend over keys with mask == 1 (fully masked
// rows give zeros), packed ones over their own rows. rel: the options' relative position bias
// (none by default; its span must be >= layout.max_seq), at the rows' padded positions. With the
// options' window W > 0, only keys within W positions of the query attend (a row with none left
// gives zeros); W >= layout.max_seq is no window. batch_invariant: one kernel per head dim (and
// bias/window) whatever the batch's shape, so a row's result never depends on its batch (else the
// kernel is picked by the grid's size).
void invoke_flash_attention(DType dt,
                            const void* qkv,       // [rows, 3H] (Q|K|V, bias not added)
                            const void* qkv_bias,  // [3H]
                            void* out,             // [rows, H]
                            const SequenceLayout& layout, int heads, int head_dim, float scale,
                            const AttentionOptions& options, cudaStream_t stream,
                            bool batch_invariant = false);

}  // namespace ftbert::cuda
