// bind_protocol.cc: the reload protocol (conformance/harness/protocol.h) for
// reloadsafe/check.py. A Python class derived from _C.ReloadSubject is the
// protocol's subject through the trampoline below; run_subject drives it with
// the GIL held (the subject's methods are Python), and the report, its JSON
// and its table come from the same C++ code as the C++ harness's.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "python/src/bindings.h"

#include "conformance/harness/device_graph.h"
#include "conformance/harness/layer_state.h"
#include "conformance/harness/protocol.h"
#include "conformance/harness/reload_steps.h"
#include "conformance/harness/report.h"
#include "conformance/harness/report_format.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/subject.h"

#include <ATen/core/ivalue.h>
#include <pybind11/stl.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <vector>

namespace py = pybind11;

namespace reloadsafe::python {
namespace {

using harness::BackendReport;
using harness::Checkpoint;
using harness::LayerState;
using harness::ModeReport;
using harness::NamedNumber;
using harness::NamedObject;
using harness::NamedTensor;
using harness::ReloadMode;
using harness::ReloadSteps;
using harness::ReloadSubject;
using harness::RunOptions;
using harness::StateDifference;
using harness::SubjectInfo;
using harness::Violation;
using harness::Warning;

// Every virtual of ReloadSubject, forwarded to the Python override. A Python
// exception in an override reaches the protocol as a C++ exception, which the
// protocol reports as that mode's error.
class PySubject : public ReloadSubject {
 public:
  using ReloadSubject::ReloadSubject;

  SubjectInfo info() const override { PYBIND11_OVERRIDE_PURE(SubjectInfo, ReloadSubject, info); }
  Checkpoint draw_checkpoint(uint64_t seed) override {
    PYBIND11_OVERRIDE_PURE(Checkpoint, ReloadSubject, draw_checkpoint, seed);
  }
  at::Tensor draw_input(uint64_t seed) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, ReloadSubject, draw_input, seed);
  }
  void cold_load(const Checkpoint& ckpt) override {
    PYBIND11_OVERRIDE_PURE(void, ReloadSubject, cold_load, ckpt);
  }
  void reload(ReloadMode mode, const Checkpoint& ckpt) override {
    PYBIND11_OVERRIDE_PURE(void, ReloadSubject, reload, mode, ckpt);
  }
  at::Tensor forward(const at::Tensor& x) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, ReloadSubject, forward, x);
  }
  at::Tensor cold_forward(const Checkpoint& ckpt, const at::Tensor& x) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, ReloadSubject, cold_forward, ckpt, x);
  }
  std::vector<NamedTensor> named_tensors() override {
    PYBIND11_OVERRIDE_PURE(std::vector<NamedTensor>, ReloadSubject, named_tensors);
  }
  std::vector<NamedObject> named_objects() override {
    PYBIND11_OVERRIDE(std::vector<NamedObject>, ReloadSubject, named_objects);
  }
  void release() override { PYBIND11_OVERRIDE(void, ReloadSubject, release); }
  bool sleep_and_wake(int level) override {
    PYBIND11_OVERRIDE(bool, ReloadSubject, sleep_and_wake, level);
  }
  std::vector<at::Tensor> parameters() override {
    PYBIND11_OVERRIDE(std::vector<at::Tensor>, ReloadSubject, parameters);
  }
  std::vector<at::Tensor> buffers() override {
    PYBIND11_OVERRIDE(std::vector<at::Tensor>, ReloadSubject, buffers);
  }
  std::vector<NamedTensor> cache_tensors() override {
    PYBIND11_OVERRIDE(std::vector<NamedTensor>, ReloadSubject, cache_tensors);
  }
  std::vector<NamedNumber> named_numbers() override {
    PYBIND11_OVERRIDE(std::vector<NamedNumber>, ReloadSubject, named_numbers);
  }
  bool has_cold_state() const override { PYBIND11_OVERRIDE(bool, ReloadSubject, has_cold_state); }
  LayerState cold_state(const Checkpoint& ckpt, int loads,
                        const at::Tensor& forward_input) override {
    PYBIND11_OVERRIDE(LayerState, ReloadSubject, cold_state, ckpt, loads, forward_input);
  }
};

// The identity the read trace gives a TorchBind object (its ivalue::Object).
// Reached through an op so that torch's own argument conversion turns the
// Python ScriptObject into the IValue an op receives.
int64_t object_identity(const c10::IValue& object) {
  TORCH_CHECK(object.isObject(), "reloadsafe: object_identity takes a TorchBind script object (",
              "torch.ScriptObject), got ", object.tagKind());
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(&object.toObjectRef()));
}

