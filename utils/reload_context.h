// reload_context.h: the two scoped flags that tell post-processing what kind
// of load it is part of.
//
//  - Direct reload: weights are being reloaded into a model that already ran
//    post-processing, and replace_parameter may place a new weight anywhere in
//    the existing storage of the old one (see storage_fit.h). The reload
//    machinery (and tests) turn it on with a DirectReloadScope.
//  - Weights already processed: the weights arrive in runtime format (for
//    example from a weight cache), so post-processing skips its transforms.
//    Python keeps this in a context variable; here it is a thread-local flag.
//
// Invariant: each flag is false unless a scope on the current thread set it,
// and every scope restores the value it found when it ends, whether it ends
// normally or by an exception. A new thread starts with both flags false.
// Nothing here touches tensors.
//
// Usage:
//   {
//     reloadsafe::DirectReloadScope direct;             // on for this block
//     backend.process_weights_after_loading(layer);
//   }                                                   // restored here
#pragma once

namespace reloadsafe {

/// Whether a direct reload is in progress on this thread
/// (`direct_reload_enabled()` of the reload machinery).
bool direct_reload_enabled();

/// Sets the direct-reload flag for the lifetime of the scope, then restores
/// the previous value (also when unwinding from an exception).
class DirectReloadScope {
 public:
  explicit DirectReloadScope(bool enabled = true);
  ~DirectReloadScope();
  DirectReloadScope(const DirectReloadScope&) = delete;
  DirectReloadScope& operator=(const DirectReloadScope&) = delete;

 private:
  bool previous_;
};

/// Whether the weights are already in post-processed (runtime) format, i.e.
/// whether a WeightsAlreadyProcessed scope is active on this thread.
bool weights_pre_processed();

/// `with weights_already_processed():` of the reference. While it lives,
/// weights_pre_processed() is true on this thread; nested scopes restore the
/// outer value when they end.
class WeightsAlreadyProcessed {
 public:
  WeightsAlreadyProcessed();
  ~WeightsAlreadyProcessed();
  WeightsAlreadyProcessed(const WeightsAlreadyProcessed&) = delete;
  WeightsAlreadyProcessed& operator=(const WeightsAlreadyProcessed&) = delete;

 private:
  bool previous_;
};

}  // namespace reloadsafe
