// How the CPU ops read and write the model's tensors: they compute in float32, and a tensor the
// model keeps in bfloat16 is widened a row at a time into the calling thread's scratch and its
// results narrowed back (kernels.h's widen_bf16 / narrow_bf16); float32 rows are used where they
// are. The bfloat16 weight GEMMs read and write bfloat16 directly (gemm.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "ftbert/dtype.h"

namespace ftbert::cpu {

// `count` rows of n floats of the calling thread's own scratch, kept for its next call (a forward
// allocates nothing here after its first). One call per op and thread: a second call may move it.
float* scratch_rows(int count, int64_t n);

// Row r of x [*, n] (dt) as floats: x's own row (float32; writable where x is) or its copy
// widened into buf.
float* load_row(DType dt, const void* x, int64_t r, int64_t n, float* buf);
// Where an op puts its float results for row r of x: x's own row (float32) or buf.
float* out_row(DType dt, void* x, int64_t r, int64_t n, float* buf);
// Writes `values` (from load_row or out_row) to row r of x: nothing to do for a float32 row
// already there, a narrowing for bfloat16.
void store_row(DType dt, void* x, int64_t r, int64_t n, const float* values);
// The element at index i of a dt tensor.
inline void* element(DType dt, void* x, int64_t i) {
  return static_cast<unsigned char*>(x) + i * static_cast<int64_t>(dtype_size(dt));
}

// A tensor's values as float32 for the length of one op: the tensor itself (float32) or a
// widened copy (spread over the pool when large). For biases and LayerNorm parameters, and the
// operands of the GEMMs OpenBLAS runs.
class Floats {
 public:
  Floats(DType dt, const void* x, int64_t n);
  const float* data() const { return data_; }
  float* mutable_data() { return copy_.empty() ? const_cast<float*>(data_) : copy_.data(); }

 private:
  std::vector<float> copy_;
  const float* data_;
};

// Narrows n floats into x (dt bfloat16; float32 copies them unless they are x itself).
void store_floats(DType dt, void* x, const float* values, int64_t n);

}  // namespace ftbert::cpu
