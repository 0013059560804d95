#include "utils/replace_parameter.h"

#include "utils/dense_copy.h"
#include "utils/reload_context.h"
#include "utils/storage_fit.h"
#include "utils/tensor_attrs.h"

#include <c10/util/Exception.h>

#include <optional>

namespace reloadsafe {
namespace {

// Attributes that belong to the parameter, never to the tensor replacing it:
// the loader (and BasevLLMParameter's backing field for it), and the
// checkpoint record kept for direct reloads.
bool stays_with_parameter(const std::string& key) {
  return key == "weight_loader" || key == "_weight_loader" || key == "_ckpt";
}

void apply_attrs(const at::Tensor& target, const AttrMap& carried) {
  for (const auto& [key, value] : carried) set_attr(target, key, value);
}

// `param.data = data`: the object stays, its data and layout become `data`'s.
void rebind_data(at::Tensor& param, const at::Tensor& data) {
  TORCH_CHECK(param.is_meta() == data.is_meta(), "replace_parameter: cannot rebind a ",
              param.device(), " parameter to a ", data.device(),
              " tensor (LibTorch's set_data refuses meta <-> real); give the new tensor the "
              "parameter's device");
  if (param.is_same(data)) return;
  param.set_data(data);
}

}  // namespace

void replace_parameter(Layer& layer, const std::string& param_name, const at::Tensor& new_tensor) {
  TORCH_CHECK(layer.kind(param_name) != SlotKind::kBuffer, "replace_parameter: '", param_name,
              "' is a buffer; replace_parameter replaces parameters");
  if (!new_tensor.defined()) {
    layer.set(param_name, at::Tensor());
    return;
  }
  at::Tensor old_param = layer.get(param_name);
  const bool old_is_param = layer.kind(param_name) == SlotKind::kParameter && old_param.defined();

  AttrMap carried = attrs(new_tensor);
  for (auto it = carried.begin(); it != carried.end();) {
    it = stays_with_parameter(it->first) ? carried.erase(it) : std::next(it);
  }
  // `new_tensor.data` for a parameter: the same data, a new object.
  const at::Tensor data = is_parameter(new_tensor) ? new_tensor.detach() : new_tensor;

  const bool keep_object = old_is_param && !attr_truthy(old_param, "requantization_source") &&
                           !(old_param.is_meta() && !data.is_meta());
  if (keep_object) {
    if (old_param.sizes() == data.sizes() && old_param.strides() == data.strides() &&
        old_param.dtype() == data.dtype() && old_param.device() == data.device()) {
      // `old_param.data.copy_(data)`; dense CPU bytes at the copy limit.
      if (!try_dense_copy(old_param, data)) old_param.detach().copy_(data);
    } else if (layer.quant_method.has_value() && layer.quant_method->uses_meta_device) {
      rebind_data(old_param, data);  // online quantization frees the source
    } else {
      rebind_data(old_param, in_own_storage(old_param, data, direct_reload_enabled()));
    }
    apply_attrs(old_param, carried);
    return;
  }

  at::Tensor new_param = make_parameter(data);
  apply_attrs(new_param, carried);
  if (old_param.defined()) {
    // `hasattr(old_param, "weight_loader")` in the reference is also true on
    // vLLM's parameter classes, whose `weight_loader` property reads the
    // `_weight_loader` field: for a parameter either one is inherited, as
    // `weight_loader`. A plain tensor has no such property.
    std::optional<AttrValue> loader = find_attr(old_param, "weight_loader");
    if (!loader && is_parameter(old_param)) loader = find_attr(old_param, "_weight_loader");
    if (loader) set_weight_attrs(new_param, AttrMap{{"weight_loader", *loader}});
  }
  layer.set(param_name, new_param);
}

void set_kernel_parameter(Layer& layer, const std::string& name, const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "set_kernel_parameter: the tensor for '", name,
              "' is None; kernels need a tensor (use replace_parameter to set None)");
  replace_parameter(layer, name, tensor);
  at::Tensor param = layer.get(name);
  erase_attr(param, "retired");
  if (has_attr(param, "runtime_name")) set_attr(param, "runtime_name", name);
}

namespace {

// A derived tensor that spans all of a storage a parameter or buffer of
// `obj` (or of a module under it) also lives on is an alias of that weight:
// refilling it would write over the weight (a copy-back through an alias).
void refuse_weight_alias(Layer& obj, const std::string& name, const at::Tensor& held) {
  const c10::StorageImpl* storage = held.storage().unsafeGetStorageImpl();
  auto check = [&](const std::string& kind, const std::string& weight, const at::Tensor& t) {
    TORCH_CHECK(!(t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == storage),
                "refill_derived: the tensor held under '", name, "' shares its storage with ", kind,
                " '", weight,
                "'; refilling it would overwrite that weight. Hold a tensor of its "
                "own (e.g. .clone()) under derived names, or update the ",
                kind, " itself");
  };
  for (const auto& p : obj.named_parameters(/*recurse=*/true))
    check("parameter", p.key(), p.value());
  for (const auto& b : obj.named_buffers(/*recurse=*/true)) check("buffer", b.key(), b.value());
}

}  // namespace

at::Tensor refill_derived(Layer& obj, const std::string& name, const at::Tensor& new_tensor) {
  const SlotKind kind = obj.kind(name);
  TORCH_CHECK(kind != SlotKind::kParameter && kind != SlotKind::kBuffer, "refill_derived: '", name,
              "' is a ", kind == SlotKind::kParameter ? "parameter" : "buffer",
              "; derived tensors are plain attributes (use replace_parameter for parameters)");
  at::Tensor old = obj.get(name);
  if (old.defined() && new_tensor.defined() && old.sizes() == new_tensor.sizes() &&
      old.dtype() == new_tensor.dtype() && old.device() == new_tensor.device()) {
    // A held tensor with no elements is accepted whatever its storage: the
    // copy writes nothing, as in the reference.
    const auto span_bytes = extent(old) * static_cast<int64_t>(old.element_size());
    TORCH_CHECK(old.numel() == 0 || (old.storage_offset() == 0 &&
                                     span_bytes == static_cast<int64_t>(old.storage().nbytes()) &&
                                     extent(old) >= old.numel()),
                "refill_derived: the tensor held under '", name,
                "' does not own its storage (it is a view at offset ", old.storage_offset(),
                " spanning ", span_bytes, " of ", old.storage().nbytes(),
                " bytes); refilling it would overwrite other data. Hold a tensor of its own "
                "(e.g. .clone()) under derived names");
    if (old.numel() > 0) refuse_weight_alias(obj, name, old);
    dense_copy_(old, new_tensor);
    return old;
  }
  obj.set(name, new_tensor);
  return new_tensor;
}

}  // namespace reloadsafe
