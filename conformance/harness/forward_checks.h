// forward_checks.h: the checks of a reload's forward. The live forward is
// traced again against the capture (same ops, every read at its captured
// place), and its output, the capture's replay and the device graph's
// replay each equal the forward of a cold load of the same checkpoint.
//
// Invariant: the forward a reload is judged by runs once per reload, on a
// copy of the run's input; whatever else runs a forward (a cold load, a
// traced cold load that asks whether ops follow the weights) runs aside,
// on its own copy.
#pragma once

#include "conformance/harness/cold_loads.h"
#include "conformance/harness/forward_capture.h"
#include "conformance/harness/report.h"
#include "conformance/harness/step.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// The capture of a mode's forward and the checks of every reload's forward
/// against it.
class ForwardChecks {
 public:
  /// For the mode `mode`, whose live forward is handed `x` (a copy of
  /// mode.input()); warnings go to `report`.
  ForwardChecks(ModeContext& mode, ModeReport& report, ColdLoadOutputs& cold_loads,
                const at::Tensor& x)
      : mode_(mode), report_(report), cold_loads_(cold_loads), x_(x) {}

  /// Captures the live forward (when the run traces) and counts its reads
  /// (count_reads), after the warm-up.
  void capture();

  /// After a reload: the live forward (retraced against the capture), then
  /// `after_forward` (the steps' hooks), then its output, the capture's
  /// replay and `replayed_graph` (the device graph's output after this
  /// reload, undefined where none was captured) against a cold load of the
  /// reload's checkpoint.
  void check(const Reload& reload, const at::Tensor& replayed_graph,
             const std::function<void()>& after_forward);

  /// The declared names among `named` (the live layer's tensors right after
  /// capture()) whose tensor the captured forward made with its own ops:
  /// state the forward rebinds at every call, whose address no graph
  /// depends on (Note [State every forward makes] in forward_checks.cc).
  /// Warns once, naming them. Empty without a capture (a run that does not
  /// trace).
  std::set<std::string> made_by_every_forward(const std::vector<trace::NamedTensor>& named);
  /// The bytes of the state made_by_every_forward() found that only the
  /// capture holds now: storages no name in `named` (the live layer's
  /// tensors now) is on any more, since a later forward rebound the names.
  /// The check's own memory, not the layer's: a mode's memory leaves it out.
  int64_t state_only_the_capture_holds(const std::vector<trace::NamedTensor>& named) const;
  /// Lets go of the capture (and every tensor it holds).
  void release() {
    captured_state_.clear();
    capture_ = ForwardCapture{};
  }

 private:
  bool sequence_follows_the_weights(const trace::CheckingRetrace& retrace, const Checkpoint& ckpt);
  void warn_sequence_follows_the_weights(const trace::ReadChange& change);
  void check_replay(int r, const at::Tensor& expected, const at::Tensor* retraced,
                    bool retraced_close, const std::optional<trace::ReadChange>& new_args);

  ModeContext& mode_;
  ModeReport& report_;
  ColdLoadOutputs& cold_loads_;
  const at::Tensor& x_;
  ForwardCapture capture_;
  // The storages of made_by_every_forward()'s tensors as the capture made
  // them (it holds them: the pointers stay valid until release()).
  std::set<const c10::StorageImpl*> captured_state_;
  bool replayed_once_ = false;    // a replay of the capture ran and returned an output
  bool warned_sequence_ = false;  // Note [An op sequence that follows the weights]
};

}  // namespace reloadsafe::harness
