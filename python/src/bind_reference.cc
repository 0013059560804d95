// bind_reference.cc: the C++ reference utilities, the reload flags and the
// case runner, for reloadsafe/reference.py and reloadsafe/cases.py.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "python/src/bindings.h"

#include "conformance/case_runner.h"
#include "conformance/case_tensors.h"
#include "utils/reload_context.h"
#include "utils/storage_fit.h"

#include <memory>
#include <optional>

namespace py = pybind11;

namespace reloadsafe::python {
namespace {

// DirectReloadScope as a Python context manager: the flag is set on
// __enter__ and restored on __exit__, on the thread that entered.
class DirectReloadContext {
 public:
  explicit DirectReloadContext(bool enabled) : enabled_(enabled) {}
  void enter() {
    TORCH_CHECK(!scope_, "direct_reload(): this context is already entered; make a new one");
    scope_ = std::make_unique<DirectReloadScope>(enabled_);
  }
  void exit() { scope_.reset(); }

 private:
  bool enabled_;
  std::unique_ptr<DirectReloadScope> scope_;
};

}  // namespace

void bind_reference(py::module_& m) {
  m.def("in_own_storage", &in_own_storage, py::arg("old"), py::arg("new"),
        py::arg("whole_storage") = false);
  m.def("storage_view", &storage_view, py::arg("storage"), py::arg("offset"), py::arg("shape"),
        py::arg("stride"), py::arg("dtype"));
  m.def("extent", &extent, py::arg("tensor"));
  m.def("checked_extent", &checked_extent, py::arg("sizes"), py::arg("strides"));

  m.def("direct_reload_enabled", &direct_reload_enabled);
  py::class_<DirectReloadContext>(m, "DirectReloadContext")
      .def(py::init<bool>(), py::arg("enabled") = true)
      .def("__enter__", [](DirectReloadContext& self) { self.enter(); })
      .def("__exit__", [](DirectReloadContext& self, py::args) { self.exit(); });

  // The case runner never throws (case_runner.h) and holds no Python state,
  // so the GIL is released while a case runs.
  m.def("evaluate_case", &conformance::evaluate_case, py::arg("line"),
        py::call_guard<py::gil_scoped_release>());
  m.def("is_case_line", &conformance::is_case_line, py::arg("line"));
  m.attr("MAX_CASE_STORAGE_BYTES") = conformance::kMaxCaseStorageBytes;
}

}  // namespace reloadsafe::python
