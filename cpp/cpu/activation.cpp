// add_bias + activation on the CPU (vectorized, kernels_impl.h): GELU (erf form, as transformers' "gelu"), GELU (tanh form,
// "gelu_new" / "gelu_pytorch_tanh"), ReLU, tanh (the pooler) and none (a projection's bias).
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace ftbert {


using cpu::parallel_for;

void CpuBackend::add_bias_activation(DType dt, void* x,  // [M, N]
                                     const void* bias,   // [N]
                                     int rows, int cols, Activation act) {
  require_cpu_float32(dt, "add_bias_activation");
  auto* xs = static_cast<float*>(x);
  const auto* b = static_cast<const float*>(bias);
  const auto kernel = cpu::kernels().bias_activation;
  parallel_for(rows, int64_t{rows} * cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) kernel(xs + r * cols, b, cols, act);
  });
}

}  // namespace ftbert
