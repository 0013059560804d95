#include "conformance/trace/internal/call_state.h"

#include <ATen/autocast_mode.h>

namespace reloadsafe::trace {

CallState CallState::current() {
  CallState state;
  state.keys = c10::impl::tls_local_dispatch_key_set();
  // Inside the trace's fallback its key is excluded, and included while a
  // trace runs: neither is the traced code's state.
  state.keys.included_ = state.keys.included_.remove(kTraceKey);
  state.keys.excluded_ = state.keys.excluded_.remove(kTraceKey);
  // Note [A Python mode is not replayed]
  // A Python dispatch mode (a TorchDispatchMode: the one AOTAutograd runs a
  // compiled graph's first call under, a user's logging mode) switches the
  // Python keys on for the thread, and its Python object sits on a stack no
  // replay can rebuild: an op replayed with those keys on and no mode to
  // take it ends in PyTorch's internal assertion. The call was taken as the
  // caller issued it, above the mode (the trace's key sits above Python's),
  // and a graph replays the ops, not the mode: the replay runs it without.
  state.keys.included_ = state.keys.included_.remove(c10::DispatchKey::Python)
                             .remove(c10::DispatchKey::PythonTLSSnapshot);
  state.autograd = c10::AutogradState::get_tls_state();
  state.autocast_cpu = at::autocast::get_autocast_dtype(at::kCPU);
  state.autocast_cuda = at::autocast::get_autocast_dtype(at::kCUDA);
  return state;
}

ReplayState::ReplayState(const CallState& state) : previous_(CallState::current()) {
  // The current trace key membership is kept (the invariant in the header).
  c10::impl::LocalDispatchKeySet keys = state.keys;
  const c10::impl::LocalDispatchKeySet now = c10::impl::tls_local_dispatch_key_set();
  if (now.included_.has(kTraceKey)) keys.included_ = keys.included_.add(kTraceKey);
  if (now.excluded_.has(kTraceKey)) keys.excluded_ = keys.excluded_.add(kTraceKey);
  previous_.keys = now;
  c10::impl::_force_tls_local_dispatch_key_set(keys);
  c10::AutogradState::set_tls_state(state.autograd);
  at::autocast::set_autocast_dtype(at::kCPU, state.autocast_cpu);
  at::autocast::set_autocast_dtype(at::kCUDA, state.autocast_cuda);
}

ReplayState::~ReplayState() {
  c10::impl::_force_tls_local_dispatch_key_set(previous_.keys);
  c10::AutogradState::set_tls_state(previous_.autograd);
  at::autocast::set_autocast_dtype(at::kCPU, previous_.autocast_cpu);
  at::autocast::set_autocast_dtype(at::kCUDA, previous_.autocast_cuda);
}

}  // namespace reloadsafe::trace
