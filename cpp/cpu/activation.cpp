// add_bias + activation on the CPU: GELU (erf form, as transformers' "gelu"), GELU (tanh form,
// "gelu_new" / "gelu_pytorch_tanh"), ReLU, tanh (the pooler) and none (a projection's bias).
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"

namespace ftbert {

namespace {
inline float activate(float x, Activation act) {
  switch (act) {
    case Activation::kGeluErf: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::kGeluTanh: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);  // sqrt(2/pi)
      return 0.5f * x * (1.0f + std::tanh(inner));
    }
    case Activation::kRelu: return x > 0.0f ? x : 0.0f;
    case Activation::kTanh: return std::tanh(x);
    case Activation::kIdentity: return x;
  }
  return x;
}
}  // namespace

using cpu::parallel_for;

void CpuBackend::add_bias_activation(DType dt, void* x,  // [M, N]
                                     const void* bias,   // [N]
                                     int rows, int cols, Activation act) {
  require_cpu_float32(dt, "add_bias_activation");
  auto* xs = static_cast<float*>(x);
  const auto* b = static_cast<const float*>(bias);
  parallel_for(rows, int64_t{rows} * cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = xs + r * cols;
      for (int c = 0; c < cols; ++c) row[c] = activate(row[c] + b[c], act);
    }
  });
}

}  // namespace ftbert
