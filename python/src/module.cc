// module.cc: reloadsafe._C, the compiled core of the `reloadsafe` Python
// package.
//
// The module is built against the torch the interpreter imports (see
// python/BUILD.bazel); `reloadsafe/_loader.py` checks that the version and the
// C++ ABI match before anything else runs. The public API lives in plain
// Python (python/reloadsafe/); the names here are private building blocks
// with the C++ behaviour unchanged (bindings.h lists the parts).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "python/src/bindings.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

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

  reloadsafe::python::bind_reference(m);
  reloadsafe::python::bind_file_loader(m);
  reloadsafe::python::bind_trace(m);
  reloadsafe::python::bind_protocol(m);
}
