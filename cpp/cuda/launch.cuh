// Kernel launches with Programmatic Dependent Launch (Hopper and later). A kernel launched with
// launch() may be scheduled while the kernel ahead of it in the stream is still finishing: its
// blocks' launch overlaps that kernel's last blocks and memory flush, instead of following them
// (in a CUDA graph, a programmatic edge instead of a full one). Such a kernel therefore starts
// with begin_dependent_kernel(), before its first global-memory access of any kind: it returns
// once the previous kernel has completed and its writes are visible, and lets the next kernel
// be scheduled early in turn (it waits the same way). Every ftbert kernel does so on every path,
// early returns included: a kernel that finished without waiting would let the one after it
// overlap the one before it. The one exception to "before any access": a model's weights (and
// an op's uploaded operands) reach the device by copies, which keep their full ordering, and no
// kernel writes them, so a kernel may load those before it waits, to overlap the loads with the
// kernel before (the LayerNorms' bias, gamma and beta: layernorm.cu).
//
// The other kernels of a stream (cuBLAS's, torch's) are launched as usual and wait for their
// predecessor in full; copies and cross-stream events keep their full ordering too. Recorded
// forwards keep those full edges into cuBLAS's kernels: made programmatic, some of its kernels
// did not wait for their input (its split-k batched GEMM, several algorithms at 4,096 x 768 x
// 3,072), and where all did, BERT-base forwards on an H100 ran no faster
// (benchmarks/kernels/graph_edges.cu, benchmarks/results/graph-edges-h100.txt).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace ftbert::cuda {

__device__ __forceinline__ void begin_dependent_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device may be programmatic: compute capability 9.0 or later,
// this build's kernels compiled for it (a kernel JIT-compiled from older PTX has no wait), and
// FTBERT_CUDA_PDL not "0". Read once per device.
bool dependent_launch_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), programmatic where dependent_launch_enabled().
// Errors are reported as for <<<>>> (cudaGetLastError; FTBERT_LAUNCH_CHECK after it).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  if (dependent_launch_enabled()) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace ftbert::cuda
