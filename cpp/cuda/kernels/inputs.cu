// Backend::stage_inputs on the device: the caller's inputs (int32, int64 or uint8/bool) as the
// int32 arrays the ops read, each value checked on the way (ftbert/staged_inputs.h), so that a
// forward of device inputs needs no host-side check and no wait.
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"
#include "cuda/kernels/kernels.h"
#include "ftbert/staged_inputs.h"

namespace ftbert::cuda {
namespace {

constexpr int kStageThreads = 256;

__global__ void __launch_bounds__(kStageThreads)
    stage_inputs_kernel(const void* __restrict__ ids, int ids_bytes, const void* __restrict__ mask,
                        int mask_bytes, const void* __restrict__ types, int types_bytes, int64_t n,
                        int32_t* __restrict__ ids_out, int32_t* __restrict__ mask_out,
                        int32_t* __restrict__ types_out, int vocab, int type_vocab,
                        BadInputValue* bad) {
  begin_dependent_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t value = 0;
    const int32_t field = stage_position(ids, ids_bytes, mask, mask_bytes, types, types_bytes, i,
                                         ids_out, mask_out, types_out, vocab, type_vocab, &value);
    if (field == BadInputValue::kNone || bad == nullptr) continue;
    // One writer records its value; the host sees the field only after the value (fence).
    if (atomicCAS(&bad->claim, 0, 1) == 0) {
      *reinterpret_cast<volatile long long*>(&bad->value) = value;
      __threadfence_system();
      atomicExch(&bad->field, field);
    }
  }
}

}  // namespace

void invoke_stage_inputs(const void* ids, int ids_bytes, const void* mask, int mask_bytes,
                         const void* types, int types_bytes, int64_t n, int32_t* ids_out,
                         int32_t* mask_out, int32_t* types_out, int vocab, int type_vocab,
                         BadInputValue* bad, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kStageThreads - 1) / kStageThreads, 1024);
  launch(stage_inputs_kernel, static_cast<int>(blocks), kStageThreads, 0, stream, ids, ids_bytes,
         mask, mask_bytes, types, types_bytes, n, ids_out, mask_out, types_out, vocab, type_vocab,
         bad);
  FTBERT_LAUNCH_CHECK("stage_inputs_kernel", stream);
}

}  // namespace ftbert::cuda
