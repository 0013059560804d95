#include "conformance/harness/harness.h"

#include "utils/parameter_names.h"
#include "utils/reload_context.h"
#include "utils/tensor_attrs.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <optional>

namespace reloadsafe::harness {
namespace {

// The checkpoint layouts of a freshly created layer: every parameter slot
// carrying a `_ckpt` record (a meta tensor with the checkpoint layout).
// Post-processing may replace those objects, so this is read once, up front.
Checkpoint checkpoint_layouts(const Layer& layer) {
  Checkpoint layouts;
  for (const auto& [name, param] : layer.parameter_slots()) {
    const std::optional<AttrValue> record = find_attr(param, "_ckpt");
    if (record.has_value() && std::holds_alternative<at::Tensor>(*record)) {
      layouts.emplace(name, std::get<at::Tensor>(*record));
    }
  }
  return layouts;
}

// Note [Checkpoints from a pool]
// A reload needs a checkpoint whose every value differs from the last one's.
// Drawing each from the random generator cost a fifth of a harness run on
// the samples (callgrind: randn's normal_ alone, at some 60 instructions an
// element). So each checkpoint tensor has a pool of random values, drawn
// once per layer (floats from a normal distribution, integers from [0, 100)):
// numel + kWindows elements, held as a tensor with the checkpoint layout at
// the start of its storage. The checkpoint of a seed is a window of the pool
// at an offset derived from the seed and, for floating dtypes, times a scale
// in [0.5, 2) derived from the seed: from one seed to another every element
// changes, and not all by one factor (a multiple would quantize to the same
// bytes). Each checkpoint is a new tensor of its own; python/reloadsafe/
// loading.py (CheckpointDrawer) draws Python checkpoints the same way.
constexpr int64_t kWindows = 1031;

uint64_t mix_seed(uint64_t z) {  // SplitMix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The pools for `layouts` (meta tensors, or pools already), drawn from one
// generator of a fixed seed: every pool of a layout is the same.
Checkpoint checkpoint_pools(const Checkpoint& layouts) {
  at::Generator gen = at::detail::createCPUGenerator(0x5EED);
  Checkpoint pools;
  for (const auto& [name, layout] : layouts) {
    if (!layout.is_meta()) {
      pools.emplace(name, layout);
      continue;
    }
    const int64_t size = layout.numel() + kWindows;
    at::Tensor pool;
    if (at::isFloatingType(layout.scalar_type())) {
      pool = at::randn({size}, gen, at::kFloat).to(layout.scalar_type());
    } else {
      pool = at::randint(0, 100, {size}, gen, at::TensorOptions().dtype(layout.scalar_type()));
    }
    pools.emplace(name,
                  pool.as_strided(layout.sizes(), c10::contiguous_strides(layout.sizes()), 0));
  }
  return pools;
}

// The checkpoint of `seed` from `pools` (checkpoint_pools), on the CPU
// (where an mmap'd checkpoint lives).
Checkpoint draw_from_pools(const Checkpoint& pools, uint64_t seed) {
  const uint64_t h = mix_seed(seed);
  const auto offset = static_cast<int64_t>(h % static_cast<uint64_t>(kWindows));
  const double scale = 0.5 + 1.5 * static_cast<double>(h >> 11) / 9007199254740992.0;  // 2^53
  Checkpoint ckpt;
  for (const auto& [name, pool] : pools) {
    const at::Tensor window = pool.as_strided(pool.sizes(), pool.strides(), offset);
    const at::ScalarType dtype = pool.scalar_type();
    at::Tensor t;
    if (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
        dtype == at::kBFloat16) {
      t = window.mul(scale);
    } else if (at::isFloatingType(dtype)) {
      t = window.to(at::kFloat).mul_(scale).to(dtype);  // float8: no CPU multiplication
    } else {
      t = window.clone();
    }
    ckpt.emplace(name, t);
  }
  return ckpt;
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
    : ReloadSession(backend, device, std::nullopt, seed) {}

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device,
                             const Checkpoint& ckpt)
    : ReloadSession(backend, device, ckpt, 0) {}

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device,
                             const std::optional<Checkpoint>& ckpt, uint64_t seed)
    : backend_(backend), device_(device) {
  layer_ = backend_.create_layer(device_);
  layouts_ = checkpoint_layouts(*layer_);
  TORCH_CHECK(!layouts_.empty(), "backend '", backend_.name(),
              "' created no checkpoint parameter (use make_checkpoint_param or set _ckpt)");
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
  return named;
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
  return info;
}

Checkpoint BackendSubject::draw_checkpoint(uint64_t seed) {
  if (!pools_) {
    // The layouts of a freshly created layer; the pools are fixed by them, so
    // every mode's session would draw the same ones.
    auto layer = backend_.create_layer(device_);
    const Checkpoint layouts = checkpoint_layouts(*layer);
    TORCH_CHECK(!layouts.empty(), "backend '", backend_.name(),
                "' created no checkpoint parameter (use make_checkpoint_param or set _ckpt)");
    pools_ = checkpoint_pools(layouts);
  }
  return draw_from_pools(*pools_, seed);
}

at::Tensor BackendSubject::draw_input(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(backend_.input_shape(), gen, at::kFloat).to(device_);
}

void BackendSubject::cold_load(const Checkpoint& ckpt) {
  session_ = std::make_unique<ReloadSession>(backend_, device_, ckpt);
}

void BackendSubject::reload(ReloadMode /*mode*/, const Checkpoint& ckpt) {
  session().load_and_process(ckpt);  // the protocol has entered the mode's scope
}

at::Tensor BackendSubject::forward(const at::Tensor& x) {
  return backend_.forward(session().layer(), x);
}

at::Tensor BackendSubject::cold_forward(const Checkpoint& ckpt, const at::Tensor& x) {
  return session().cold_forward(ckpt, x);
}

std::vector<NamedTensor> BackendSubject::named_tensors() {
  return session().named_tensors();
}

BackendReport run_backend(const Backend& backend, const RunOptions& options) {
  BackendSubject subject(backend, options.device);
  return run_subject(subject, options);
}

}  // namespace reloadsafe::harness
