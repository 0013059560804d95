// bind_protocol.cc: the reload protocol (conformance/harness/protocol.h) for
// reloadsafe/check.py. A Python class derived from _C.ReloadSubject is the
// protocol's subject, and one derived from _C.SubjectLayer a layer it
// builds, through the trampolines below; run_subject drives it with
// the GIL held (the subject's methods are Python), and the report, its JSON
// and its table come from the same C++ code as the C++ harness's.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "python/src/bindings.h"

#include "conformance/harness/checkpoint_pools.h"
#include "conformance/harness/device_graph.h"
#include "conformance/harness/layer_life.h"
#include "conformance/harness/layer_state.h"
#include "conformance/harness/protocol.h"
#include "conformance/harness/reload_steps.h"
#include "conformance/harness/report.h"
#include "conformance/harness/report_format.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/step_table.h"
#include "conformance/harness/subject.h"

#include <ATen/core/ivalue.h>
#include <pybind11/stl.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
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
using harness::StepKind;
using harness::StepSpec;
using harness::StepTakes;
using harness::SubjectInfo;
using harness::SubjectLayer;
using harness::Violation;
using harness::Warning;

// Every virtual of ReloadSubject and SubjectLayer, forwarded to the Python
// override. A Python exception in an override reaches the protocol as a C++
// exception, which the protocol reports as that mode's error (or, from a
// reload, as the violation "reload").
class PySubjectLayer : public SubjectLayer {
 public:
  using SubjectLayer::SubjectLayer;

