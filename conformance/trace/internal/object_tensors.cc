#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/object_tensors.h"

#include "conformance/trace/trace_key.h"

#include <ATen/core/class_type.h>
#include <ATen/core/function.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace reloadsafe::trace {
namespace {

struct ObjectTensorRegistry {
  std::mutex mutex;
  std::unordered_map<std::string, ObjectTensors> by_class;
  // Raised by every registration: a class resolved before it is resolved
  // again (Note [A class resolved once]).
  std::atomic<uint64_t> version{0};
};

ObjectTensorRegistry& object_tensor_registry() {
  static auto* registry = new ObjectTensorRegistry();  // never freed: used from static destructors
  return *registry;
}

constexpr std::string_view kTorchBindPrefix = "__torch__.torch.classes.";

// How objects of one class report their tensors: a registered function, else
// the class's one-argument unpack(), else not at all (both empty).
// Copied per call: the function is shared, not copied.
struct ClassReport {
  std::shared_ptr<const ObjectTensors> fn;
  torch::jit::Function* unpack = nullptr;
};

std::string short_name_of(const c10::ClassType& type) {
  std::string name = type.name() ? type.name()->qualifiedName() : type.str();
  if (name.rfind(kTorchBindPrefix, 0) == 0) name = name.substr(kTorchBindPrefix.size());
  return name;
}

ClassReport resolve(const c10::ClassType& type) {
  ClassReport report;
  {
    ObjectTensorRegistry& registry = object_tensor_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    // The short name's function wins where both are registered.
    for (const std::string& key : {type.str(), short_name_of(type)}) {
      auto it = registry.by_class.find(key);
      if (it != registry.by_class.end())
        report.fn = std::make_shared<const ObjectTensors>(it->second);
    }
  }
  if (report.fn) return report;
  torch::jit::Function* unpack = type.findMethod("unpack");
  if (unpack != nullptr && unpack->getSchema().arguments().size() == 1) report.unpack = unpack;
  return report;
}

// Note [A class resolved once]
// A trace asks a kernel object for its tensors at every call that hands it
// over, twice (read_trace.cc: a record's rule). Finding how its class
// reports each time (the registry under its lock, the class's names built
// as strings, its method looked up) was, with the record of the call, about
// a fifth of the time a retrace added to a forward of small ops
// (harness_bench's BM_Forward, a TorchBind kernel handed to a custom op).
// How a TorchBind class reports is therefore found once per class and
// thread, and found again after any registration. Only TorchBind classes
// are kept: their types and methods live for the process, while a
// TorchScript class's methods belong to a compilation unit that may go
// away; those are resolved at every call.
struct CachedClass {
  c10::ClassTypePtr type;  // held: the entry stays this class's
  uint64_t version = 0;
  ClassReport report;
};

ClassReport class_report(const c10::ivalue::Object& obj) {
  c10::ClassTypePtr type = obj.type();
  const uint64_t version = object_tensor_registry().version.load(std::memory_order_acquire);
  thread_local std::vector<CachedClass> cache;
  for (CachedClass& c : cache) {
    if (c.type != type) continue;
    if (c.version != version) {
      c.report = resolve(*type);
      c.version = version;
    }
    return c.report;
  }
  ClassReport report = resolve(*type);
  constexpr size_t kCachedClasses = 16;  // a forward hands a few kernel classes
  if (type->str().rfind(kTorchBindPrefix, 0) == 0 && cache.size() < kCachedClasses) {
    cache.push_back(CachedClass{std::move(type), version, report});
  }
  return report;
}

}  // namespace

void register_object_tensors(const std::string& class_name, ObjectTensors fn) {
  TORCH_CHECK(!class_name.empty() && fn,
              "register_object_tensors: give a class name and a function");
  ObjectTensorRegistry& registry = object_tensor_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.by_class[class_name] = std::move(fn);
  registry.version.fetch_add(1, std::memory_order_release);
}

std::string short_class_name(const c10::ivalue::Object& obj) {
  return short_name_of(*obj.type());
}

ReportedTensors reported_tensors(const c10::IValue& object) {
  ReportedTensors out;
  try {
    c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
    const ClassReport report = class_report(object.toObjectRef());
    if (report.fn) return {(*report.fn)(object), "tensors"};
    if (report.unpack == nullptr) return out;
    torch::jit::Stack stack{object};
    report.unpack->run(stack);
    std::function<void(const c10::IValue&)> collect = [&](const c10::IValue& v) {
      if (v.isTensor()) {
        out.tensors.push_back(v.toTensor());
      } else if (v.isTuple()) {
        for (const c10::IValue& e : v.toTupleRef().elements()) collect(e);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) out.tensors.push_back(t);
      }
    };
    for (const c10::IValue& v : stack) collect(v);
    out.source = "unpack()";
    return out;
  } catch (const std::exception&) {
    return {};  // an object that cannot report reports nothing
  }
}

}  // namespace reloadsafe::trace
