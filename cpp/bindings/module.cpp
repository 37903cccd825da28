// The pybind11 module ftbert._C: conversions only. Engine errors become Python exceptions
// (InputError -> ValueError, every other ftbert::Error -> RuntimeError).
#include "bindings/bindings.h"

#include "cpu/cpu_backend.h"
#include "cpu/isa.h"
#include "ftbert/backend.h"

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace ftbert;
  m.doc() = "ftbert engine (C++): the encoder";
  bindings::register_error_translation();

  m.def("cuda_backend_built", &cuda_backend_built,
        "Whether this build has the CUDA backend library (it may still lack a GPU to run on).");
  m.attr("built_with_cuda") = py::bool_(FTBERT_HAS_CUDA_BUILD);
  m.def("cpu_has_bf16_instructions", &cpu::has_bf16_instructions,
        "Whether this CPU has AVX512-BF16 (what the CPU backend's bfloat16 GEMMs run on).");
  m.def("cpu_has_int8_dot_product", &cpu::has_int8_dot_product,
        "Whether quantization='int8' runs on this CPU's int8 dot product (AVX512-VNNI).");
  m.def("cpu_int8_kernel", &cpu::int8_kernel,
        "The kernel quantization='int8' runs on this CPU: 'amx', 'vnni' or 'portable'.");
  m.def("cpu_dtype_unsupported_reason",
        [](const std::string& dtype) {
          return cpu_dtype_unsupported_reason(bindings::dtype_from_string(dtype));
        },
        "Why the CPU backend cannot compute in `dtype` on this machine ('' when it can).");

  bindings::register_encoder(m);
  bindings::register_serving(m);
}
