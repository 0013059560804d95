// layer_life.h: the rules of a layer's life that the protocol owns, written
// once for every subject (subject.h): a cold load, the layers built aside to
// compare reloads with and where they come from, the module caches around
// them, and what a layer's state is.
//
// Invariant: a layer made here is loaded and post-processed exactly as the
// live layer's cold load is (load, then process, `loads` times), with the
// subject's module caches emptied while it is made and put back after, so
// a cache a reload corrupted cannot corrupt the reference too, and the
// process gets back what the caches held. A layer made aside is a copy
// (ReloadSubject::copy_of_new_layer) only once a copy has proven to load as
// a built layer does (Note [Layers made aside by copying]).
//
// Note [Layers made aside by copying]
// Every reload is compared with a cold load of its checkpoint made aside,
// and a cold load needs a layer nothing has loaded yet. Building one runs
// the subject's factory, which for a real model is mostly initialising
// weights that the load overwrites at once: a Llama of 166 M parameters
// takes 2-3 s to build on two cores, some 30 loads' worth, and a check of 4
// reloads built 8 of them where the user's own loop builds one. A subject
// may instead copy a layer as built, with new memory for what every load
// writes (ReloadSubject::copy_of_new_layer). A copy is only as good as its
// cold load, so the protocol proves it once per run, on the first mode's
// cold load (AsideLayers::try_copy, settle): a copy loaded with the same
// checkpoint must hold what the live layer, a built one, holds: the same
// names in the same order, each tensor of the same dtype and shape and
// within the state comparison's tolerance (a built layer may differ from
// another in the last bits, where memory's alignment picks another kernel
// path), the same host numbers where the run compares them; and its forward
// must give the live layer's first output (within close()). From then on
// every layer the run makes aside is a copy. A copy that differs, or
// raises, ends copies for the run: every later layer is built, as before.
// The first mode's live layer is always built: a copy is proven to load as
// a built layer does, not to reload as one does. Where the subject claims
// both modes, the second mode's live layer is a copy (Note [The second
// mode's live layer] in protocol.cc).
//
// Note [A copy on its checkpoint]
// A copy made for a cold load of a checkpoint may be made on the
// checkpoint's own tensors: each parameter the checkpoint holds under its
// name in its very layout is that tensor, so the copy takes no memory for
// it, and a load that copies each tensor into the parameter of its name
// writes it onto itself. A whole model checked this way holds the live
// layer and the checkpoint, as the user's loop does, and little more. It is
// a cold load only where the load, the post-processing and the forward
// leave those tensors as they were: the proof's copy is made on its
// checkpoint, and the protocol checks the checkpoint's digest after it
// (settle): where it changed (a loader that transforms the tensor, a
// post-processing that writes into the parameter in place) copies are
// never made on a checkpoint again, and cost a layer's memory each; that
// proof's copy held what a cold load holds all the same (it was compared).
// The checkpoint is the proof's last use of it where the run compares no
// host numbers (a later use would read what the copy wrote); where it does,
// no copy is made on a checkpoint.
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

/// Where the layers a run makes aside come from (Note [Layers made aside by
/// copying]): the subject's copies, once one has proven to load as a built
/// layer does, else new_layer().
class AsideLayers {
 public:
  explicit AsideLayers(ReloadSubject& subject) : subject_(subject) {}

  ReloadSubject& subject() { return subject_; }

  /// A new layer for a cold load of `ckpt` made aside, not loaded: a copy
  /// where copies are proven (on `ckpt`'s tensors where that is proven too:
  /// Note [A copy on its checkpoint]), unless `built` asks for one the
  /// subject builds.
  std::shared_ptr<SubjectLayer> new_layer(const Checkpoint& ckpt, bool built = false);

  /// A copy on no checkpoint (a live layer), where copies are proven; else
  /// one the subject builds.
  std::shared_ptr<SubjectLayer> new_copy();

  /// Whether copies are still to be tried (by the first mode's cold load).
  bool untried() const { return state_ == State::kUntried; }
  /// Whether a copy has proven to load as a built layer does.
  bool proven() const { return state_ == State::kProven; }

