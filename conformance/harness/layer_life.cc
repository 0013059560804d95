#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/layer_life.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

namespace reloadsafe::harness {
namespace {

bool is_free(const SubjectInfo& info, const std::string& name) {
  return std::find(info.free_names.begin(), info.free_names.end(), name) != info.free_names.end();
}

}  // namespace

CachesEmptied::CachesEmptied(ReloadSubject& subject) : subject_(subject) {
  subject_.empty_caches();
}

CachesEmptied::~CachesEmptied() noexcept(false) {
  // While an exception unwinds, a second one from the restore would
  // terminate: the first is the one to report.
  if (restored_) return;
  if (std::uncaught_exceptions() > 0) {
    try {
      subject_.restore_caches();
    } catch (...) {
    }
    return;
  }
  restore();
}

void CachesEmptied::restore() {
  if (restored_) return;
  restored_ = true;
  subject_.restore_caches();
}

namespace {

std::shared_ptr<SubjectLayer> loaded(std::shared_ptr<SubjectLayer> layer, const Checkpoint& ckpt,
                                     int loads) {
  for (int i = 0; i < loads; ++i) {
    layer->load(ckpt);
    layer->process();
  }
  return layer;
}

// Whether `a` and `b` hold the same names in the same order (each tensor of
// the same dtype and shape) and state_differences() finds nothing between
// them.
bool same_state(const LayerState& a, const LayerState& b) {
  const auto same_names = [](const auto& x, const auto& y) {
    return x.size() == y.size() &&
           std::equal(x.begin(), x.end(), y.begin(),
                      [](const auto& p, const auto& q) { return p.name == q.name; });
  };
  if (!same_names(a.tensors, b.tensors) || !same_names(a.numbers, b.numbers)) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const at::Tensor& x = a.tensors[i].tensor;
    const at::Tensor& y = b.tensors[i].tensor;
    if (x.defined() != y.defined()) return false;
    if (x.defined() && (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes() ||
                        x.layout() != y.layout())) {
      return false;
    }
  }
  return state_differences(a, b).empty();
}

}  // namespace

std::shared_ptr<SubjectLayer> cold_loaded(ReloadSubject& subject, const Checkpoint& ckpt,
                                          int loads) {
  std::shared_ptr<SubjectLayer> layer = subject.new_layer();
  TORCH_CHECK(layer != nullptr, "the subject's new_layer() returned no layer");
  return loaded(std::move(layer), ckpt, loads);
}

std::shared_ptr<SubjectLayer> cold_loaded(std::shared_ptr<SubjectLayer> layer,
                                          const Checkpoint& ckpt) {
  return loaded(std::move(layer), ckpt, 1);
}

std::shared_ptr<SubjectLayer> AsideLayers::copy(const Checkpoint* ckpt) {
  if (state_ == State::kProven) {
    std::shared_ptr<SubjectLayer> copy =
        subject_.copy_of_new_layer(on_checkpoint_ == State::kProven ? ckpt : nullptr);
    if (copy != nullptr) return copy;
  }
  std::shared_ptr<SubjectLayer> layer = subject_.new_layer();
  TORCH_CHECK(layer != nullptr, "the subject's new_layer() returned no layer");
  return layer;
}

std::shared_ptr<SubjectLayer> AsideLayers::new_layer(const Checkpoint& ckpt, bool built) {
  if (built) {
    std::shared_ptr<SubjectLayer> layer = subject_.new_layer();
    TORCH_CHECK(layer != nullptr, "the subject's new_layer() returned no layer");
    return layer;
  }
  return copy(&ckpt);
}

std::shared_ptr<SubjectLayer> AsideLayers::new_copy() {
  return copy(nullptr);
}

