// add_bias + residual + LayerNorm on the CPU (the post-LN residual block of a BERT layer).
#include <cmath>
#include <vector>

#include "cpu/cpu_backend.h"
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
  parallel_for(rows, int64_t{rows} * hidden, [&](int64_t begin, int64_t end) {
    std::vector<float> row(hidden);
    for (int64_t r = begin; r < end; ++r) {
      float* xr = xs + static_cast<int64_t>(r) * hidden;
      const float* rr = res + static_cast<int64_t>(r) * hidden;
      for (int h = 0; h < hidden; ++h) row[h] = xr[h] + b[h] + rr[h];
      layernorm_row(row.data(), static_cast<const float*>(gamma), static_cast<const float*>(beta),
                    xr, hidden, eps);
    }
  });
  if (nonfinite != nullptr) {
    const int64_t n = int64_t{rows} * hidden;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(xs[i])) {
        *nonfinite = 1;
        break;
      }
    }
  }
}

}  // namespace ftbert
