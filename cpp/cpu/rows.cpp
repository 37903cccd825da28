// The CPU ops' float32 views of bfloat16 tensors (rows.h).
#include "cpu/rows.h"

#include <algorithm>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace ftbert::cpu {

namespace {
// Whole-tensor conversions are cut into chunks of this many values for the pool.
constexpr int64_t kChunk = int64_t{1} << 16;

// fn(begin, end) over [0, n) in chunks, on the pool when n is large.
template <class Fn>
void chunked(int64_t n, Fn fn) {
  parallel_for((n + kChunk - 1) / kChunk, n, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
      fn(lo, static_cast<int>(hi - lo));
    }
  });
}
}  // namespace

float* scratch_rows(int count, int64_t n) {
  thread_local std::vector<float> scratch;
  const size_t want = static_cast<size_t>(count) * static_cast<size_t>(n);
  if (scratch.size() < want) scratch.resize(want);
  return scratch.data();
}

float* load_row(DType dt, const void* x, int64_t r, int64_t n, float* buf) {
  if (dt == DType::kFloat32) return const_cast<float*>(static_cast<const float*>(x)) + r * n;
  kernels().widen_bf16(static_cast<const uint16_t*>(x) + r * n, buf, static_cast<int>(n));
  return buf;
}

float* out_row(DType dt, void* x, int64_t r, int64_t n, float* buf) {
  return dt == DType::kFloat32 ? static_cast<float*>(x) + r * n : buf;
}

void store_row(DType dt, void* x, int64_t r, int64_t n, const float* values) {
  if (dt == DType::kFloat32) {
    float* row = static_cast<float*>(x) + r * n;
    if (values != row) std::memcpy(row, values, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  kernels().narrow_bf16(values, static_cast<uint16_t*>(x) + r * n, static_cast<int>(n));
}

Floats::Floats(DType dt, const void* x, int64_t n) : data_(static_cast<const float*>(x)) {
  if (dt == DType::kFloat32 || x == nullptr) return;
  copy_.resize(static_cast<size_t>(n));
  const auto* in = static_cast<const uint16_t*>(x);
  float* out = copy_.data();
  const auto widen = kernels().widen_bf16;
  chunked(n, [&](int64_t lo, int len) { widen(in + lo, out + lo, len); });
  data_ = copy_.data();
}

void store_floats(DType dt, void* x, const float* values, int64_t n) {
  if (dt == DType::kFloat32) {
    if (values != x) std::memcpy(x, values, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(x);
  const auto narrow = kernels().narrow_bf16;
  chunked(n, [&](int64_t lo, int len) { narrow(values + lo, out + lo, len); });
}

}  // namespace ftbert::cpu
