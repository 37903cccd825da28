// add_bias + activation on the CPU (vectorized, kernels_impl.h): GELU (erf form, as transformers' "gelu"), GELU (tanh form,
// "gelu_new" / "gelu_pytorch_tanh"), ReLU, tanh (the pooler) and none (a projection's bias).
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace ftbert {


using cpu::parallel_for;

void CpuBackend::add_bias_activation(DType dt, void* x,  // [M, N]
                                     const void* bias,   // [N]
                                     int rows, int cols, Activation act) {
  require_cpu_dtype(dt, "add_bias_activation");
  const cpu::Floats b(dt, bias, cols);
  const auto kernel = cpu::kernels().bias_activation;
  parallel_for(rows, int64_t{rows} * cols, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(1, cols);
    for (int64_t r = begin; r < end; ++r) {
      float* xr = cpu::load_row(dt, x, r, cols, buf);
      kernel(xr, b.data(), cols, act);
      cpu::store_row(dt, x, r, cols, xr);
    }
  });
}

}  // namespace ftbert
