#include "conformance/harness/harness.h"

#include "conformance/harness/checkpoint_pools.h"

#include "utils/parameter_names.h"
#include "utils/reload_context.h"
#include "utils/tensor_attrs.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>

#include <optional>
#include <utility>

namespace reloadsafe::harness {
namespace {

// The checkpoint layouts of a layer `backend` has just created: every
// parameter slot carrying a `_ckpt` record (a meta tensor with the checkpoint
// layout); a layer without any is refused. Post-processing may replace those
// objects, so this is read once, up front.
Checkpoint checkpoint_layouts(const Backend& backend, const Layer& layer) {
  Checkpoint layouts;
  for (const auto& [name, param] : layer.parameter_slots()) {
    const std::optional<AttrValue> record = find_attr(param, "_ckpt");
    if (record.has_value() && std::holds_alternative<at::Tensor>(*record)) {
      layouts.emplace(name, std::get<at::Tensor>(*record));
    }
  }
  TORCH_CHECK(!layouts.empty(), "backend '", backend.name(),
              "' created no checkpoint parameter (use make_checkpoint_param or set _ckpt)");
  return layouts;
}

void load(Layer& layer, const Checkpoint& ckpt) {
  for (const auto& [name, tensor] : ckpt) {
    at::Tensor param = layer.get(name);
    TORCH_CHECK(param.defined(), "checkpoint parameter '", name, "' is None after post-processing");
    const std::optional<AttrValue> loader = find_attr(param, "weight_loader");
    TORCH_CHECK(loader.has_value() && std::holds_alternative<WeightLoader>(*loader) &&
                    std::get<WeightLoader>(*loader).fn,
                "checkpoint parameter '", name, "' lost its weight_loader");
    std::get<WeightLoader>(*loader).fn(param, tensor);
  }
}

}  // namespace

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device, uint64_t seed)
    : ReloadSession(backend, device, nullptr, std::nullopt, seed) {}

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device,
                             const Checkpoint& ckpt)
    : ReloadSession(backend, device, nullptr, ckpt, 0) {}

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device,
                             std::shared_ptr<Layer> fresh, const Checkpoint& ckpt)
    : ReloadSession(backend, device, std::move(fresh), ckpt, 0) {}

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device,
                             std::shared_ptr<Layer> fresh, const std::optional<Checkpoint>& ckpt,
                             uint64_t seed)
    : backend_(backend), device_(device) {
  layer_ = fresh != nullptr ? std::move(fresh) : backend_.create_layer(device_);
  layouts_ = checkpoint_layouts(backend_, *layer_);
  load(*layer_, ckpt ? *ckpt : pools().draw(seed));
  backend_.process_weights_after_loading(*layer_);
}

const CheckpointPools& ReloadSession::pools() const {
  if (!pools_) pools_.emplace(layouts_);
  return *pools_;
}

Checkpoint ReloadSession::draw_checkpoint(uint64_t seed) const {
  return pools().draw(seed);
}

void ReloadSession::reload(ReloadMode mode, const Checkpoint& ckpt) {
  DirectReloadScope direct(mode == ReloadMode::kDirect);
  load_and_process(ckpt);
}

void ReloadSession::load_and_process(const Checkpoint& ckpt) {
  load(*layer_, ckpt);
  backend_.process_weights_after_loading(*layer_);
}

std::vector<std::pair<std::string, at::Tensor>> ReloadSession::kernel_visible() const {
  return harness::kernel_visible(backend_, *layer_);
}

std::vector<std::pair<std::string, at::Tensor>> kernel_visible(const Backend& backend,
                                                               Layer& layer) {
  auto tensors = kernel_parameters(layer);
  for (const auto& name : backend.derived_names()) {
    at::Tensor t = layer.get(name);
    if (t.defined()) tensors.emplace_back(name, t);
  }
  for (const NamedTensor& held : backend.held_tensors(layer)) {
    if (held.declared && held.tensor.defined()) tensors.emplace_back(held.name, held.tensor);
  }
  return tensors;
}

std::vector<NamedTensor> ReloadSession::named_tensors() const {
  return backend_named_tensors(backend_, *layer_);
}

