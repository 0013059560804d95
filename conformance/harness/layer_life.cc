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

std::shared_ptr<SubjectLayer> cold_loaded(ReloadSubject& subject, const Checkpoint& ckpt,
                                          int loads) {
  std::shared_ptr<SubjectLayer> layer = subject.new_layer();
  TORCH_CHECK(layer != nullptr, "the subject's new_layer() returned no layer");
  for (int i = 0; i < loads; ++i) {
    layer->load(ckpt);
    layer->process();
  }
  return layer;
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
                       const SubjectInfo& info) {
  LayerState state{layer.named_tensors(), checked_numbers(layer, info)};
  for (NamedTensor& c : caches) state.tensors.push_back(std::move(c));
  if (!info.free_names.empty()) {
    state.tensors.erase(std::remove_if(state.tensors.begin(), state.tensors.end(),
                                       [&](const NamedTensor& t) { return is_free(info, t.name); }),
                        state.tensors.end());
  }
  return state;
}

at::Tensor cold_forward(ReloadSubject& subject, const Checkpoint& ckpt, const at::Tensor& x) {
  CachesEmptied caches(subject);
  std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, ckpt);
  at::Tensor out = layer->forward(x);
  layer.reset();
  caches.restore();
  return out;
}

LayerState cold_state(ReloadSubject& subject, const SubjectInfo& info, const Checkpoint& ckpt,
                      int loads, const at::Tensor& forward_input) {
  CachesEmptied caches(subject);
  std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, ckpt, loads);
  if (forward_input.defined()) layer->forward(forward_input);
  LayerState state = layer_state(*layer, subject.cache_tensors(), info);
  caches.restore();
  return state;
}

std::optional<at::Tensor> cold_state_then_forward(
    ReloadSubject& subject, const SubjectInfo& info, const Checkpoint& ckpt,
    const std::function<void(const LayerState&)>& with_state, const at::Tensor& x) {
  CachesEmptied caches(subject);
  std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, ckpt);
  with_state(layer_state(*layer, subject.cache_tensors(), info));
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
