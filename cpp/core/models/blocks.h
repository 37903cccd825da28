// Building blocks the architecture units (cpp/core/models/<architecture>.cpp) compose, over the
// Backend ops. Stateless: each enqueues its ops on `be` for the model's dtype and config.
#pragma once

#include <cstdint>
#include <vector>

#include "ftbert/attention.h"
#include "ftbert/backend.h"
#include "ftbert/config.h"
#include "ftbert/model.h"
#include "ftbert/sequences.h"
#include "ftbert/weights.h"

namespace ftbert::blocks {

// [P, d] float32: row p = cos of the d/2 angles p · θ^(−2c/d) / scale, then their sin, in float32
// as transformers computes them (inv_freq in float32, divided by the scale, position × inv_freq in
// float32). A scale > 1 stretches the positions (linear and fixed-NTK rope scaling).
std::vector<float> rotary_table(int positions, int head_dim, float theta, float scale = 1.0f);

// [positions − original, d/2] float32: row n − original − 1 holds the frequencies of a sequence of
// extent n under dynamic NTK scaling (RotaryDynamic), θ_n^(−2c/d) with θ_n = θ · (factor · n /
// original − (factor − 1))^(d / (d − 2)), each step in float32 as transformers computes it.
std::vector<float> rotary_dynamic_frequencies(int positions, int original, int head_dim,
                                              float theta, float factor);

// A device copy of `values`.
DeviceBuffer upload_floats(Backend* backend, const std::vector<float>& values);
DeviceBuffer upload_ints(Backend* backend, const std::vector<int32_t>& values);

// `bytes` of zero bits (0 in every dtype): the biases and betas a model does not have.
DeviceBuffer zeros(Backend* backend, size_t bytes);

// act.hidden [M, H] = LN(word[ids] + position + token type), then (ELECTRA) · Wp + bp; rows past
// the tokens of a bucketed recording are cleared in act.ctx (attention never writes them).
// With `codes` the LayerNorm also writes act.hidden's rows to act.gemm_codes where the backend
// takes them (no projection after it); returns them for the first layer's QKV GEMM, else null.
const void* embeddings(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                       const Activations& act,
                       const int32_t* ids,    // [B, S]
                       const int32_t* types,  // [B, S]
                       const SequenceLayout& layout, bool codes = false);

// The post-LayerNorm layer of BERT: attention (with `options`' score bias) -> output dense +
// residual + LN -> FFN -> dense + residual + LN. Reads act.hidden, writes `out` [M, H] (act.hidden
// or act.output); `nonfinite` goes to the last LayerNorm (null: not checked). `hidden_codes`:
// act.hidden's rows as act.gemm_codes holds them (the QKV GEMM reads those), or null; with
// `out_codes` (act.gemm_codes) the last LayerNorm writes out's rows there for the next layer.
void post_ln_layer(Backend& be, DType dt, const ModelConfig& c, const Activations& act,
                   const LayerWeights& w, const SequenceLayout& layout, AttentionKind attention,
                   const AttentionOptions& options, void* out, int32_t* nonfinite,
                   const void* hidden_codes = nullptr, void* out_codes = nullptr);

// The post-LayerNorm layer after attention wrote act.ctx: output dense + residual (act.hidden) +
// LN into act.hidden2 (and its rows into act.gemm_codes, for the FFN-in GEMM), then the FFN +
// residual + LN into `out` (and `out_codes`, as post_ln_layer's).
void post_ln_output(Backend& be, DType dt, const ModelConfig& c, const Activations& act,
                    const LayerWeights& w, const SequenceLayout& layout, void* out,
                    int32_t* nonfinite, void* out_codes = nullptr);

// Every layer of w.layers in turn, the last writing act.output (or act.hidden) with the nonfinite
// check; returns where the final hidden states are. `hidden_codes`: embeddings()' return.
void* post_ln_layers(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                     const Activations& act, const SequenceLayout& layout,
                     AttentionKind attention, const AttentionOptions& options,
                     const void* hidden_codes = nullptr);

// A sequence head's own dense: act.head_hidden [B, H] = act(x_b · Wd + bd), x_b being sequence b's
// first token, or the mean of its tokens where the head reads the mean (HeadConfig::reads_mean);
// or the mean over sequence b's tokens of act(x_t · Wd + bd) (HeadConfig::reads_late_mean).
void sequence_head_dense(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                         const Activations& act, const void* hidden, const SequenceLayout& layout);

// From the final hidden states `hidden` [M, H]: the pooler into act.pooled and the task head into
// act.logits, as `outputs` asks.
void pooler_and_head(Backend& be, DType dt, const ModelConfig& c, const ModelWeights& w,
                     const Activations& act, const void* hidden, const SequenceLayout& layout,
                     Model::Outputs outputs);

}  // namespace ftbert::blocks
