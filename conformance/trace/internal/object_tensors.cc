#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/object_tensors.h"

#include "conformance/trace/trace_key.h"

#include <ATen/core/class_type.h>
#include <ATen/core/function.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace reloadsafe::trace {
namespace {

struct ObjectTensorRegistry {
  std::mutex mutex;
  std::unordered_map<std::string, ObjectTensors> by_class;
};

ObjectTensorRegistry& object_tensor_registry() {
  static auto* registry = new ObjectTensorRegistry();  // never freed: used from static destructors
  return *registry;
}

}  // namespace

void register_object_tensors(const std::string& class_name, ObjectTensors fn) {
  TORCH_CHECK(!class_name.empty() && fn,
              "register_object_tensors: give a class name and a function");
  ObjectTensorRegistry& registry = object_tensor_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.by_class[class_name] = std::move(fn);
}

std::string short_class_name(const c10::ivalue::Object& obj) {
  std::string name = obj.type()->name() ? obj.type()->name()->qualifiedName() : obj.type()->str();
  constexpr const char* kPrefix = "__torch__.torch.classes.";
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(std::strlen(kPrefix));
  return name;
}

ReportedTensors reported_tensors(const c10::IValue& object) {
  ReportedTensors out;
  try {
    c10::impl::ExcludeDispatchKeyGuard off(kTraceKey);
    const c10::ivalue::Object& obj = object.toObjectRef();
    ObjectTensors fn;
    {
      ObjectTensorRegistry& registry = object_tensor_registry();
      std::lock_guard<std::mutex> lock(registry.mutex);
      for (const std::string& key : {obj.type()->str(), short_class_name(obj)}) {
        auto it = registry.by_class.find(key);
        if (it != registry.by_class.end()) fn = it->second;
      }
    }
    if (fn) return {fn(object), "tensors"};
    torch::jit::Function* unpack = obj.type()->findMethod("unpack");
    if (unpack == nullptr || unpack->getSchema().arguments().size() != 1) return out;
    torch::jit::Stack stack{object};
    unpack->run(stack);
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
