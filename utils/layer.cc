#include "utils/layer.h"

#include "utils/tensor_attrs.h"

#include <c10/util/Exception.h>

namespace reloadsafe {

Layer::Layer(std::string name) : torch::nn::Module(std::move(name)) {}

bool Layer::is_buffer(const std::string& name) const {
  return named_buffers(/*recurse=*/false).contains(name);
}

bool Layer::is_submodule(const std::string& name) const {
  return named_children().contains(name);
}

SlotKind Layer::kind(const std::string& name) const {
  if (attributes_.count(name) != 0) return SlotKind::kAttribute;
  if (parameters_.contains(name)) return SlotKind::kParameter;
  if (is_buffer(name)) return SlotKind::kBuffer;
  if (is_submodule(name)) return SlotKind::kSubmodule;
  return SlotKind::kAbsent;
}

at::Tensor Layer::get(const std::string& name) const {
  auto it = attributes_.find(name);
  if (it != attributes_.end()) return it->second;
  if (const at::Tensor* p = parameters_.find(name)) return *p;
  auto buffers = named_buffers(/*recurse=*/false);
  if (const at::Tensor* b = buffers.find(name)) return *b;
  return at::Tensor();
}

void Layer::register_param(const std::string& name, const at::Tensor& param) {
  TORCH_CHECK(!name.empty(), "register_param: the parameter name is empty");
  TORCH_CHECK(name.find('.') == std::string::npos, "register_param: parameter name '", name,
              "' contains '.'; use a plain name");
  const SlotKind k = kind(name);
  TORCH_CHECK(k == SlotKind::kAbsent || k == SlotKind::kParameter, "register_param: '", name,
              "' is already used by a ",
              k == SlotKind::kBuffer      ? "buffer"
              : k == SlotKind::kSubmodule ? "submodule"
                                          : "plain attribute",
              " of the layer; a parameter cannot take its name");
  if (param.defined()) mark_parameter(param);
  if (at::Tensor* slot = parameters_.find(name)) {
    *slot = param;
  } else {
    parameters_.insert(name, param);
  }
}

at::Tensor& Layer::register_parameter(std::string name, at::Tensor tensor, bool requires_grad) {
  at::Tensor& registered =
      torch::nn::Module::register_parameter(std::move(name), std::move(tensor), requires_grad);
  if (registered.defined()) mark_parameter(registered);
  return registered;
}

void Layer::set(const std::string& name, const at::Tensor& value) {
  if (value.defined() && is_parameter(value)) {
    attributes_.erase(name);
    TORCH_CHECK(!is_buffer(name), "cannot set parameter '", name,
                "': it is a buffer, and LibTorch's Module cannot unregister buffers");
    if (is_submodule(name)) unregister_module(name);
    register_param(name, value);
    return;
  }
  if (at::Tensor* slot = parameters_.find(name)) {
    TORCH_CHECK(!value.defined(), "cannot assign a plain tensor to parameter '", name,
                "' (a parameter or None is expected); wrap it with make_parameter() or use "
                "replace_parameter()");
    *slot = at::Tensor();
    return;
  }
  TORCH_CHECK(!is_buffer(name), "cannot rebind buffer '", name,
              "': LibTorch's Module has no way to rebind a buffer; copy into it instead");
  if (is_submodule(name)) {
    TORCH_CHECK(!value.defined(), "cannot assign a tensor to submodule '", name,
                "' (a module or None is expected)");
    unregister_module(name);
  }
  attributes_[name] = value;
}

std::vector<std::pair<std::string, at::Tensor>> Layer::parameter_slots() const {
  std::vector<std::pair<std::string, at::Tensor>> slots;
  slots.reserve(parameters_.size());
  for (const auto& item : parameters_) {
    slots.emplace_back(item.key(), item.value());
  }
  return slots;
}

std::vector<std::string> Layer::attribute_names() const {
  std::vector<std::string> names;
  names.reserve(attributes_.size());
  for (const auto& [name, value] : attributes_) names.push_back(name);
  return names;
}

ExpertMapping get_moe_expert_mapping(torch::nn::Module& model) {
  // named_modules() with include_self needs the model in a shared_ptr; ask
  // the model itself first so a stack-allocated model works too.
  auto* self = dynamic_cast<Layer*>(&model);
  if (self != nullptr && self->get_expert_mapping) return self->get_expert_mapping();
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    auto layer = std::dynamic_pointer_cast<Layer>(item.value());
    if (layer && layer->get_expert_mapping) return layer->get_expert_mapping();
  }
  TORCH_CHECK(false,
              "get_moe_expert_mapping: no module in the model has a get_expert_mapping "
              "method; set Layer::get_expert_mapping on the MoE layer (or the model)");
}

}  // namespace reloadsafe
