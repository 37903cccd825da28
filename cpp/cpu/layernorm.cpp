// add_bias + residual + LayerNorm on the CPU (the post-LN residual block of a BERT layer).
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace ftbert {

using cpu::parallel_for;

void CpuBackend::add_bias_residual_layernorm(DType dt, void* x,         // [M, H]
                                             const void* residual,      // [M, H]
                                             const void* bias,          // [H]
                                             const void* gamma, const void* beta,  // [H]
                                             int rows, int hidden, float eps,
                                             int32_t* nonfinite) {
  require_cpu_dtype(dt, "add_bias_residual_layernorm");
  const cpu::Floats b(dt, bias, hidden), g(dt, gamma, hidden), be(dt, beta, hidden);
  const auto kernel = cpu::kernels().sum3_layernorm;
  parallel_for(rows, int64_t{rows} * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(2, hidden);
    bool bad = false;
    for (int64_t r = begin; r < end; ++r) {
      float* xr = cpu::load_row(dt, x, r, hidden, buf);
      const float* rr = cpu::load_row(dt, residual, r, hidden, buf + hidden);
      kernel(xr, b.data(), rr, g.data(), be.data(), xr, hidden, eps);
      if (nonfinite != nullptr && !bad) {  // the row is still in cache
        for (int h = 0; h < hidden; ++h) bad |= !std::isfinite(xr[h]);
      }
      cpu::store_row(dt, x, r, hidden, xr);
    }
    if (bad) __atomic_store_n(nonfinite, 1, __ATOMIC_RELAXED);
  });
}

}  // namespace ftbert
