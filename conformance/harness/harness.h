// harness.h: C++ backends through the reload protocol (protocol.h).
//
// A Backend (backend.h) describes weight creation, post-processing and the
// forward. ReloadSession takes one layer through the protocol's steps (the
// CUDA-graph tests drive it between capture and replays); BackendSubject is
// the protocol's view of a Backend (a ReloadSubject, subject.h), whose
// layers are Backend layers; run_backend runs it in both modes.
//
// What a backend declares: the kernel-visible tensors, i.e. live parameters
// under their runtime names (kernel_parameters), derived_names() and the
// declared held_tensors() of its kernel objects. Every
// other parameter slot, plain attribute and buffer of the layer is known by
// name but undeclared: a traced forward that reads it gets a warning, and a
// reload that moves it a violation naming it.
#pragma once

#include "conformance/harness/backend.h"
#include "conformance/harness/checkpoint_pools.h"
#include "conformance/harness/protocol.h"
#include "conformance/harness/report.h"
#include "conformance/harness/run_options.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// One layer taken through the reload protocol step by step.
class ReloadSession {
 public:
  /// The cold load: creates the layer on `device`, loads a random checkpoint
  /// (drawn from `seed`) through each parameter's weight_loader, and
  /// post-processes it.
  ReloadSession(const Backend& backend, const c10::Device& device, uint64_t seed);
  /// The same with a given checkpoint.
  ReloadSession(const Backend& backend, const c10::Device& device, const Checkpoint& ckpt);
  /// The same into `fresh`, a layer `backend` created on `device` that
  /// nothing has loaded or post-processed yet.
  ReloadSession(const Backend& backend, const c10::Device& device, std::shared_ptr<Layer> fresh,
                const Checkpoint& ckpt);

  Layer& layer() { return *layer_; }

  /// The checkpoint of `seed` for this layer, on the CPU (where an mmap'd
  /// checkpoint lives; Note [Checkpoints from a pool] in checkpoint_pools.h).
  Checkpoint draw_checkpoint(uint64_t seed) const;

  /// A reload as an engine does it: `ckpt` through the same loaders, then
  /// post-processing, inside a DirectReloadScope in the direct mode. For
  /// drivers other than the protocol (which enters the scope itself).
  void reload(ReloadMode mode, const Checkpoint& ckpt);

  /// `ckpt` through the layer's loaders, then post-processing; no scope is
  /// entered.
  void load_and_process(const Checkpoint& ckpt);

  /// Every tensor the backend declares the forward reads: live parameters
  /// under their runtime names, then the backend's derived tensors, then
  /// the declared ones it holds outside the layer (held_tensors()).
  std::vector<std::pair<std::string, at::Tensor>> kernel_visible() const;

  /// kernel_visible() as declared names, then every other parameter slot,
  /// plain attribute and buffer of the layer and the backend's undeclared
  /// held tensors as undeclared names.
  std::vector<NamedTensor> named_tensors() const;

  /// The forward on `x` of a fresh cold load of `ckpt` on the same device:
  /// what a reload of `ckpt` must reproduce.
  at::Tensor cold_forward(const Checkpoint& ckpt, const at::Tensor& x) const;

 private:
  ReloadSession(const Backend& backend, const c10::Device& device, std::shared_ptr<Layer> fresh,
                const std::optional<Checkpoint>& ckpt, uint64_t seed);
  // The checkpoint pools (Note [Checkpoints from a pool]), drawn on first use.
  const CheckpointPools& pools() const;
  const Backend& backend_;
  c10::Device device_;
  Checkpoint layouts_;  // meta tensors
  mutable std::optional<CheckpointPools> pools_;
  std::shared_ptr<Layer> layer_;
};

/// Every tensor `backend` declares its forward reads in `layer`: live
/// parameters under their runtime names, then the backend's derived
/// tensors, then the declared ones it holds outside the layer
/// (held_tensors()).
std::vector<std::pair<std::string, at::Tensor>> kernel_visible(const Backend& backend,
                                                               Layer& layer);

/// kernel_visible() as declared names, then every other parameter slot,
/// plain attribute and buffer of `layer` and the backend's undeclared held
/// tensors as undeclared names.
std::vector<NamedTensor> backend_named_tensors(const Backend& backend, Layer& layer);

/// The protocol's view of a Backend on one device: its layers are the
/// backend's, built on the device, loaded through each parameter's
/// weight_loader and post-processed by the backend.
class BackendSubject : public ReloadSubject {
 public:
  BackendSubject(const Backend& backend, const c10::Device& device);

  SubjectInfo info() const override;
  /// A draw of the pools of the backend's checkpoint layouts
  /// (Note [Checkpoints from a pool]), drawn on the first call.
  Checkpoint draw_checkpoint(uint64_t seed) override;
  at::Tensor draw_input(uint64_t seed) override;
  std::shared_ptr<SubjectLayer> new_layer() override;
  /// The tensors of Backend::module_caches.
  std::vector<NamedTensor> cache_tensors() override;
  void empty_caches() override;
  void restore_caches() override;

 private:
  const Backend& backend_;
  c10::Device device_;
  // Every checkpoint's pools (Note [Checkpoints from a pool]), drawn once.
  std::optional<CheckpointPools> pools_;
  // The layer created to read the pools' layouts, untouched: the next
  // new_layer() takes it rather than creating one more.
  std::shared_ptr<Layer> fresh_layer_;
  // The caches emptied by each empty_caches() not yet restored, innermost
  // last (Backend::module_caches).
  std::vector<std::unique_ptr<CachesStashed>> emptied_;
};

/// Runs the protocol for `backend` in both modes.
BackendReport run_backend(const Backend& backend, const RunOptions& options);

}  // namespace reloadsafe::harness
