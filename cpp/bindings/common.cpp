// What both pybind11 modules share: dtype names and the translation of engine errors.
#include "bindings/bindings.h"

#include "ftbert/check.h"

namespace ftbert::bindings {

DType dtype_from_string(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  throw InputError("unknown dtype '" + name + "': expected 'float32', 'float16' or 'bfloat16'");
}

void register_error_translation() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace ftbert::bindings