std::optional<at::Tensor> AsideLayers::try_copy(SubjectLayer& live, const Checkpoint& ckpt,
                                                const at::Tensor& x, const SubjectInfo& info,
                                                bool numbers, bool on_checkpoint) {
  if (state_ != State::kUntried) return std::nullopt;
  state_ = State::kRefused;  // unless the copy holds what the live layer holds
  on_checkpoint_ = on_checkpoint ? State::kTried : State::kRefused;
  try {
    const LayerState built = layer_state(live, subject_.cache_tensors(), info, numbers);
    std::shared_ptr<SubjectLayer> copy =
        subject_.copy_of_new_layer(on_checkpoint ? &ckpt : nullptr);
    if (copy == nullptr) return std::nullopt;
    CachesEmptied caches(subject_);
    copy = loaded(std::move(copy), ckpt, 1);
    if (!same_state(built, layer_state(*copy, subject_.cache_tensors(), info, numbers))) {
      return std::nullopt;
    }
    at::Tensor out = copy->forward(x);
    copy.reset();
    caches.restore();
    state_ = State::kTried;
    return out;
  } catch (const std::exception&) {
    // A copy that cannot be made, loaded or run is no reference: layers
    // made aside are built (the live layer's own steps ran, and raise in
    // their own right where they fail).
    return std::nullopt;
  }
}

void AsideLayers::settle(bool same_output, bool checkpoint_unchanged) {
  if (state_ != State::kTried) return;
  state_ = same_output ? State::kProven : State::kRefused;
  if (on_checkpoint_ == State::kTried) {
    on_checkpoint_ = same_output && checkpoint_unchanged ? State::kProven : State::kRefused;
  }
}

std::vector<NamedNumber> checked_numbers(SubjectLayer& layer, const SubjectInfo& info) {
  std::vector<NamedNumber> numbers = layer.named_numbers();
  if (!info.free_names.empty()) {
    numbers.erase(std::remove_if(numbers.begin(), numbers.end(),
                                 [&](const NamedNumber& n) { return is_free(info, n.name); }),
                  numbers.end());
  }
  return numbers;
}

LayerState layer_state(SubjectLayer& layer, std::vector<NamedTensor> caches,
                       const SubjectInfo& info, bool numbers) {
  LayerState state{layer.named_tensors(), {}};
  if (numbers) state.numbers = checked_numbers(layer, info);
  for (NamedTensor& c : caches) state.tensors.push_back(std::move(c));
  if (!info.free_names.empty()) {
    state.tensors.erase(std::remove_if(state.tensors.begin(), state.tensors.end(),
                                       [&](const NamedTensor& t) { return is_free(info, t.name); }),
                        state.tensors.end());
  }
  return state;
}

at::Tensor cold_forward(AsideLayers& aside, const Checkpoint& ckpt, const at::Tensor& x,
                        bool built) {
  CachesEmptied caches(aside.subject());
  std::shared_ptr<SubjectLayer> layer = loaded(aside.new_layer(ckpt, built), ckpt, 1);
  at::Tensor out = layer->forward(x);
  layer.reset();
  caches.restore();
  return out;
}

LayerState cold_state(AsideLayers& aside, const SubjectInfo& info, const Checkpoint& ckpt,
                      int loads, const at::Tensor& forward_input) {
  CachesEmptied caches(aside.subject());
  std::shared_ptr<SubjectLayer> layer = loaded(aside.new_layer(ckpt), ckpt, loads);
  if (forward_input.defined()) layer->forward(forward_input);
  LayerState state = layer_state(*layer, aside.subject().cache_tensors(), info);
  caches.restore();
  return state;
}

std::optional<at::Tensor> cold_state_then_forward(
    AsideLayers& aside, const SubjectInfo& info, const Checkpoint& ckpt,
    const std::function<void(const LayerState&)>& with_state, const at::Tensor& x) {
  CachesEmptied caches(aside.subject());
  std::shared_ptr<SubjectLayer> layer = loaded(aside.new_layer(ckpt), ckpt, 1);
  with_state(layer_state(*layer, aside.subject().cache_tensors(), info));
  std::optional<at::Tensor> out;
  if (x.defined()) {
    try {
      out = layer->forward(x);
    } catch (const std::exception&) {
      // Nothing returned: see the header.
    }
  }
  layer.reset();
  caches.restore();
  return out;
}

}  // namespace reloadsafe::harness
