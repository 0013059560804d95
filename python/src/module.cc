// module.cc: reloadsafe._C, the compiled core of the `reloadsafe` Python
// package.
//
// Invariant: tensors cross between Python and C++ through LibTorch's own
// pybind11 casters (torch/extension.h), never as copies: a tensor a binding
// returns is the very tensor (same TensorImpl, storage and data pointer) the
// C++ function returned, and an argument is the caller's tensor. The module is
// built against the torch the interpreter imports (see python/BUILD.bazel);
// `reloadsafe/__init__.py` checks the version and C++ ABI match before use.
//
// The public API lives in plain Python (python/reloadsafe/); the names here
// are private building blocks with the C++ behaviour unchanged.
#include <torch/extension.h>

#include "conformance/case_runner.h"
#include "utils/storage_fit.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <string>

namespace py = pybind11;

namespace {

// TORCH_CHECK messages reach Python without the C++ backtrace, as torch's own
// bindings do: ValueError for c10::ValueError and its kin, RuntimeError else.
void translate_c10_errors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "reloadsafe's compiled core (LibTorch); use the `reloadsafe` package instead.";
  py::register_local_exception_translator(&translate_c10_errors);

  m.attr("TORCH_VERSION") = TORCH_VERSION;
  m.attr("GLIBCXX_USE_CXX11_ABI") = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);

  m.def("in_own_storage", &reloadsafe::in_own_storage, py::arg("old"), py::arg("new"),
        py::arg("whole_storage") = false);
  m.def("storage_view", &reloadsafe::storage_view, py::arg("storage"), py::arg("offset"),
        py::arg("shape"), py::arg("stride"), py::arg("dtype"));
  m.def("extent", &reloadsafe::extent, py::arg("tensor"));
  m.def("checked_extent", &reloadsafe::checked_extent, py::arg("sizes"), py::arg("strides"));

  // The case runner never throws (case_runner.h); it holds no Python state,
  // so the GIL is released while a case runs.
  m.def("evaluate_case", &reloadsafe::conformance::evaluate_case, py::arg("line"),
        py::call_guard<py::gil_scoped_release>());
  m.def("is_case_line", &reloadsafe::conformance::is_case_line, py::arg("line"));
  m.attr("MAX_CASE_STORAGE_BYTES") = reloadsafe::conformance::kMaxCaseStorageBytes;
}
