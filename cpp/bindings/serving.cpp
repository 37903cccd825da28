// The server's host-side helpers (cpp/serving): conversions to and from Python values.
#include <string>
#include <unordered_map>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "ftbert/check.h"
#include "serving/json_rows.h"
#include "serving/word_pieces.h"

namespace ftbert::bindings {
namespace {

py::list json_float_rows(const py::array_t<float, py::array::c_style | py::array::forcecast>& values) {
  if (values.ndim() != 2) {
    throw InputError("json_float_rows takes [n, d] values, got " + std::to_string(values.ndim()) +
                     " dimension(s)");
  }
  const float* data = values.data();  // [n, d]
  const py::ssize_t n = values.shape(0), d = values.shape(1);
  py::list out(n);
  std::string text;
  for (py::ssize_t i = 0; i < n; ++i) {
    text.clear();
    serving::append_json_row(data + i * d, d, text);
    out[i] = py::str(text);
  }
  return out;
}

}  // namespace

void register_serving(py::module_& m) {
  m.def("json_float_rows", &json_float_rows, py::arg("values"),
        "Each row of [n, d] values (taken as float32) as a JSON array's text, every number the "
        "shortest that reads back as the same float32; ValueError for NaN or infinity.");

  py::class_<serving::WordPieces>(m, "WordPieces",
                                  "A BERT tokenizer's ids for normalized ASCII text "
                                  "(cpp/serving/word_pieces.h).")
      .def(py::init([](const py::dict& vocab, int32_t unk, const std::string& prefix, int64_t max_chars,
                       bool lowercase, std::vector<int32_t> before, std::vector<int32_t> after) {
             std::unordered_map<std::string, int32_t> table;
             table.reserve(vocab.size());
             for (const auto& [piece, id] : vocab) table.emplace(piece.cast<std::string>(), id.cast<int32_t>());
             return serving::WordPieces(std::move(table), unk, prefix, max_chars, lowercase,
                                        std::move(before), std::move(after));
           }),
           py::arg("vocab"), py::arg("unk"), py::arg("prefix"), py::arg("max_chars"),
           py::arg("lowercase"), py::arg("before"), py::arg("after"))
      .def(
          "ids",
          [](serving::WordPieces& self, const std::string& text, int64_t max_length, bool cut_left,
             bool special_tokens) {
            const std::vector<int32_t> ids = self.ids(text, max_length, cut_left, special_tokens);
            py::list out(ids.size());
            for (size_t i = 0; i < ids.size(); ++i) out[i] = py::int_(ids[i]);
            return out;
          },
          py::arg("text"), py::arg("max_length"), py::arg("cut_left"), py::arg("special_tokens"),
          "The ids of `text` (max_length < 0: not cut).");
}

}  // namespace ftbert::bindings
