// CPU backend: memory (plain host allocations) and shared helpers.
#include "cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "ftbert/check.h"

namespace ftbert {

std::string CpuBackend::device_name() const {
  return "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
}

void* CpuBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  // 64-byte alignment keeps rows vector-friendly for BLAS and the compiler's SIMD loops.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  FTBERT_CHECK(p != nullptr, "out of host memory allocating " << bytes << " bytes");
  return p;
}

void CpuBackend::deallocate(void* ptr) noexcept { std::free(ptr); }

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

void require_cpu_float32(DType dt, const char* op) {
  FTBERT_CHECK(dt == DType::kFloat32, "the CPU backend computes in float32 only ("
                                          << op << " called with " << dtype_name(dt) << ")");
}

void layernorm_row(const float* x, const float* gamma, const float* beta, float* out, int hidden,
                   float eps) {
  double sum = 0.0;
  for (int i = 0; i < hidden; ++i) sum += x[i];
  const double mean = sum / hidden;
  double sq = 0.0;
  for (int i = 0; i < hidden; ++i) {
    const double d = x[i] - mean;
    sq += d * d;
  }
  const float rstd = static_cast<float>(1.0 / std::sqrt(sq / hidden + eps));
  const float m = static_cast<float>(mean);
  for (int i = 0; i < hidden; ++i) out[i] = (x[i] - m) * rstd * gamma[i] + beta[i];
}

}  // namespace ftbert
