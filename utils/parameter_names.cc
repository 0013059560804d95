#include "utils/parameter_names.h"

#include "utils/tensor_attrs.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace reloadsafe {

bool is_live(const at::Tensor& param) {
  return param.defined() && !attr_truthy(param, "retired") && param.numel() > 0;
}

at::Tensor get_live_param(const Layer& layer, const std::string& name) {
  TORCH_CHECK(layer.kind(name) != SlotKind::kSubmodule, "get_live_param: '", name,
              "' is a submodule, not a tensor");
  at::Tensor tensor = layer.get(name);
  if (is_parameter(tensor) && !is_live(tensor)) return at::Tensor();
  return tensor;
}

std::vector<std::pair<std::string, at::Tensor>> kernel_parameters(const Layer& layer) {
  // Python keeps two dicts; a vector keeps the insertion order a dict has,
  // and a map from object to the name it is listed under.
  std::unordered_map<const c10::TensorImpl*, std::string> listed_as;
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& [name, param] : layer.parameter_slots()) {
    if (!is_live(param)) continue;
    const c10::TensorImpl* id = param.unsafeGetTensorImpl();
    auto [it, first_time] = listed_as.emplace(id, name);
    if (first_time) {
      params.emplace_back(name, param);
      continue;
    }
    const std::optional<AttrValue> runtime = find_attr(param, "runtime_name");
    const auto* runtime_name = runtime ? std::get_if<std::string>(&*runtime) : nullptr;
    if (runtime_name != nullptr && *runtime_name == name) {
      const std::string first = it->second;
      params.erase(std::find_if(params.begin(), params.end(),
                                [&](const auto& p) { return p.first == first; }));
      params.emplace_back(name, param);
      it->second = name;
    }
  }
  return params;
}

void move_parameter(Layer& layer, const std::string& src_name, const std::string& dst_name) {
  TORCH_CHECK(layer.has(src_name), "move_parameter: the layer has no attribute '", src_name, "'");
  TORCH_CHECK(layer.kind(src_name) == SlotKind::kParameter, "move_parameter: '", src_name,
              "' is not a parameter of the layer");
  at::Tensor param = layer.get(src_name);
  TORCH_CHECK(param.defined(), "move_parameter: parameter '", src_name,
              "' is None; there is no object to register under '", dst_name, "'");
  if (layer.kind(dst_name) == SlotKind::kParameter) {
    at::Tensor existing = layer.get(dst_name);
    TORCH_CHECK(!existing.defined() || existing.is_same(param), "move_parameter: '", dst_name,
                "' is already registered as another parameter; retire or replace it first");
  }
  layer.register_param(dst_name, param);
  set_attr(param, "runtime_name", dst_name);
}

void retire_parameter(Layer& layer, const std::string& name) {
  TORCH_CHECK(layer.has(name), "retire_parameter: the layer has no attribute '", name, "'");
  // Decision: a submodule is refused. The reference sets `retired` on
  // whatever the name holds, a module included, where no utility ever reads
  // it (they read parameters); a call on a submodule is a caller's mistake
  // that the port reports instead of silently accepting.
  TORCH_CHECK(layer.kind(name) != SlotKind::kSubmodule, "retire_parameter: '", name,
              "' is a submodule; retire the parameters inside it (retire_parameter on the "
              "submodule's layer) instead");
  at::Tensor tensor = layer.get(name);
  TORCH_CHECK(tensor.defined(), "retire_parameter: '", name,
              "' holds None; there is nothing to retire");
  set_attr(tensor, "retired", true);
}

}  // namespace reloadsafe
