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
  load(*layer_, ckpt ? *ckpt : draw_from_pools(pools(), seed));
  backend_.process_weights_after_loading(*layer_);
}

const Checkpoint& ReloadSession::pools() const {
  if (!pools_) pools_ = checkpoint_pools(layouts_);
  return *pools_;
}

Checkpoint ReloadSession::draw_checkpoint(uint64_t seed) const {
  return draw_from_pools(pools(), seed);
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
  auto tensors = kernel_parameters(*layer_);
  for (const auto& name : backend_.derived_names()) {
    at::Tensor t = layer_->get(name);
    if (t.defined()) tensors.emplace_back(name, t);
  }
  for (const NamedTensor& held : backend_.held_tensors(*layer_)) {
    if (held.declared && held.tensor.defined()) tensors.emplace_back(held.name, held.tensor);
  }
  return tensors;
}

std::vector<NamedTensor> ReloadSession::named_tensors() const {
  std::vector<NamedTensor> named;
  for (const auto& [name, t] : kernel_visible()) named.push_back({name, t, /*declared=*/true});
  for (const auto& [name, t] : layer_->parameter_slots()) {
    if (t.defined()) named.push_back({name, t, false});
  }
  for (const auto& name : layer_->attribute_names()) {
    at::Tensor t = layer_->get(name);
    if (t.defined()) named.push_back({name, t, false});
  }
  for (const auto& item : layer_->named_buffers(/*recurse=*/true)) {
    named.push_back({item.key(), item.value(), false});
  }
  for (const NamedTensor& held : backend_.held_tensors(*layer_)) {
    if (!held.declared && held.tensor.defined()) named.push_back(held);
  }
  return named;
}

std::vector<NamedObject> ReloadSession::named_objects() const {
  return backend_.held_objects(*layer_);
}

at::Tensor ReloadSession::cold_forward(const Checkpoint& ckpt, const at::Tensor& x) const {
  auto fresh = backend_.create_layer(device_);
  load(*fresh, ckpt);
  backend_.process_weights_after_loading(*fresh);
  return backend_.forward(*fresh, x);
}

BackendSubject::BackendSubject(const Backend& backend, const c10::Device& device)
    : backend_(backend), device_(device) {}

ReloadSession& BackendSubject::session() {
  TORCH_CHECK(session_ != nullptr, "backend '", backend_.name(), "': no layer loaded yet");
  return *session_;
}

SubjectInfo BackendSubject::info() const {
  SubjectInfo info;
  info.name = backend_.name();
  info.description = backend_.description();
  info.modes = backend_.modes();
  info.negative_control = backend_.negative_control();
  info.expected_violation = backend_.expected_violation();
  info.memory_tolerance_bytes = backend_.memory_tolerance_bytes();
  info.steps = backend_.steps();
  return info;
}

Checkpoint BackendSubject::draw_checkpoint(uint64_t seed) {
  if (!pools_) {
    // The layouts of a freshly created layer; the pools are fixed by them, so
    // every mode's session would draw the same ones.
    fresh_layer_ = backend_.create_layer(device_);
    pools_ = checkpoint_pools(checkpoint_layouts(backend_, *fresh_layer_));
  }
  return draw_from_pools(*pools_, seed);
}

at::Tensor BackendSubject::draw_input(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(backend_.input_shape(), gen, at::kFloat).to(device_);
}

void BackendSubject::cold_load(const Checkpoint& ckpt) {
  mode_caches_.reset();  // what an earlier cold load's caches held is gone
  mode_caches_ = std::make_unique<CachesStashed>(backend_.module_caches());
  session_ = std::make_unique<ReloadSession>(backend_, device_, std::move(fresh_layer_), ckpt);
}

void BackendSubject::reload(ReloadMode /*mode*/, const Checkpoint& ckpt) {
  session().load_and_process(ckpt);  // the protocol has entered the mode's scope
}

at::Tensor BackendSubject::forward(const at::Tensor& x) {
  return backend_.forward(session().layer(), x);
}

at::Tensor BackendSubject::cold_forward(const Checkpoint& ckpt, const at::Tensor& x) {
  // The reference is made with the module caches emptied, so a corrupted
  // cache cannot corrupt it too.
  CachesStashed stashed(backend_.module_caches());
  return session().cold_forward(ckpt, x);
}

std::vector<NamedTensor> BackendSubject::named_tensors() {
  return session().named_tensors();
}

std::vector<NamedObject> BackendSubject::named_objects() {
  return session().named_objects();
}

std::vector<NamedTensor> BackendSubject::cache_tensors() {
  std::vector<NamedTensor> out;
  for (const ModuleCache* cache : backend_.module_caches()) {
    for (NamedTensor& t : cache->tensors()) out.push_back(std::move(t));
  }
  return out;
}

bool BackendSubject::sleep_and_wake(int level) {
  return backend_.sleep_and_wake(session().layer(), level);
}

std::vector<at::Tensor> BackendSubject::parameters() {
  return session().layer().parameters(/*recurse=*/true);
}

std::vector<at::Tensor> BackendSubject::buffers() {
  return session().layer().buffers(/*recurse=*/true);
}

std::vector<NamedNumber> BackendSubject::named_numbers() {
  return backend_.host_numbers(session().layer());
}

LayerState BackendSubject::cold_state(const Checkpoint& ckpt, int loads,
                                      const at::Tensor& forward_input) {
  CachesStashed stashed(backend_.module_caches());
  ReloadSession aside(backend_, device_, ckpt);
  for (int i = 1; i < loads; ++i) aside.load_and_process(ckpt);
  if (forward_input.defined()) backend_.forward(aside.layer(), forward_input);
  LayerState state{aside.named_tensors(), backend_.host_numbers(aside.layer())};
  for (NamedTensor& t : stashed.tensors()) state.tensors.push_back(std::move(t));
  return state;
}

BackendReport run_backend(const Backend& backend, const RunOptions& options) {
  BackendSubject subject(backend, options.device);
  return run_subject(subject, options);
}

}  // namespace reloadsafe::harness