  /// Tries a copy against `live`, a built layer right after its cold load
  /// of `ckpt`, before any forward: a copy loaded aside with `ckpt` (the
  /// caches emptied for it; made on `ckpt`'s tensors where `on_checkpoint`)
  /// must hold `live`'s state (host numbers too where `numbers`). Returns
  /// the copy's forward on `x`, for settle(); nothing (and copies refused)
  /// where the subject makes none, or the copy differs or raises. Only
  /// while untried().
  std::optional<at::Tensor> try_copy(SubjectLayer& live, const Checkpoint& ckpt,
                                     const at::Tensor& x, const SubjectInfo& info, bool numbers,
                                     bool on_checkpoint);

  /// After try_copy() returned an output: copies are proven when
  /// `same_output` (that output is close to the live layer's first
  /// forward on the same input), else refused; copies on a checkpoint are
  /// proven where the tried copy was one and `checkpoint_unchanged` (the
  /// checkpoint's bytes are as before the try).
  void settle(bool same_output, bool checkpoint_unchanged);

  /// Whether copies are made on their checkpoint's tensors.
  bool on_checkpoint() const { return on_checkpoint_ == State::kProven; }

 private:
  enum class State { kUntried, kTried, kProven, kRefused };
  // A copy, made on `ckpt` where copies on a checkpoint are `on`.
  std::shared_ptr<SubjectLayer> copy(const Checkpoint* ckpt);
  ReloadSubject& subject_;
  State state_ = State::kUntried;
  State on_checkpoint_ = State::kUntried;
};

/// A new layer of `subject` with `ckpt` loaded and post-processed `loads`
/// times (1, or 2 to tell a post-processing that is not idempotent).
std::shared_ptr<SubjectLayer> cold_loaded(ReloadSubject& subject, const Checkpoint& ckpt,
                                          int loads = 1);
/// `layer`, new and not loaded, with `ckpt` loaded and post-processed once.
std::shared_ptr<SubjectLayer> cold_loaded(std::shared_ptr<SubjectLayer> layer,
                                          const Checkpoint& ckpt);

/// What `layer` holds: its named tensors (declared or not), then `caches`
/// (the module caches' tensors), then its host numbers unless `numbers` is
/// false, all by name; the names of SubjectInfo::free_names left out.
LayerState layer_state(SubjectLayer& layer, std::vector<NamedTensor> caches,
                       const SubjectInfo& info, bool numbers = true);

/// `layer`'s host numbers without SubjectInfo::free_names.
std::vector<NamedNumber> checked_numbers(SubjectLayer& layer, const SubjectInfo& info);

/// The forward on `x` of a cold load of `ckpt` made aside (on a layer the
/// subject builds, where `built`), the caches emptied for it: what a reload
/// of `ckpt` must reproduce.
at::Tensor cold_forward(AsideLayers& aside, const Checkpoint& ckpt, const at::Tensor& x,
                        bool built = false);

/// A cold load of `ckpt` made aside, the caches emptied for it, loaded
/// `loads` times and then, when `forward_input` is defined, run once on it:
/// its layer_state(), with what the caches got.
LayerState cold_state(AsideLayers& aside, const SubjectInfo& info, const Checkpoint& ckpt,
                      int loads, const at::Tensor& forward_input);

/// A cold load of `ckpt` made aside, the caches emptied for it, that
/// serves two checks (Note [One cold layer per reload] in cold_loads.h):
/// `with_state` is handed its layer_state() before any forward has run on
/// it; then, where `x` is defined, the layer's forward on `x` is returned
/// (what cold_forward would give), or nothing where that forward raised (a
/// caller that needs it makes a cold load of its own, which raises there).
std::optional<at::Tensor> cold_state_then_forward(
    AsideLayers& aside, const SubjectInfo& info, const Checkpoint& ckpt,
    const std::function<void(const LayerState&)>& with_state, const at::Tensor& x);

}  // namespace reloadsafe::harness
