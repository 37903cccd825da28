// add_bias + residual + LayerNorm on the CPU (the post-LN residual block of a BERT layer).
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace ftbert {

using cpu::parallel_for;

void CpuBackend::add_bias_residual_layernorm(DType dt, void* x,         // [M, H]
                                             const void* residual,      // [M, H]
                                             const void* bias,          // [H]
                                             const void* gamma, const void* beta,  // [H]
                                             int rows, int hidden, float eps,
                                             int32_t* nonfinite) {
  require_cpu_float32(dt, "add_bias_residual_layernorm");
  auto* xs = static_cast<float*>(x);
  const auto* res = static_cast<const float*>(residual);
  const auto* b = static_cast<const float*>(bias);
  const auto* g = static_cast<const float*>(gamma);
  const auto* be = static_cast<const float*>(beta);
  const auto kernel = cpu::kernels().sum3_layernorm;
  parallel_for(rows, int64_t{rows} * hidden, [&](int64_t begin, int64_t end) {
    bool bad = false;
    for (int64_t r = begin; r < end; ++r) {
      float* xr = xs + r * hidden;
      kernel(xr, b, res + r * hidden, g, be, xr, hidden, eps);
      if (nonfinite != nullptr && !bad) {  // the row is still in cache
        for (int h = 0; h < hidden; ++h) bad |= !std::isfinite(xr[h]);
      }
    }
    if (bad) __atomic_store_n(nonfinite, 1, __ATOMIC_RELAXED);
  });
}

}  // namespace ftbert
