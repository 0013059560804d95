// layer_script: a sequence of utility calls on one layer, with what each
// returned and the layer, objects and storages at the end (golden/FORMAT.md).
#include "conformance/case_report.h"
#include "conformance/case_tensors.h"
#include "conformance/ops/operation.h"
#include "utils/copy_weight.h"
#include "utils/layer.h"
#include "utils/parameter_names.h"
#include "utils/reload_context.h"
#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace reloadsafe::conformance {
namespace {

// Names for the objects and storages a script reports: the case's own under
// their names, others "#1", "#2", ... in order of first report. Holds every
// object it has named, so no identity is reused while the case runs.
class Registry {
 public:
  void add_object(const at::Tensor& t, const std::string& name) {
    objects_.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, name));
  }
  void add_storage(const c10::Storage& s, const std::string& name) {
    storages_.emplace(s.unsafeGetStorageImpl(), std::make_pair(s, name));
  }
  OJson object(const at::Tensor& t) {
    if (!t.defined()) return nullptr;
    auto it = objects_.find(t.unsafeGetTensorImpl());
    if (it != objects_.end()) return it->second.second;
    const std::string name = "#" + std::to_string(next_++);
    add_object(t, name);
    return name;
  }
  OJson storage(const at::Tensor& t) const {
    auto it = storages_.find(t.storage().unsafeGetStorageImpl());
    return it == storages_.end() ? OJson("other") : OJson(it->second.second);
  }

 private:
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, std::string>> objects_;
  std::unordered_map<const c10::StorageImpl*, std::pair<c10::Storage, std::string>> storages_;
  int64_t next_ = 1;
};

// The fields a step can take besides "do" and "direct_reload".
enum class Field {
  kName,            // "name": a layer attribute name
  kSrc,             // "src": a layer attribute name
  kDst,             // "dst": a layer attribute name
  kTensor,          // "tensor": a case tensor's name, or null (None)
  kTensorRequired,  // "tensor": a case tensor's name
  kAttrs,           // "attrs": an attributes object, or null (None)
};

const char* key_of(Field f) {
  switch (f) {
    case Field::kName:
      return "name";
    case Field::kSrc:
      return "src";
    case Field::kDst:
      return "dst";
    case Field::kTensor:
    case Field::kTensorRequired:
      return "tensor";
    case Field::kAttrs:
      return "attrs";
  }
  return "";
}

// A step as read: its action and the fields that action takes.
struct Action;
struct Step {
  const Action* action = nullptr;
  std::string name;
  std::string src;
  std::string dst;
  at::Tensor tensor;             // undefined: None
  std::optional<AttrMap> attrs;  // nullopt: None
  bool direct_reload = false;
};

// What a step runs against.
struct Script {
  Layer& layer;
  Registry& registry;
};

// One action: its name in cases, the fields it takes (in the order they are
// read), and what it does. The result is the step's entry in `results`.
struct Action {
  const char* name;
  std::vector<Field> fields;
  OJson (*run)(Script& script, const Step& step);
};

// The actions of layer_script, in the order FORMAT.md lists them. Reading
// and running both go through this table, so they cannot disagree.
const std::vector<Action>& actions() {
  static const auto* table = new std::vector<Action>{
      {"set",
       {Field::kName, Field::kTensor},
       [](Script& s, const Step& step) -> OJson {
         s.layer.set(step.name, step.tensor);
         return nullptr;
       }},
      {"move_parameter",
       {Field::kSrc, Field::kDst},
       [](Script& s, const Step& step) -> OJson {
         move_parameter(s.layer, step.src, step.dst);
         return nullptr;
       }},
      {"retire_parameter",
       {Field::kName},
       [](Script& s, const Step& step) -> OJson {
         retire_parameter(s.layer, step.name);
         return nullptr;
       }},
      {"replace_parameter",
       {Field::kName, Field::kTensor},
       [](Script& s, const Step& step) -> OJson {
         replace_parameter(s.layer, step.name, step.tensor);
         return nullptr;
       }},
      {"set_kernel_parameter",
       {Field::kName, Field::kTensor},
       [](Script& s, const Step& step) -> OJson {
         set_kernel_parameter(s.layer, step.name, step.tensor);
         return nullptr;
       }},
      {"get_live_param",
       {Field::kName},
       [](Script& s, const Step& step) -> OJson {
         return s.registry.object(get_live_param(s.layer, step.name));
       }},
      {"kernel_parameters",
       {},
       [](Script& s, const Step&) -> OJson {
         OJson result = OJson::array();
         for (const auto& [name, param] : kernel_parameters(s.layer)) {
           result.push_back(OJson::array({name, s.registry.object(param)}));
         }
         return result;
       }},
      {"refill_derived",
       {Field::kName, Field::kTensor},
       [](Script& s, const Step& step) -> OJson {
         return s.registry.object(refill_derived(s.layer, step.name, step.tensor));
       }},
      {"set_weight_attrs",
       {Field::kName, Field::kAttrs},
       [](Script& s, const Step& step) -> OJson {
         // `set_weight_attrs(getattr(layer, name), attrs)`: what the name
         // holds, None included (then only None or {} succeed).
         TORCH_CHECK(s.layer.has(step.name), "set_weight_attrs: '", step.name, "' holds no tensor");
         set_weight_attrs(s.layer.get(step.name), step.attrs);
         return nullptr;
       }},
      {"load",
       {Field::kName, Field::kTensorRequired},
       [](Script& s, const Step& step) -> OJson {
         at::Tensor held = s.layer.get(step.name);
         TORCH_CHECK(held.defined(), "load: '", step.name, "' holds no tensor");
         copy_weight_(held, step.tensor);
         return nullptr;
       }},
  };
  return *table;
}