  void load(const Checkpoint& ckpt) override {
    PYBIND11_OVERRIDE_PURE(void, SubjectLayer, load, ckpt);
  }
  void process() override { PYBIND11_OVERRIDE_PURE(void, SubjectLayer, process); }
  at::Tensor forward(const at::Tensor& x) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, SubjectLayer, forward, x);
  }
  std::vector<NamedTensor> named_tensors() override {
    PYBIND11_OVERRIDE_PURE(std::vector<NamedTensor>, SubjectLayer, named_tensors);
  }
  std::vector<NamedObject> named_objects() override {
    PYBIND11_OVERRIDE(std::vector<NamedObject>, SubjectLayer, named_objects);
  }
  std::vector<NamedNumber> named_numbers() override {
    PYBIND11_OVERRIDE(std::vector<NamedNumber>, SubjectLayer, named_numbers);
  }
  std::vector<at::Tensor> parameters() override {
    PYBIND11_OVERRIDE(std::vector<at::Tensor>, SubjectLayer, parameters);
  }
  std::vector<at::Tensor> buffers() override {
    PYBIND11_OVERRIDE(std::vector<at::Tensor>, SubjectLayer, buffers);
  }
  bool sleep_and_wake(int level) override {
    PYBIND11_OVERRIDE(bool, SubjectLayer, sleep_and_wake, level);
  }
};

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
  std::shared_ptr<SubjectLayer> new_layer() override {
    py::gil_scoped_acquire gil;
    const py::function override =
        py::get_override(static_cast<const ReloadSubject*>(this), "new_layer");
    TORCH_CHECK(override, "the subject does not define new_layer()");
    return held_layer(override(), "new_layer()");
  }
  std::shared_ptr<SubjectLayer> copy_of_new_layer(const Checkpoint* on) override {
    py::gil_scoped_acquire gil;
    const py::function override =
        py::get_override(static_cast<const ReloadSubject*>(this), "copy_of_new_layer");
    if (!override) return nullptr;
    py::object layer = on != nullptr ? override(*on) : override(py::none());
    return layer.is_none() ? nullptr : held_layer(std::move(layer), "copy_of_new_layer()");
  }
  std::vector<NamedTensor> cache_tensors() override {
    PYBIND11_OVERRIDE(std::vector<NamedTensor>, ReloadSubject, cache_tensors);
  }
  void empty_caches() override { PYBIND11_OVERRIDE(void, ReloadSubject, empty_caches); }
  void restore_caches() override { PYBIND11_OVERRIDE(void, ReloadSubject, restore_caches); }

 private:
  // `layer`, what the subject's `method` returned, as the protocol holds it.
  // The Python layer object is held with the C++ pointer: the trampoline's
  // overrides find their Python methods through it, so it must live as
  // long as the protocol holds the layer (dropped under the GIL).
  static std::shared_ptr<SubjectLayer> held_layer(py::object layer, const char* method) {
    TORCH_CHECK(py::isinstance<SubjectLayer>(layer), "the subject's ", method,
                " must return a reloadsafe._C.SubjectLayer, got ",
                std::string(py::str(py::type::of(layer).attr("__name__"))));
    auto* raw = layer.cast<SubjectLayer*>();
    std::shared_ptr<py::object> held(new py::object(std::move(layer)), [](py::object* o) {
      py::gil_scoped_acquire gil;
      delete o;
    });
    return std::shared_ptr<SubjectLayer>(held, raw);
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

  // The step table (step_table.h): check_reload's step keywords, their
  // validation and their docs come from it.
  py::class_<StepSpec>(m, "StepSpec")
      .def_property_readonly("name", [](const StepSpec& s) { return std::string(s.name); })
      .def_property_readonly("flag", [](const StepSpec& s) { return std::string(s.flag); })
      .def_property_readonly("takes",
                             [](const StepSpec& s) {
                               switch (s.takes) {
                                 case StepTakes::kSwitch:
                                   return "switch";
                                 case StepTakes::kLevel:
                                   return "level";
                                 case StepTakes::kBytes:
                                   return "bytes";
                               }
                               return "";
                             })
      .def_property_readonly("max_level", [](const StepSpec& s) { return s.max_level; })
      .def_property_readonly("value", &harness::value_text)
      .def_property_readonly("kind",
                             [](const StepSpec& s) {
                               switch (s.kind) {
                                 case StepKind::kEngine:
                                   return "engine";
                                 case StepKind::kCheck:
                                   return "check";
                                 case StepKind::kBound:
                                   return "bound";
                               }
                               return "";
                             })
      .def_property_readonly("help", [](const StepSpec& s) { return std::string(s.help); })
      .def_property_readonly("example", [](const StepSpec& s) { return std::string(s.example); });
  m.def("step_table", &harness::step_table, py::return_value_policy::copy,
        "Every harness step, in the order their hooks run.");
  m.def("steps_markdown_table", &harness::steps_markdown_table);

  py::class_<ReloadSteps>(m, "ReloadSteps")
      .def(py::init<>())
      .def(
          "set",
          [](ReloadSteps& steps, const std::string& name, int64_t value) -> ReloadSteps& {
            return steps.set(name, value);
          },
          py::arg("name"), py::arg("value") = 1, py::return_value_policy::reference_internal)
      .def("get", &ReloadSteps::get, py::arg("name"))
      .def("has", &ReloadSteps::has, py::arg("name"))
      .def("any", &ReloadSteps::any)
      .def("values", &ReloadSteps::values)
      .def("__eq__", &ReloadSteps::operator==);
  m.def("check_steps", &harness::check_steps, py::arg("steps"));
  m.def("merge_steps", &harness::merge_steps, py::arg("a"), py::arg("b"));

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
             SubjectInfo info;
             info.name = std::move(name);
             info.description = std::move(description);
             info.modes = std::move(modes);
             info.negative_control = negative_control;
             info.expected_violation = std::move(expected_violation);
             info.memory_tolerance_bytes = memory_tolerance_bytes;
             info.steps = std::move(steps);
             return info;
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
      .def_readwrite("warm_up_under_trace", &SubjectInfo::warm_up_under_trace)
      .def_readwrite("free_names", &SubjectInfo::free_names)
      .def_readwrite("constant_output_allowed", &SubjectInfo::constant_output_allowed)
      .def_readwrite("constant_output_hint", &SubjectInfo::constant_output_hint);

  py::class_<SubjectLayer, PySubjectLayer>(m, "SubjectLayer")
      .def(py::init<>())
      .def("named_objects", &SubjectLayer::named_objects)
      .def("named_numbers", &SubjectLayer::named_numbers)
      .def("parameters", &SubjectLayer::parameters)
      .def("buffers", &SubjectLayer::buffers)
      .def("sleep_and_wake", &SubjectLayer::sleep_and_wake, py::arg("level"));

  py::class_<ReloadSubject, PySubject>(m, "ReloadSubject")
      .def(py::init<>())
      .def("cache_tensors", &ReloadSubject::cache_tensors)
      .def("empty_caches", &ReloadSubject::empty_caches)
      .def("restore_caches", &ReloadSubject::restore_caches);

  m.def(
      "layer_state",
      [](SubjectLayer& layer, std::vector<NamedTensor> caches,
         std::vector<std::string> free_names) {
        SubjectInfo info;
        info.free_names = std::move(free_names);
        return harness::layer_state(layer, std::move(caches), info);
      },
      py::arg("layer"), py::arg("caches"), py::arg("free_names"),
      "What `layer` holds, as the protocol assembles a layer's state (layer_life.h): its named "
      "tensors, then `caches`, then its host numbers, `free_names` left out.");

  // The one checkpoint generator (checkpoint_pools.h), which the Python
  // module's CheckpointDrawer draws with.
  py::class_<harness::CheckpointPools>(m, "CheckpointPools",
                                       "The pools of random values a set of checkpoint "
                                       "layouts draws from (conformance/harness/"
                                       "checkpoint_pools.h), drawn from fixed seeds.")
      .def(py::init<const Checkpoint&>(), py::arg("layouts"),
           "The pools for `layouts` (name -> meta tensor with the checkpoint layout).")
      .def("draw", &harness::CheckpointPools::draw, py::arg("seed"),
           "The checkpoint of `seed`: each a new tensor.")
      .def_property_readonly("nbytes", &harness::CheckpointPools::nbytes,
                             "The bytes the pools hold.");
  m.def("run_subject", &harness::run_subject, py::arg("subject"), py::arg("options"));
  m.def("cuda_unavailable_reason", &harness::cuda_unavailable_reason,
        "Empty when this extension can run the protocol on CUDA, else why not (built without "
        "CUDA, or no device visible).");
  m.def("to_json", &harness::to_json, py::arg("reports"), py::arg("options"));
  m.def("to_table", &harness::to_table, py::arg("reports"));
}

}  // namespace reloadsafe::python
