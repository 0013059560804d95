// object_tensors.h: the tensors an opaque (TorchBind) object holds.
//
// A kernel object handed to an op (fbgemm's packed linear weight, a oneDNN
// handle) hides the tensors its kernel reads. A trace asks the object for
// them so they are checked like any read: through a function registered for
// the object's class, else the class's `unpack()` method.
//
// How a TorchBind class reports is found once per class and thread, and again
// after any registration (Note [A class resolved once] in object_tensors.cc).
//
// Invariant: asking an object runs with the trace's key excluded (nothing it
// runs is recorded), never throws, and changes nothing in the object a
// well-behaved unpack() does not change.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <vector>

namespace reloadsafe::trace {

/// The tensors an opaque object of one class holds, for the trace to check
/// like any read. Must not run ops that matter (it runs with the trace off)
/// and must return the same tensors on every call.
using ObjectTensors = std::function<std::vector<at::Tensor>(const c10::IValue& object)>;

/// Registers `fn` for objects whose class is `class_name` (the qualified
/// name, e.g. "__torch__.torch.classes.quantized.LinearPackedParamsBase",
/// or the short form short_class_name gives). Thread-safe.
void register_object_tensors(const std::string& class_name, ObjectTensors fn);

/// "quantized.LinearPackedParamsBase": the class's qualified name with
/// TorchBind's "__torch__.torch.classes." prefix cut.
std::string short_class_name(const c10::ivalue::Object& object);

/// What an object reported: its tensors, and where they came from
/// ("tensors": a registered function; "unpack()": the class's method);
/// `source` is null when the object cannot report (no function, no
/// one-argument unpack(), or it threw).
struct ReportedTensors {
  std::vector<at::Tensor> tensors;
  const char* source = nullptr;
};

/// Asks the TorchBind script object `object` for its tensors.
ReportedTensors reported_tensors(const c10::IValue& object);

}  // namespace reloadsafe::trace