std::vector<NamedTensor> backend_named_tensors(const Backend& backend, Layer& layer) {
  std::vector<NamedTensor> named;
  for (const auto& [name, t] : kernel_visible(backend, layer)) {
    named.push_back({name, t, /*declared=*/true});
  }
  for (const auto& [name, t] : layer.parameter_slots()) {
    if (t.defined()) named.push_back({name, t, false});
  }
  for (const auto& name : layer.attribute_names()) {
    at::Tensor t = layer.get(name);
    if (t.defined()) named.push_back({name, t, false});
  }
  for (const auto& item : layer.named_buffers(/*recurse=*/true)) {
    named.push_back({item.key(), item.value(), false});
  }
  for (const NamedTensor& held : backend.held_tensors(layer)) {
    if (!held.declared && held.tensor.defined()) named.push_back(held);
  }
  return named;
}

at::Tensor ReloadSession::cold_forward(const Checkpoint& ckpt, const at::Tensor& x) const {
  auto fresh = backend_.create_layer(device_);
  load(*fresh, ckpt);
  backend_.process_weights_after_loading(*fresh);
  return backend_.forward(*fresh, x);
}

namespace {

// A layer of a Backend as a SubjectLayer.
class BackendLayer : public SubjectLayer {
 public:
  BackendLayer(const Backend& backend, std::shared_ptr<Layer> layer)
      : backend_(backend), layer_(std::move(layer)) {}

  void load(const Checkpoint& ckpt) override { harness::load(*layer_, ckpt); }
  void process() override { backend_.process_weights_after_loading(*layer_); }
  at::Tensor forward(const at::Tensor& x) override { return backend_.forward(*layer_, x); }
  std::vector<NamedTensor> named_tensors() override {
    return backend_named_tensors(backend_, *layer_);
  }
  std::vector<NamedObject> named_objects() override { return backend_.held_objects(*layer_); }
  /// Backend::host_numbers.
  std::vector<NamedNumber> named_numbers() override { return backend_.host_numbers(*layer_); }
  /// The layer's registered parameters and buffers (torch::nn::Module's).
  std::vector<at::Tensor> parameters() override { return layer_->parameters(/*recurse=*/true); }
  std::vector<at::Tensor> buffers() override { return layer_->buffers(/*recurse=*/true); }
  /// Backend::sleep_and_wake.
  bool sleep_and_wake(int level) override { return backend_.sleep_and_wake(*layer_, level); }

 private:
  const Backend& backend_;
  std::shared_ptr<Layer> layer_;
};

}  // namespace

BackendSubject::BackendSubject(const Backend& backend, const c10::Device& device)
    : backend_(backend), device_(device) {}

SubjectInfo BackendSubject::info() const {
  SubjectInfo info;
  info.name = backend_.name();
  info.description = backend_.description();
  info.modes = backend_.modes();
  info.negative_control = backend_.negative_control();
  info.expected_violation = backend_.expected_violation();
  info.memory_tolerance_bytes = backend_.memory_tolerance_bytes();
  info.steps = backend_.steps();
  info.constant_output_allowed = backend_.output_ignores_weights();
  return info;
}

Checkpoint BackendSubject::draw_checkpoint(uint64_t seed) {
  if (!pools_) {
    // The layouts of a freshly created layer; the pools are fixed by them, so
    // every layer would give the same ones.
    fresh_layer_ = backend_.create_layer(device_);
    pools_.emplace(checkpoint_layouts(backend_, *fresh_layer_));
  }
  return pools_->draw(seed);
}

at::Tensor BackendSubject::draw_input(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(backend_.input_shape(), gen, at::kFloat).to(device_);
}

std::shared_ptr<SubjectLayer> BackendSubject::new_layer() {
  std::shared_ptr<Layer> layer =
      fresh_layer_ != nullptr ? std::move(fresh_layer_) : backend_.create_layer(device_);
  fresh_layer_.reset();
  checkpoint_layouts(backend_, *layer);  // refuses a layer without checkpoint parameters
  return std::make_shared<BackendLayer>(backend_, std::move(layer));
}

std::vector<NamedTensor> BackendSubject::cache_tensors() {
  std::vector<NamedTensor> out;
  for (const ModuleCache* cache : backend_.module_caches()) {
    for (NamedTensor& t : cache->tensors()) out.push_back(std::move(t));
  }
  return out;
}

void BackendSubject::empty_caches() {
  emptied_.push_back(std::make_unique<CachesStashed>(backend_.module_caches()));
}

void BackendSubject::restore_caches() {
  TORCH_CHECK(!emptied_.empty(), "backend '", backend_.name(),
              "': restore_caches() without a matching empty_caches()");
  emptied_.pop_back();
}

BackendReport run_backend(const Backend& backend, const RunOptions& options) {
  BackendSubject subject(backend, options.device);
  return run_subject(subject, options);
}

}  // namespace reloadsafe::harness
