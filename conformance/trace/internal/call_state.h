// call_state.h: the thread-local state an op call ran under, and running
// under it again.
//
// What an op computes depends on more than its arguments: autocast (and its
// dtype), grad and inference mode, and whatever else a guard includes or
// excludes in the thread's dispatch key set. A capture records that state
// for every top-level call and its replay runs each op under it, so a
// forward that entered autocast replays as it ran, whatever the replaying
// thread's state is.
//
// Invariant: a ReplayState puts back exactly the state it found, and never
// changes whether the trace's own dispatch key (read_trace.h) is included or
// excluded: a replay run while a trace is active stays as visible to it as
// the code around it.
#pragma once

#include "conformance/trace/trace_key.h"

#include <c10/core/AutogradState.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace reloadsafe::trace {

/// The thread-local state a top-level op ran under, as far as it changes
/// what the op computes: the local dispatch key set (the trace's own key
/// taken out, and the Python keys a dispatch mode switches on: Note [A
/// Python mode is not replayed] in call_state.cc), the autograd state (grad
/// and inference mode) and the autocast dtypes.
struct CallState {
  c10::impl::LocalDispatchKeySet keys{c10::impl::PODLocalDispatchKeySet{}};
  c10::AutogradState autograd{/*grad_mode=*/false, /*inference_mode=*/false,
                              /*fw_grad_mode=*/false, /*multithreading_enabled=*/true};
  c10::ScalarType autocast_cpu = c10::ScalarType::BFloat16;
  c10::ScalarType autocast_cuda = c10::ScalarType::Half;

  /// The calling thread's state now, the trace's key and the Python keys
  /// taken out.
  static CallState current();
};

/// Sets the thread's state to `state` for its lifetime, then puts the
/// previous one back.
class ReplayState {
 public:
  explicit ReplayState(const CallState& state);
  ~ReplayState();
  ReplayState(const ReplayState&) = delete;
  ReplayState& operator=(const ReplayState&) = delete;

 private:
  CallState previous_;
};

}  // namespace reloadsafe::trace
