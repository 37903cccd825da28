// add_bias + residual + LayerNorm on the CPU (the post-LN residual block of a BERT layer), and the
// pre-norm residual steps: residual + LayerNorm (ModernBERT), residual + RMSNorm (EuroBERT).
#include <cmath>
#include <optional>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace ftbert {

using cpu::parallel_for;

namespace cpu {

void rmsnorm_row(const float* x, const float* gamma, float* out, int n, float eps) {
  // kLanes partial sums in a fixed order: the compiler keeps them in vector registers, and a row's
  // result does not depend on how the rows are split over threads.
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  const int body = n - n % kLanes;
  for (int i = 0; i < body; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * x[i + j];
  }
  for (int i = body; i < n; ++i) acc[i - body] += x[i] * x[i];
  float sq = 0.0f;
  for (int j = 0; j < kLanes; ++j) sq += acc[j];
  const float rstd = 1.0f / std::sqrt(sq / n + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * rstd * gamma[i];
}

}  // namespace cpu

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

// residual = residual + x + bias, stored, then out = LayerNorm(residual) over the stored values (a
// bfloat16 residual rounds before the statistics, as the next step reads it).
void CpuBackend::residual_add_layernorm(DType dt, void* residual,  // [M, H]
                                        const void* x,             // [M, H] or null
                                        const void* bias,          // [H] or null
                                        const void* gamma, const void* beta,  // [H]
                                        void* out,                 // [M, H]
                                        int rows, int hidden, float eps, int32_t* nonfinite) {
  require_cpu_dtype(dt, "residual_add_layernorm");
  const std::vector<float> zeros(hidden, 0.0f);
  const cpu::Floats g(dt, gamma, hidden), be(dt, beta, hidden);
  std::optional<cpu::Floats> b;
  if (bias != nullptr) b.emplace(dt, bias, hidden);
  const float* bias_f = b ? b->data() : zeros.data();
  const auto kernel = cpu::kernels().sum3_layernorm;
  parallel_for(rows, int64_t{rows} * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(3, hidden);
    bool bad = false;
    for (int64_t r = begin; r < end; ++r) {
      float* rr = cpu::load_row(dt, residual, r, hidden, buf);
      const float* xr = x != nullptr ? cpu::load_row(dt, x, r, hidden, buf + hidden) : zeros.data();
      for (int h = 0; h < hidden; ++h) rr[h] += xr[h] + bias_f[h];
      cpu::store_row(dt, residual, r, hidden, rr);
      // What the stored residual holds, for the statistics: bfloat16 rounds here.
      const float* stored = cpu::load_row(dt, residual, r, hidden, buf);
      float* o = cpu::out_row(dt, out, r, hidden, buf + 2 * int64_t{hidden});
      kernel(stored, zeros.data(), zeros.data(), g.data(), be.data(), o, hidden, eps);
      if (nonfinite != nullptr && !bad) {
        for (int h = 0; h < hidden; ++h) bad |= !std::isfinite(o[h]);
      }
      cpu::store_row(dt, out, r, hidden, o);
    }
    if (bad) __atomic_store_n(nonfinite, 1, __ATOMIC_RELAXED);
  });
}

// residual_add_layernorm's step with RMSNorm: the statistics read the stored residual too.
void CpuBackend::residual_add_rmsnorm(DType dt, void* residual,  // [M, H]
                                      const void* x,             // [M, H] or null
                                      const void* bias,          // [H] or null
                                      const void* gamma,         // [H]
                                      void* out,                 // [M, H]
                                      int rows, int hidden, float eps, int32_t* nonfinite) {
  require_cpu_dtype(dt, "residual_add_rmsnorm");
  const std::vector<float> zeros(hidden, 0.0f);
  const cpu::Floats g(dt, gamma, hidden);
  std::optional<cpu::Floats> b;
  if (bias != nullptr) b.emplace(dt, bias, hidden);
  const float* bias_f = b ? b->data() : zeros.data();
  const bool adds = x != nullptr || bias != nullptr;  // else residual is left as it is
  parallel_for(rows, int64_t{rows} * hidden, [&](int64_t begin, int64_t end) {
    float* buf = cpu::scratch_rows(3, hidden);
    bool bad = false;
    for (int64_t r = begin; r < end; ++r) {
      float* rr = cpu::load_row(dt, residual, r, hidden, buf);
      if (adds) {
        const float* xr =
            x != nullptr ? cpu::load_row(dt, x, r, hidden, buf + hidden) : zeros.data();
        for (int h = 0; h < hidden; ++h) rr[h] += xr[h] + bias_f[h];
        cpu::store_row(dt, residual, r, hidden, rr);
        // What the stored residual holds, for the statistics: bfloat16 rounds here.
        rr = cpu::load_row(dt, residual, r, hidden, buf);
      }
      float* o = cpu::out_row(dt, out, r, hidden, buf + 2 * int64_t{hidden});
      cpu::rmsnorm_row(rr, g.data(), o, hidden, eps);
      if (nonfinite != nullptr && !bad) {
        for (int h = 0; h < hidden; ++h) bad |= !std::isfinite(o[h]);
      }
      cpu::store_row(dt, out, r, hidden, o);
    }
    if (bad) __atomic_store_n(nonfinite, 1, __ATOMIC_RELAXED);
  });
}

}  // namespace ftbert
