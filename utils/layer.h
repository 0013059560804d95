// layer.h: a torch::nn::Module with the parts of a Python nn.Module that the
// reload utilities rely on and LibTorch's Module lacks.
//
// Python post-processing addresses everything on a layer by name:
// `getattr(layer, "weight")` finds a registered parameter (or None), a buffer,
// a submodule or a plain attribute; `setattr` rebinds it; several names may
// hold the same parameter object. LibTorch's Module keeps parameters, buffers
// and submodules, but no plain attributes and no quant method. `Layer` adds
// those and implements Python's getattr/setattr rules on top of the Module's
// own tables, so a backend's module is an ordinary torch::nn::Module
// (`parameters()`, `named_modules()`, serialization and `to()` all work) that
// derives from `reloadsafe::Layer` instead of from `torch::nn::Module`.
//
// Model (see tensor_attrs.h for attributes on tensors):
//  - A parameter object is a TensorImpl. A parameter slot holds one, or None
//    (an undefined tensor, which Module::parameters() already skips). Two
//    slots alias when they hold the same TensorImpl.
//  - A name is in at most one table: parameters, buffers, submodules, plain
//    attributes. setattr moves it between tables the way Python does.
//  - Buffers cannot be rebound or removed through LibTorch's Module API, so
//    the utilities refuse to replace a buffer (Python would allow it).
//
// Invariant: no method of Layer touches tensor data or storage; they only
// rebind names.
//
// Usage:
//   struct MyLinear : reloadsafe::Layer {
//     MyLinear() { register_param("weight", reloadsafe::make_parameter(at::empty({8, 8}))); }
//   };
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace reloadsafe {

/// The flags of a layer's quant method that the utilities read.
struct QuantMethod {
  /// Online quantization: weights are created on the meta device and the
  /// loaded source is released after conversion.
  bool uses_meta_device = false;
};

/// One entry of an MoE expert mapping:
/// (param_name, weight_name, expert_id, shard_id).
using ExpertMappingEntry = std::tuple<std::string, std::string, int64_t, std::string>;
using ExpertMapping = std::vector<ExpertMappingEntry>;

/// Where `getattr(layer, name)` finds `name`.
enum class SlotKind { kAbsent, kParameter, kBuffer, kSubmodule, kAttribute };

class Layer : public torch::nn::Module {
 public:
  explicit Layer(std::string name = "Layer");

  /// Which table holds `name`, if any.
  SlotKind kind(const std::string& name) const;

  /// `hasattr(layer, name)` for names the utilities use (a slot holding None
  /// counts).
  bool has(const std::string& name) const { return kind(name) != SlotKind::kAbsent; }

  /// `getattr(layer, name, None)` for tensors: the parameter, buffer or plain
  /// attribute under `name`; an undefined tensor for None, for an absent name
  /// and for a submodule. Reads only: it changes nothing, not even the
  /// attribute table.
  at::Tensor get(const std::string& name) const;

  /// `setattr(layer, name, value)`, by Python's nn.Module rules:
  ///  - a parameter object (is_parameter) is registered under `name`, which
  ///    leaves the attribute and submodule tables;
  ///  - None (undefined) empties a parameter slot, or else becomes a plain
  ///    attribute holding None (a submodule of that name is unregistered);
  ///  - any other tensor becomes a plain attribute; it may not replace a
  ///    registered parameter (TypeError in Python).
  /// Rebinding a buffer throws (see the model above).
  void set(const std::string& name, const at::Tensor& value);

  /// `register_parameter(name, param)`: `param` (marked as a parameter) or
  /// None under `name`. Throws if `name` is empty, contains '.', or is used
  /// by a buffer, submodule or plain attribute. Re-registering a parameter
  /// name rebinds it.
  void register_param(const std::string& name, const at::Tensor& param);

  /// LibTorch's `Module::register_parameter`, hidden so that a parameter a
  /// backend registers through LibTorch's own API (in the constructor of a
  /// class derived from Layer) is marked as a parameter when it is
  /// registered. Same arguments, result and errors as the Module's. (Called
  /// through a `torch::nn::Module&`, the Module's own method runs and the
  /// tensor is not marked: register parameters on the Layer.)
  at::Tensor& register_parameter(std::string name, at::Tensor tensor, bool requires_grad = true);

  /// Every parameter slot in registration order, None included, aliases
  /// listed under each of their names (`layer._parameters.items()`).
  std::vector<std::pair<std::string, at::Tensor>> parameter_slots() const;

  /// Sets a plain tensor attribute (not a parameter, not a buffer). Same as
  /// set() for a non-parameter tensor.
  void set_attribute(const std::string& name, const at::Tensor& value) { set(name, value); }

  /// Names of the plain tensor attributes, sorted.
  std::vector<std::string> attribute_names() const;

  /// The layer's quant method, if it has one.
  std::optional<QuantMethod> quant_method;

  /// The layer's `get_expert_mapping` method, if it has one (empty function:
  /// it has none).
  std::function<ExpertMapping()> get_expert_mapping;

 private:
  bool is_buffer(const std::string& name) const;
  bool is_submodule(const std::string& name) const;

  std::map<std::string, at::Tensor> attributes_;
};

/// `get_moe_expert_mapping(model)`: the mapping returned by the first module
/// of `model` (in `named_modules()` order, `model` itself first) that is a
/// Layer with a `get_expert_mapping` method. Throws if there is none.
/// Addresses: reads module names only; no tensor is touched.
ExpertMapping get_moe_expert_mapping(torch::nn::Module& model);

}  // namespace reloadsafe
