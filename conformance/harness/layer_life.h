// layer_life.h: the rules of a layer's life that the protocol owns, written
// once for every subject (subject.h): a cold load, the layers built aside to
// compare reloads with, the module caches around them, and what a layer's
// state is.
//
// Invariant: a layer built here is loaded and post-processed exactly as the
// live layer's cold load is (load, then process, `loads` times), with the
// subject's module caches emptied while it is built and put back after, so
// a cache a reload corrupted cannot corrupt the reference too, and the
// process gets back what the caches held.
#pragma once

#include "conformance/harness/layer_state.h"
#include "conformance/harness/subject.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace reloadsafe::harness {

/// The subject's module caches emptied for a scope and put back at its end
/// (ReloadSubject::empty_caches, restore_caches).
class CachesEmptied {
 public:
  explicit CachesEmptied(ReloadSubject& subject);
  ~CachesEmptied() noexcept(false);
  CachesEmptied(const CachesEmptied&) = delete;
  CachesEmptied& operator=(const CachesEmptied&) = delete;

  /// Puts the caches back now (once); the destructor then does nothing. For
  /// a scope whose end may raise (a subject's restore that fails is an error
  /// of the run, not something to lose in a destructor).
  void restore();

 private:
  ReloadSubject& subject_;
  bool restored_ = false;
};

/// A new layer of `subject` with `ckpt` loaded and post-processed `loads`
/// times (1, or 2 to tell a post-processing that is not idempotent).
std::shared_ptr<SubjectLayer> cold_loaded(ReloadSubject& subject, const Checkpoint& ckpt,
                                          int loads = 1);

/// What `layer` holds: its named tensors (declared or not), then `caches`
/// (the module caches' tensors), then its host numbers, all by name; the
/// names of SubjectInfo::free_names left out.
LayerState layer_state(SubjectLayer& layer, std::vector<NamedTensor> caches,
                       const SubjectInfo& info);

/// `layer`'s host numbers without SubjectInfo::free_names.
std::vector<NamedNumber> checked_numbers(SubjectLayer& layer, const SubjectInfo& info);

/// The forward on `x` of a cold load of `ckpt` built aside, the caches
/// emptied for it: what a reload of `ckpt` must reproduce.
at::Tensor cold_forward(ReloadSubject& subject, const Checkpoint& ckpt, const at::Tensor& x);

/// A cold load of `ckpt` built aside, the caches emptied for it, loaded
/// `loads` times and then, when `forward_input` is defined, run once on it:
/// its layer_state(), with what the caches got.
LayerState cold_state(ReloadSubject& subject, const SubjectInfo& info, const Checkpoint& ckpt,
                      int loads, const at::Tensor& forward_input);

/// A cold load of `ckpt` built aside, the caches emptied for it, that
/// serves two checks (Note [One cold layer per reload] in cold_loads.h):
/// `with_state` is handed its layer_state() before any forward has run on
/// it; then, where `x` is defined, the layer's forward on `x` is returned
/// (what cold_forward would give), or nothing where that forward raised (a
/// caller that needs it makes a cold load of its own, which raises there).
std::optional<at::Tensor> cold_state_then_forward(
    ReloadSubject& subject, const SubjectInfo& info, const Checkpoint& ckpt,
    const std::function<void(const LayerState&)>& with_state, const at::Tensor& x);

}  // namespace reloadsafe::harness
