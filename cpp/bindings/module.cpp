// The pybind11 module ftbert._C: conversions only. Engine errors become Python exceptions
// (InputError -> ValueError, every other ftbert::Error -> RuntimeError).
#include "bindings/bindings.h"

#include "ftbert/backend.h"
#include "ftbert/check.h"

namespace ftbert::bindings {

DType dtype_from_string(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  throw InputError("unknown dtype '" + name + "': expected 'float32', 'float16' or 'bfloat16'");
}

}  // namespace ftbert::bindings

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace ftbert;
  m.doc() = "ftbert engine (C++): encoder, backends, op-level test entry points";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("cuda_backend_built", &cuda_backend_built,
        "Whether this build has the CUDA backend library (it may still lack a GPU to run on).");
  m.attr("built_with_cuda") = py::bool_(FTBERT_HAS_CUDA_BUILD);

  bindings::register_encoder(m);
  bindings::register_op_runner(m);
}
