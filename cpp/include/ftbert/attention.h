// Attention: the two implementations behind one call, and the selector that picks between them.
//   unfused: add_QKV_bias+transpose -> batched QKᵀ -> masked softmax -> batched PV -> transpose
//            (FasterTransformer v1.0; materializes the [B, heads, S, S] scores)
//   flash:   one fused kernel, FlashAttention-2 style (no score matrix in memory)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ftbert/backend.h"

namespace ftbert {

enum class AttentionMode : int { kAuto = 0, kUnfused = 1, kFlash = 2 };

AttentionMode attention_mode_from_string(const std::string& name);
const char* attention_mode_name(AttentionMode mode);

// The one place that decides which kernel runs. Forcing flash where it is not supported throws,
// naming the unsupported property; auto falls back to unfused.
AttentionKind select_attention(AttentionMode mode, const Backend& backend, DType dt, int head_dim,
                               int batch, int seq);

// Scratch bytes run_attention needs for this shape (0 for flash).
size_t attention_workspace_bytes(AttentionKind kind, DType dt, int batch, int seq, int heads,
                                 int head_dim);

// Scratch bytes DeBERTa's disentangled terms need besides (DisentangledAttention::scratch), for
// a layout of `rows` rows and B sequences up to `seq` long.
size_t disentangled_scratch_bytes(AttentionKind kind, DType dt, int64_t rows, int batch, int seq,
                                  int heads, const DisentangledAttention& d);

// out = MultiHeadAttention(qkv + bias) with the layout's key mask and the options' score bias;
// scale = 1/sqrt(head_dim), or DisentangledAttention::scale with disentangled attention (whose
// terms it computes first).
// Packed, the unfused path puts the tokens back at their padded positions around attention
// ([B, heads, S, d]) and packs the result again; the fused kernel reads the packed rows directly.
void run_attention(Backend& backend, AttentionKind kind, DType dt,
                   const void* qkv,       // [rows, 3H], bias not yet added
                   const void* qkv_bias,  // [3H]
                   void* out,             // [rows, H]
                   void* workspace,       // attention_workspace_bytes(...)
                   const SequenceLayout& layout, int heads, int head_dim,
                   const AttentionOptions& options = {});

}  // namespace ftbert
