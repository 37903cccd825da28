// Shared helpers of the pybind11 module: conversions between numpy arrays and engine types.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "ftbert/dtype.h"

namespace ftbert::bindings {

namespace py = pybind11;

DType dtype_from_string(const std::string& name);

void register_encoder(py::module_& m);
void register_op_runner(py::module_& m);

}  // namespace ftbert::bindings
