// Shared helpers of the pybind11 modules (_C: the encoder; _ops: the op test harness):
// conversions between Python values and engine types.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "ftbert/dtype.h"

namespace ftbert::bindings {

namespace py = pybind11;

DType dtype_from_string(const std::string& name);
// InputError -> ValueError, every other ftbert::Error -> RuntimeError; once per module.
void register_error_translation();

void register_encoder(py::module_& m);     // in _C
void register_serving(py::module_& m);     // in _C
void register_op_runner(py::module_& m);   // in _ops
void register_pick_store(py::module_& m);  // in _ops

}  // namespace ftbert::bindings