Step read_step(const Json& j, const std::string& what,
               const std::map<std::string, at::Tensor>& declared) {
  TORCH_CHECK(j.is_object(), what, " must be an object, not ", j.type_name());
  Step s;
  const std::string action = as_string(required(j, "do", what), what + ".do");
  const auto& table = actions();
  auto it =
      std::find_if(table.begin(), table.end(), [&](const Action& a) { return action == a.name; });
  TORCH_CHECK(it != table.end(), what, ": unknown action '", action, "'");
  s.action = &*it;
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const bool known = key == "do" || key == "direct_reload" ||
                       std::any_of(it->fields.begin(), it->fields.end(),
                                   [&](Field f) { return key == key_of(f); });
    TORCH_CHECK(known, what, ": action '", action, "' has no field '", key, "'");
  }
  for (Field f : it->fields) {
    const Json& v = required(j, key_of(f), what);
    const std::string where = what + "." + key_of(f);
    switch (f) {
      case Field::kName:
        s.name = as_string(v, where);
        break;
      case Field::kSrc:
        s.src = as_string(v, where);
        break;
      case Field::kDst:
        s.dst = as_string(v, where);
        break;
      case Field::kTensor:
      case Field::kTensorRequired: {
        if (v.is_null()) {
          TORCH_CHECK(f == Field::kTensor, where, ": ", action, " needs a tensor");
          break;
        }
        const std::string name = as_string(v, where);
        auto t = declared.find(name);
        TORCH_CHECK(t != declared.end(), where, ": no tensor is named '", name, "'");
        s.tensor = t->second;
        break;
      }
      case Field::kAttrs:
        if (!v.is_null()) s.attrs = as_attrs(v, where);
        break;
    }
  }
  s.direct_reload = opt_bool(j, "direct_reload", false);
  return s;
}

}  // namespace

void run_layer_script(const Json& c, OJson& out) {
  Layer layer;
  if (const Json* u = field(c, "uses_meta_device")) {
    layer.quant_method = QuantMethod{as_bool(*u, "uses_meta_device")};
  }
  const Json& tensor_list = required(c, "tensors", "the case");
  TORCH_CHECK(tensor_list.is_array(), "tensors must be an array, not ", tensor_list.type_name());
  const Json& step_list = required(c, "steps", "the case");
  TORCH_CHECK(step_list.is_array(), "steps must be an array, not ", step_list.type_name());

  // The case's tensors, in order; tensor k owns storage k (pattern k).
  std::vector<NamedObject> specs;
  for (size_t k = 0; k < tensor_list.size(); ++k) {
    specs.push_back(read_named_object(tensor_list[k], "tensors[" + std::to_string(k) + "]"));
  }
  std::vector<const TensorSpec*> planned;
  for (const NamedObject& spec : specs) planned.push_back(&spec.object.tensor);
  CaseTensors::plan(planned);

  CaseTensors tensors;
  Registry registry;
  std::map<std::string, at::Tensor> declared;
  std::vector<std::pair<std::string, WatchedStorage>> storages;
  for (size_t k = 0; k < specs.size(); ++k) {
    const std::string what = "tensors[" + std::to_string(k) + "]";
    const NamedObject& spec = specs[k];
    TORCH_CHECK(!spec.name.empty() && spec.name[0] != '#', what,
                ".name must be non-empty and not start with '#'");
    TORCH_CHECK(declared.count(spec.name) == 0, what, ": the name '", spec.name, "' is taken");
    at::Tensor data;
    if (const auto* view = std::get_if<ViewTensor>(&spec.object.tensor)) {
      auto base = declared.find(view->on);
      TORCH_CHECK(base != declared.end(), what, ".on: no earlier tensor is named '", view->on, "'");
      data = CaseTensors::view_on(*view, base->second.storage(), what);
    } else {
      data = tensors.own(spec.object.tensor, static_cast<int64_t>(k), what);
      storages.emplace_back(spec.name, WatchedStorage(data.storage()));
      registry.add_storage(data.storage(), spec.name);
    }
    const at::Tensor obj = make_object(data, spec.object, ObjectKind::kTensor);
    declared[spec.name] = obj;
    registry.add_object(obj, spec.name);
  }
  std::vector<Step> steps;
  for (size_t i = 0; i < step_list.size(); ++i) {
    steps.push_back(read_step(step_list[i], "steps[" + std::to_string(i) + "]", declared));
  }

  Script script{layer, registry};
  OJson results = OJson::array();
  for (const Step& step : steps) {
    OJson result = nullptr;
    try {
      DirectReloadScope scope(step.direct_reload);
      result = step.action->run(script, step);
    } catch (const std::exception& e) {
      result = OJson::object();
      result["error"] = error_message(e);
    }
    results.push_back(result);
  }

  OJson report = OJson::object();
  auto describe = [&](const std::string& name) -> OJson {
    const at::Tensor t = layer.get(name);
    if (!t.defined()) return nullptr;
    OJson d;
    d["object"] = registry.object(t);
    d["kind"] = kind_name(t);
    d["live"] = get_live_param(layer, name).defined();
    put_layout(d, t);
    d["storage"] = registry.storage(t);
    d["attrs"] = attrs_json(t);
    return d;
  };
  for (const auto& slot : layer.parameter_slots()) report[slot.first] = describe(slot.first);
  for (const std::string& name : layer.attribute_names()) report[name] = describe(name);
  OJson storage_report = OJson::object();
  for (const auto& [name, watched] : storages) storage_report[name] = storage_json(watched);

  out["results"] = results;
  out["layer"] = report;
  out["storages"] = storage_report;
}

}  // namespace reloadsafe::conformance