TORCH_LIBRARY(reloadsafe, m) {
  m.def("object_identity(Any obj) -> int", &object_identity);
}

int64_t identity_of(const py::object& obj) {
  return py::module_::import("torch")
      .attr("ops")
      .attr("reloadsafe")
      .attr("object_identity")(obj)
      .cast<int64_t>();
}

}  // namespace

void bind_protocol(py::module_& m) {
  py::enum_<ReloadMode>(m, "ReloadMode")
      .value("normal", ReloadMode::kNormal)
      .value("direct", ReloadMode::kDirect);

  py::class_<NamedTensor>(m, "NamedTensor")
      .def(py::init([](std::string name, at::Tensor tensor, bool declared) {
             return NamedTensor{std::move(name), std::move(tensor), declared};
           }),
           py::arg("name"), py::arg("tensor"), py::arg("declared") = true)
      .def_readonly("name", &NamedTensor::name)
      .def_readonly("tensor", &NamedTensor::tensor)
      .def_readonly("declared", &NamedTensor::declared);

  py::class_<NamedObject>(m, "NamedObject")
      .def(py::init([](std::string name, const py::object& obj) {
             return NamedObject{std::move(name), reinterpret_cast<const void*>(identity_of(obj))};
           }),
           py::arg("name"), py::arg("obj"))
      .def_readonly("name", &NamedObject::name)
      .def_property_readonly(
          "identity", [](const NamedObject& o) { return reinterpret_cast<uintptr_t>(o.identity); });
  m.def("object_identity", &identity_of, py::arg("obj"),
        "The identity the read trace gives a TorchBind object (ObjectRead.identity).");

  py::class_<NamedNumber>(m, "NamedNumber")
      .def(py::init([](std::string name, double value, bool integral) {
             return NamedNumber{std::move(name), value, integral};
           }),
           py::arg("name"), py::arg("value"), py::arg("integral") = false)
      .def_readonly("name", &NamedNumber::name)
      .def_readonly("value", &NamedNumber::value)
      .def_readonly("integral", &NamedNumber::integral);

  py::class_<LayerState>(m, "LayerState")
      .def(py::init([](std::vector<NamedTensor> tensors, std::vector<NamedNumber> numbers) {
             return LayerState{std::move(tensors), std::move(numbers)};
           }),
           py::arg("tensors"), py::arg("numbers"))
      .def_readonly("tensors", &LayerState::tensors)
      .def_readonly("numbers", &LayerState::numbers);

  py::class_<StateDifference>(m, "StateDifference")
      .def_readonly("name", &StateDifference::name)
      .def_readonly("before", &StateDifference::before)
      .def_readonly("after", &StateDifference::after);
  m.def("state_differences", &harness::state_differences, py::arg("live"), py::arg("cold"),
        "Every name both states hold whose value differs (layer_state.h).");
  m.def("format_number", &harness::format_number, py::arg("number"));
  m.def("discard_storage", &harness::discard_storage, py::arg("tensor"), py::arg("integer") = 0,
        "Fills `tensor`'s whole storage in place: NaN (floating, complex) or `integer`.");

  py::class_<ReloadSteps>(m, "ReloadSteps")
      .def(py::init<>())
      .def_readwrite("sleep_level", &ReloadSteps::sleep_level)
      .def_readwrite("recreate_parameters", &ReloadSteps::recreate_parameters)
      .def_readwrite("host_numbers", &ReloadSteps::host_numbers)
      .def_readwrite("compare_state", &ReloadSteps::compare_state)
      .def_readwrite("compare_forward_state", &ReloadSteps::compare_forward_state)
      .def_readwrite("cold_footprint_tolerance_bytes", &ReloadSteps::cold_footprint_tolerance_bytes)
      .def_readwrite("reload_peak_budget_bytes", &ReloadSteps::reload_peak_budget_bytes);
  m.def("check_steps", &harness::check_steps, py::arg("steps"));

  py::class_<RunOptions>(m, "RunOptions")
      .def(py::init<>())
      .def_readwrite("reloads", &RunOptions::reloads)
      .def_readwrite("device", &RunOptions::device)
      .def_readwrite("seed", &RunOptions::seed)
      .def_readwrite("max_listed", &RunOptions::max_listed)
      .def_readwrite("trace", &RunOptions::trace)
      .def_readwrite("steps", &RunOptions::steps);
  // The run's defaults and seed rule (run_options.h), for check_reload's
  // default and for tests that tell reloads apart by their checkpoint's seed.
  m.attr("DEFAULT_RELOADS") = harness::kDefaultReloads;
  m.attr("MAX_SLEEP_LEVEL") = harness::kMaxSleepLevel;
  m.def("reload_seed", &harness::reload_seed, py::arg("seed"), py::arg("reload"),
        "The seed of reload `reload`'s checkpoint (1 and up) in a run of `seed`.");

  py::class_<Violation>(m, "Violation")
      .def_readonly("reload", &Violation::reload)
      .def_readonly("tensor", &Violation::tensor)
      .def_readonly("what", &Violation::what)
      .def_readonly("before", &Violation::before)
      .def_readonly("after", &Violation::after)
      .def_readonly("read", &Violation::read);

  py::class_<Warning>(m, "Warning")
      .def_readonly("tensor", &Warning::tensor)
      .def_readonly("read", &Warning::read)
      .def_readonly("message", &Warning::message);

  py::class_<ModeReport>(m, "ModeReport")
      .def_property_readonly(
          "mode", [](const ModeReport& r) { return std::string(harness::to_string(r.mode)); })
      .def_readonly("expected_to_pass", &ModeReport::expected_to_pass)
      .def_readonly("reloads_done", &ModeReport::reloads_done)
      .def_readonly("violation_count", &ModeReport::violation_count)
      .def_readonly("flagged", &ModeReport::flagged)
      .def_readonly("violations", &ModeReport::violations)
      .def_readonly("warnings", &ModeReport::warnings)
      .def_readonly("declared_reads", &ModeReport::declared_reads)
      .def_readonly("undeclared_reads", &ModeReport::undeclared_reads)
      .def_readonly("memory_bytes", &ModeReport::memory_bytes)
      .def_readonly("graph_replays", &ModeReport::graph_replays)
      .def_readonly("error", &ModeReport::error)
      .def("clean", &ModeReport::clean);

  py::class_<BackendReport>(m, "BackendReport")
      .def_readonly("name", &BackendReport::name)
      .def_readonly("description", &BackendReport::description)
      .def_readonly("negative_control", &BackendReport::negative_control)
      .def_readonly("expected_violation", &BackendReport::expected_violation)
      .def_readonly("modes", &BackendReport::modes)
      .def("ok", &BackendReport::ok);

  py::class_<SubjectInfo>(m, "SubjectInfo")
      .def(py::init([](std::string name, std::string description, std::vector<ReloadMode> modes,
                       bool negative_control, std::string expected_violation,
                       int64_t memory_tolerance_bytes, ReloadSteps steps) {
             return SubjectInfo{
                 std::move(name),  std::move(description),        std::move(modes),
                 negative_control, std::move(expected_violation), memory_tolerance_bytes,
                 std::move(steps)};
           }),
           py::arg("name"), py::arg("description") = "",
           py::arg("modes") = std::vector<ReloadMode>{ReloadMode::kNormal, ReloadMode::kDirect},
           py::arg("negative_control") = false, py::arg("expected_violation") = "",
           py::arg("memory_tolerance_bytes") = 0, py::arg("steps") = ReloadSteps{})
      .def_readonly("name", &SubjectInfo::name)
      .def_readonly("description", &SubjectInfo::description)
      .def_readonly("modes", &SubjectInfo::modes)
      .def_readonly("negative_control", &SubjectInfo::negative_control)
      .def_readonly("expected_violation", &SubjectInfo::expected_violation)
      .def_readonly("memory_tolerance_bytes", &SubjectInfo::memory_tolerance_bytes)
      .def_readonly("steps", &SubjectInfo::steps)
      .def_readwrite("warm_up_under_trace", &SubjectInfo::warm_up_under_trace);

  py::class_<ReloadSubject, PySubject>(m, "ReloadSubject")
      .def(py::init<>())
      .def("release", &ReloadSubject::release)
      .def("named_objects", &ReloadSubject::named_objects)
      .def("sleep_and_wake", &ReloadSubject::sleep_and_wake, py::arg("level"))
      .def("parameters", &ReloadSubject::parameters)
      .def("buffers", &ReloadSubject::buffers)
      .def("cache_tensors", &ReloadSubject::cache_tensors)
      .def("named_numbers", &ReloadSubject::named_numbers)
      .def("has_cold_state", &ReloadSubject::has_cold_state)
      .def("cold_state", &ReloadSubject::cold_state, py::arg("ckpt"), py::arg("loads"),
           py::arg("forward_input"));

  m.def("run_subject", &harness::run_subject, py::arg("subject"), py::arg("options"));
  m.def("cuda_unavailable_reason", &harness::cuda_unavailable_reason,
        "Empty when this extension can run the protocol on CUDA, else why not (built without "
        "CUDA, or no device visible).");
  m.def("to_json", &harness::to_json, py::arg("reports"), py::arg("options"));
  m.def("to_table", &harness::to_table, py::arg("reports"));
}

}  // namespace reloadsafe::python
