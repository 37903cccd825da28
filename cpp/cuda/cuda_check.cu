// The run-time switch behind FTBERT_LAUNCH_CHECK (see cuda_check.h).
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_check.h"

namespace ftbert::cuda {

bool sync_debug_enabled() {
  // Read once: the variable is meant to be set before the process starts.
  static const bool enabled = [] {
    const char* v = std::getenv("FTBERT_CUDA_SYNC_DEBUG");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace ftbert::cuda
