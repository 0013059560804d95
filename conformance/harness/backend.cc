#include "conformance/harness/backend.h"

#include "utils/copy_weight.h"
#include "utils/storage_fit.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace reloadsafe::harness {

at::Tensor make_checkpoint_param(std::vector<int64_t> shape, at::ScalarType dtype,
                                 const c10::Device& device) {
  at::Tensor param =
      make_parameter(at::zeros(shape, at::TensorOptions().dtype(dtype).device(device)));
  set_attr(param, "_ckpt", at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kMeta)));
  set_attr(param, "weight_loader", WeightLoader{"default", default_weight_loader});
  return param;
}

void default_weight_loader(at::Tensor& param, const at::Tensor& loaded) {
  const std::optional<AttrValue> record = find_attr(param, "_ckpt");
  TORCH_CHECK(record.has_value() && std::holds_alternative<at::Tensor>(*record),
              "default_weight_loader: the parameter has no _ckpt record; create it with "
              "make_checkpoint_param()");
  const at::Tensor& ckpt = std::get<at::Tensor>(*record);
  const bool in_layout = param.sizes() == ckpt.sizes() && param.strides() == ckpt.strides() &&
                         param.scalar_type() == ckpt.scalar_type() && param.storage_offset() == 0;
  if (!in_layout) {
    const int64_t need = extent(ckpt) * static_cast<int64_t>(ckpt.element_size());
    // A meta parameter takes a meta checkpoint (a shape-only run, such as
    // the device-clean probe); real data it cannot take by rebinding.
    TORCH_CHECK(!param.is_meta() || loaded.is_meta(),
                "default_weight_loader: the parameter is on the meta device and "
                "LibTorch cannot rebind it to real data; materialise it in the "
                "backend's own loader");
    if (param.storage().nbytes() >= static_cast<size_t>(need)) {
      // Back into checkpoint layout on the storage it has: same address.
      param.set_data(
          storage_view(param.storage(), 0, ckpt.sizes(), ckpt.strides(), ckpt.scalar_type()));
    } else {
      // Post-processing released or shrank this storage (an emptied weight,
      // an online-quantization source): the checkpoint needs a new one.
      param.set_data(at::empty_strided(ckpt.sizes(), ckpt.strides(),
                                       param.options().dtype(ckpt.scalar_type())));
    }
  }
  at::Tensor target = param.detach();
  copy_weight_(target, loaded);
}

BackendRegistry& BackendRegistry::instance() {
  static auto* registry = new BackendRegistry();
  return *registry;
}

bool BackendRegistry::add(Factory factory) {
  factories_.push_back(std::move(factory));
  return true;
}

std::vector<std::unique_ptr<Backend>> BackendRegistry::create_all() const {
  std::vector<std::unique_ptr<Backend>> all;
  for (const auto& f : factories_) all.push_back(f());
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->name() < b->name(); });
  return all;
}

}  // namespace reloadsafe::harness
