// add_bias + activation on the CPU (vectorized, kernels_impl.h): GELU (erf form, as transformers' "gelu"), GELU (tanh form,
// "gelu_new" / "gelu_pytorch_tanh"), ReLU, tanh (the pooler), SiLU (SwiGLU's gate) and none (a
// projection's bias).
#include <vector>

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

void CpuBackend::gated_activation(DType dt, const void* x,  // [M, 2n]
                                  void* out,                  // [M, n]
                                  int rows, int n, Activation act) {
  require_cpu_dtype(dt, "gated_activation");
  const auto kernel = cpu::kernels().bias_activation;
  const std::vector<float> zeros(n, 0.0f);
  parallel_for(rows, int64_t{rows} * n, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(3, n);  // the row (2n), then the result
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = cpu::load_row(dt, x, r, 2 * int64_t{n}, buf);
      float* o = cpu::out_row(dt, out, r, n, buf + 2 * int64_t{n});
      for (int c = 0; c < n; ++c) o[c] = xr[c];
      kernel(o, zeros.data(), n, act);
      for (int c = 0; c < n; ++c) o[c] *= xr[n + c];
      cpu::store_row(dt, out, r, n, o);
    }
  });
}

}  // namespace ftbert
