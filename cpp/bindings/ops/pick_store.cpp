// PickStore for the tests (tests/core/test_pick_store.py): the class as it is, dicts for maps. The
// GIL is released around the file I/O, since store() may wait on another process's lock.
#include "ftbert/pick_store.h"

#include <pybind11/stl.h>

#include "bindings/bindings.h"

namespace ftbert::bindings {

void register_pick_store(py::module_& m) {
  py::class_<PickStore>(m, "PickStore",
                        "A file of measured choices (key -> value) under an identity.")
      .def(py::init<std::string, std::string>(), py::arg("path"), py::arg("identity"))
      .def("load", &PickStore::load, py::call_guard<py::gil_scoped_release>(),
           "The file's entries; {} (with a warning on stderr if the file is foreign or corrupt).")
      .def("store", &PickStore::store, py::arg("entries"), py::call_guard<py::gil_scoped_release>(),
           "Merges entries into the file under its lock; False (and a warning) on an I/O failure.")
      .def_property_readonly("path", &PickStore::path)
      .def_property_readonly("identity", &PickStore::identity);
  m.def("pick_store_default_dir", &PickStore::default_dir,
        "Where caches go: $FTBERT_CACHE_DIR, $XDG_CACHE_HOME/ftbert or $HOME/.cache/ftbert; "
        "'' if none.");
}

}  // namespace ftbert::bindings
