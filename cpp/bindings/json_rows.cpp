// Float rows as JSON arrays' text, for the server's responses: each value as the shortest decimal
// that reads back as the same float32 (std::to_chars), in one C++ loop rather than a Python format
// of every number.
#include <charconv>
#include <cmath>
#include <string>

#include "bindings/bindings.h"
#include "ftbert/check.h"

namespace ftbert::bindings {
namespace {

py::list json_float_rows(const py::array_t<float, py::array::c_style | py::array::forcecast>& values) {
  if (values.ndim() != 2) {
    throw InputError("json_float_rows takes [n, d] values, got " + std::to_string(values.ndim()) +
                     " dimension(s)");
  }
  const auto v = values.unchecked<2>();  // [n, d]
  py::list out(v.shape(0));
  std::string text;
  char number[32];
  for (py::ssize_t i = 0; i < v.shape(0); ++i) {
    text.assign(1, '[');
    for (py::ssize_t j = 0; j < v.shape(1); ++j) {
      const float x = v(i, j);
      if (!std::isfinite(x)) throw InputError("Out of range float values are not JSON compliant");
      if (j > 0) text.push_back(',');
      if (x == 0.0f && std::signbit(x)) {
        text += "-0.0";  // "-0" reads back as the integer 0 (Python's json): the sign would be lost
        continue;
      }
      text.append(number, std::to_chars(number, number + sizeof number, x).ptr);
    }
    text.push_back(']');
    out[i] = py::str(text);
  }
  return out;
}

}  // namespace

void register_json_rows(py::module_& m) {
  m.def("json_float_rows", &json_float_rows, py::arg("values"),
        "Each row of [n, d] values (taken as float32) as a JSON array's text, every number the "
        "shortest that reads back as the same float32; ValueError for NaN or infinity.");
}

}  // namespace ftbert::bindings
