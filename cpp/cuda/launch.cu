#include "cuda/launch.cuh"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_check.h"

namespace ftbert::cuda {
namespace {

// Compiled as every kernel of the main library is: its code versions are theirs.
__global__ void dependent_launch_probe() {}

bool env_allows() {
  static const bool allowed = [] {
    const char* v = std::getenv("FTBERT_CUDA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return allowed;
}

bool device_allows(int device) {
  int major = 0;
  FTBERT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) return false;
  cudaFuncAttributes attributes{};
  FTBERT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, dependent_launch_probe));
  return attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90;
}

}  // namespace

bool dependent_launch_enabled() {
  if (!env_allows()) return false;
  int device = 0;
  FTBERT_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= 64) return false;
  // Per device: bit set in `known` once looked up, in `allowed` if it may.
  static std::atomic<uint64_t> known{0}, allowed{0};
  const uint64_t bit = uint64_t{1} << device;
  if (!(known.load(std::memory_order_acquire) & bit)) {
    if (device_allows(device)) allowed.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
  }
  return (allowed.load(std::memory_order_relaxed) & bit) != 0;
}

namespace {
thread_local LaunchNotes* active_notes = nullptr;
}  // namespace

LaunchNotes* LaunchNotes::active() { return active_notes; }

LaunchNotes::Scope::Scope(LaunchNotes& notes) : outer_(active_notes) { active_notes = &notes; }

LaunchNotes::Scope::~Scope() { active_notes = outer_; }

bool LaunchNotes::last_node(cudaStream_t stream, cudaGraphNode_t* node) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* dependencies = nullptr;
  size_t count = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &dependencies, nullptr,
                               &count) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive || count != 1) {
    return false;
  }
  *node = dependencies[0];
  return true;
}

}  // namespace ftbert::cuda
