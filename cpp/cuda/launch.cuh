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

#include <array>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ftbert/backend.h"

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

// ---- redirected recordings ------------------------------------------------------------------
// A recording's kernels that take a redirectable address (Device::record) as a pointer
// parameter are noted while it is captured: the graph node and the parameters it was given, so
// that a replay can give the node other addresses in their place (CudaBackend::replay). Only a
// parameter that is the address itself is found; a buffer that reaches a kernel another way
// (inside a struct, at an offset, through cuBLAS) would keep its recorded address, which is why
// redirectable buffers may reach the device only as plain pointer parameters of launch().

// One noted launch.
class NotedLaunch {
 public:
  virtual ~NotedLaunch() = default;
  // Sets the node's parameters in `exec` to those recorded, each redirected address replaced.
  virtual cudaError_t apply(cudaGraphExec_t exec, const std::vector<Redirect>& redirects) const = 0;
};

// What launch() notes on the thread that captures a recording, while a Scope of it lives.
class LaunchNotes {
 public:
  explicit LaunchNotes(std::vector<const void*> addresses) : addresses_(std::move(addresses)) {}

  // The thread's notes while a Scope lives, else null.
  static LaunchNotes* active();
  class Scope {
   public:
    explicit Scope(LaunchNotes& notes);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    LaunchNotes* outer_;
  };

  template <typename... Params>
  void note(void (*kernel)(Params...), const cudaLaunchConfig_t& config,
            const std::tuple<Params...>& values);

  // Whether a launch that took a redirectable address could not be noted (its node unknown).
  bool failed() const { return failed_; }
  const std::vector<const void*>& addresses() const { return addresses_; }
  std::vector<std::unique_ptr<NotedLaunch>> take() { return std::move(launches_); }

 private:
  template <typename P>
  bool is_redirectable(const P& value) const {
    if constexpr (std::is_pointer_v<P>) {
      for (const void* a : addresses_) {
        if (static_cast<const void*>(value) == a) return true;
      }
    }
    return false;
  }
  // The node the last launch into `stream` added: the capture's one dependency now.
  bool last_node(cudaStream_t stream, cudaGraphNode_t* node) const;

  std::vector<const void*> addresses_;
  std::vector<std::unique_ptr<NotedLaunch>> launches_;
  bool failed_ = false;
};

template <typename... Params>
class NotedKernelLaunch final : public NotedLaunch {
 public:
  NotedKernelLaunch(cudaGraphNode_t node, void (*kernel)(Params...), const cudaLaunchConfig_t& c,
                    const std::tuple<Params...>& values)
      : node_(node), kernel_(kernel), grid_(c.gridDim), block_(c.blockDim),
        smem_(c.dynamicSmemBytes), values_(values) {}

  cudaError_t apply(cudaGraphExec_t exec, const std::vector<Redirect>& redirects) const override {
    std::tuple<Params...> values = values_;
    std::array<void*, sizeof...(Params)> args{};
    std::apply(
        [&](auto&... v) {
          (redirect(v, redirects), ...);
          args = {static_cast<void*>(&v)...};
        },
        values);
    cudaKernelNodeParams p = {};
    p.func = reinterpret_cast<void*>(kernel_);
    p.gridDim = grid_;
    p.blockDim = block_;
    p.sharedMemBytes = static_cast<unsigned>(smem_);
    p.kernelParams = args.data();
    return cudaGraphExecKernelNodeSetParams(exec, node_, &p);
  }

 private:
  template <typename P>
  static void redirect(P& value, const std::vector<Redirect>& redirects) {
    if constexpr (std::is_pointer_v<P>) {
      for (const Redirect& r : redirects) {
        if (static_cast<const void*>(value) == r.recorded) value = static_cast<P>(r.replayed);
      }
    }
  }

  cudaGraphNode_t node_;
  void (*kernel_)(Params...);
  dim3 grid_, block_;
  size_t smem_;
  std::tuple<Params...> values_;
};

template <typename... Params>
void LaunchNotes::note(void (*kernel)(Params...), const cudaLaunchConfig_t& config,
                       const std::tuple<Params...>& values) {
  const bool takes = std::apply([&](const auto&... v) { return (is_redirectable(v) || ...); },
                                values);
  if (!takes) return;
  cudaGraphNode_t node = nullptr;
  if (!last_node(config.stream, &node)) {
    failed_ = true;
    return;
  }
  launches_.push_back(std::make_unique<NotedKernelLaunch<Params...>>(node, kernel, config, values));
}

// kernel<<<grid, block, smem, stream>>>(args...), programmatic where dependent_launch_enabled().
// Errors are reported as for <<<>>> (cudaGetLastError; FTBERT_LAUNCH_CHECK after it). While a
// redirectable recording is captured, the launch is noted if it takes one of its addresses.
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
  LaunchNotes* notes = LaunchNotes::active();
  if (notes == nullptr) {
    (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    return;
  }
  // The parameters as the kernel takes them, kept for a replay to set them again.
  const std::tuple<Params...> values(std::forward<Args>(args)...);
  const cudaError_t err =
      std::apply([&](const auto&... v) { return cudaLaunchKernelEx(&config, kernel, v...); },
                 values);
  if (err == cudaSuccess) notes->note(kernel, config, values);
}

}  // namespace ftbert::cuda
