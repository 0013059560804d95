// bindings.h: the parts of reloadsafe._C, one function per concept, each
// adding its names to the module (module.cc calls them in order).
//
// Invariant: tensors cross between Python and C++ through LibTorch's own
// pybind11 casters (torch/csrc/utils/pybind.h, the header torch/extension.h
// takes them from), never as copies: a tensor a binding returns is the very
// tensor (same TensorImpl, storage and data pointer) the C++ function
// returned, and an argument is the caller's tensor.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace reloadsafe::python {

/// The reference utilities (utils/storage_fit.h), the reload flags
/// (utils/reload_context.h) and the case runner (conformance/case_runner.h).
void bind_reference(pybind11::module_& m);

/// The safetensors file loader (utils/file_loader.h): FileLoader.
void bind_file_loader(pybind11::module_& m);

/// The read trace (conformance/trace/read_trace.h).
void bind_trace(pybind11::module_& m);

/// The reload protocol (conformance/harness/protocol.h): ReloadSubject with a
/// trampoline for Python subjects, run_subject, the report, to_json, to_table.
void bind_protocol(pybind11::module_& m);

}  // namespace reloadsafe::python
