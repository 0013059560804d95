// bind_trace.cc: the read trace (conformance/trace/read_trace.h) for
// reloadsafe/trace.py. The Python context manager creates the C++ trace on
// __enter__ and stops it on __exit__, on the same thread; results are copied
// out as plain records (identities and pointers as integers).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "python/src/bindings.h"

#include "conformance/trace/memory_census.h"
#include "conformance/trace/read_trace.h"
#include "conformance/trace/sparse_parts.h"
#include "conformance/trace/trace_records.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace reloadsafe::python {
namespace {

using trace::ObjectRead;
using trace::OpCall;
using trace::ReadTrace;
using trace::TensorRead;

uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

// Owns one ReadTrace for the lifetime of a Python `with` block.
class PyReadTrace {
 public:
  explicit PyReadTrace(bool nested) {
    ReadTrace::Options options;
    options.nested = nested;
    trace_ = std::make_unique<ReadTrace>(options);
  }
  void stop() { trace_->stop(); }
  std::vector<OpCall> ops() const { return trace_->ops(); }

 private:
  std::unique_ptr<ReadTrace> trace_;
};

}  // namespace

void bind_trace(py::module_& m) {
  // The census, for check_reload's own memory rules (reloadsafe/state.py).
  m.def("live_tensor_bytes", &trace::live_tensor_bytes, py::arg("device"));
  m.def("take_peak_tensor_bytes", &trace::take_peak_tensor_bytes, py::arg("device"));
  // A stretch of code whose CPU allocations the census numbers (the
  // allocations' epochs, TensorRead.allocation_epoch), for
  // reloadsafe/vllm_engine.py: the storages a step makes around its traced
  // forward.
  // The scope lives from __enter__ to __exit__, whoever keeps the Python
  // object longer.
  struct CpuCensus {
    std::optional<trace::CpuCensusScope> scope;
  };
  py::class_<CpuCensus>(m, "CpuCensus")
      .def(py::init<>())
      .def("__enter__", [](CpuCensus& c) { c.scope.emplace(); })
      .def("__exit__", [](CpuCensus& c, const py::args&) { c.scope.reset(); });
  m.def("cpu_allocation_epoch", &trace::cpu_allocation_epoch);
  // The tensors that hold a sparse tensor's bytes, by name (sparse_parts.h),
  // for reloadsafe/walk.py: one table of the layouts' parts for both
  // languages. None for a tensor that is not sparse.
  m.def(
      "sparse_parts",
      [](const at::Tensor& t) -> std::optional<std::vector<std::pair<std::string, at::Tensor>>> {
        const size_t n = trace::sparse_part_count(t);
        if (n == 0) return std::nullopt;
        std::vector<std::pair<std::string, at::Tensor>> parts;
        for (size_t k = 0; k < n; ++k) {
          parts.emplace_back(trace::sparse_part_info(t, k).name, trace::sparse_part(t, k));
        }
        return parts;
      },
      py::arg("tensor"));
  // Stretches of a traced thread that are not the traced code's work (a
  // compiler's), for reloadsafe/compiler.py.
  m.def("begin_untraced", &trace::begin_untraced);
  m.def("end_untraced", &trace::end_untraced);
  m.def("untraced", &trace::untraced);
  py::class_<TensorRead>(m, "TensorRead")
      .def_readonly("arg", &TensorRead::arg)
      .def_readonly("element", &TensorRead::element)
      .def_readonly("arg_name", &TensorRead::arg_name)
      .def_readonly("written", &TensorRead::written)
      .def_readonly("external", &TensorRead::external)
      .def_readonly("allocation_epoch", &TensorRead::allocation_epoch)
      .def_readonly("has_storage", &TensorRead::has_storage)
      .def_readonly("subclass", &TensorRead::subclass)
      .def_property_readonly("object", [](const TensorRead& r) { return address(r.object); })
      .def_property_readonly("storage", [](const TensorRead& r) { return address(r.storage); })
      .def_property_readonly("storage_data",
                             [](const TensorRead& r) { return address(r.storage_data); })
      .def_readonly("storage_nbytes", &TensorRead::storage_nbytes)
      .def_property_readonly("data_ptr", [](const TensorRead& r) { return address(r.data_ptr); })
      .def_readonly("storage_offset", &TensorRead::storage_offset)
      .def_property_readonly("sizes",
                             [](const TensorRead& r) { return c10::IntArrayRef(r.sizes).vec(); })
      .def_property_readonly("strides",
                             [](const TensorRead& r) { return c10::IntArrayRef(r.strides).vec(); })
      .def_readonly("dtype", &TensorRead::dtype)
      .def_readonly("device", &TensorRead::device)
      .def_property_readonly("layout", &TensorRead::layout);

  py::class_<ObjectRead>(m, "ObjectRead")
      .def_readonly("arg", &ObjectRead::arg)
      .def_readonly("arg_name", &ObjectRead::arg_name)
      .def_readonly("class_name", &ObjectRead::class_name)
      .def_property_readonly("identity", [](const ObjectRead& o) { return address(o.identity); })
      .def_property_readonly("payload", [](const ObjectRead& o) { return address(o.payload); });

  py::class_<OpCall>(m, "OpCall")
      .def_readonly("name", &OpCall::name)
      .def_readonly("depth", &OpCall::depth)
      .def_property_readonly("reads",
                             [](const OpCall& op) {
                               return std::vector<TensorRead>(op.reads.begin(), op.reads.end());
                             })
      .def_readonly("objects", &OpCall::objects);

  py::class_<PyReadTrace>(m, "ReadTrace")
      .def(py::init<bool>(), py::arg("nested") = true)
      .def("stop", &PyReadTrace::stop)
      .def("ops", &PyReadTrace::ops);
}

}  // namespace reloadsafe::python
