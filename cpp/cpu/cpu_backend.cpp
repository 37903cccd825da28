// CPU backend: memory (plain host allocations) and shared helpers.
#include "cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "cpu/isa.h"
#include "cpu/parallel.h"
#include "ftbert/check.h"

namespace ftbert {

CpuBackend::CpuBackend() { (void)cpu::isa(); }

std::string CpuBackend::device_name() const {
  return "CPU (" + std::to_string(cpu::num_threads()) + " threads, " +
         cpu::isa_name(cpu::isa()) + ")";
}

namespace {
constexpr size_t kPageBytes = 4096;  // the smallest page size of the CPUs built for
}  // namespace

void* CpuBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  // 64-byte alignment keeps rows vector-friendly for BLAS and the compiler's SIMD loops.
  const size_t size = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  FTBERT_CHECK(p != nullptr, "out of host memory allocating " << bytes << " bytes");
  // Large blocks come from the OS unbacked. Touching each page here takes the page faults at
  // allocation (a server's: at start, Encoder::reserve_workspace) rather than in the threads of
  // the first forward to write the buffer.
  auto* page = static_cast<volatile unsigned char*>(p);
  for (size_t at = 0; at < size; at += kPageBytes) page[at] = 0;
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

std::string cpu_dtype_unsupported_reason(DType dt) {
  switch (dt) {
    case DType::kFloat32: return "";
    case DType::kBFloat16: {
      const std::string why = cpu::bf16_unsupported_reason();
      return why.empty() ? "" : "the CPU backend cannot compute in bfloat16 here: " + why;
    }
    case DType::kFloat16: break;
  }
  return std::string("the CPU backend computes in float32 and bfloat16 only, not ") +
         dtype_name(dt);
}

void require_cpu_dtype(DType dt, const char* op) {
  if (dt == DType::kFloat32) return;
  const std::string why = cpu_dtype_unsupported_reason(dt);
  FTBERT_CHECK(why.empty(), why << " (" << op << " called with " << dtype_name(dt) << ")");
}

}  // namespace ftbert
