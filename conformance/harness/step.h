// step.h: a harness step, one object with hooks at the phases of a mode's
// run, and what it may see of that run (ModeContext).
//
// A mode of the protocol (protocol.h) is a cold load, a capture and many
// reloads, each checked. A step is what a run may add to that (RunOptions::
// steps, by name): something an engine does between reloads (a sleep), a
// check that names more than the protocol's own (host numbers, state
// against a cold load) or a bound (memory). The protocol calls each step's
// hooks in step-table order (step_table.h) at these phases of a mode:
//
//   cold load -> cold_loaded -> warm-up forward -> started -> capture
//   for each reload: draw the checkpoint -> before_reload -> before_load
//     -> load (the first step whose load() loads, else the protocol's)
//     and post-processing -> after_load -> graph replay, memory
//     recorded -> after_reload -> the protocol's own checks -> forward
//     -> after_forward -> replay of the capture
//
// Invariant: a step touches the live layer only through its hooks, and
// reports only through the context's sink; whatever it builds to compare
// with, it builds aside (ModeContext::cold_state_aside), never from the
// live layer's storages. A step that runs something of the layer's own
// (its sleep) runs it through ModeContext::layer_step_runs, so that a raise
// there is the reload's violation, not an error of the check.
#pragma once

#include "conformance/harness/layer_state.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/subject.h"
#include "conformance/harness/violation_sink.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// One reload as a step's hooks see it.
struct Reload {
  /// The reload's number, from 1.
  int index = 0;
  /// What it loads (drawn from reload_seed(seed, index)).
  const Checkpoint& checkpoint;
  /// The live bytes the checkpoint adds while the reload is measured (none
  /// while the cold load was).
  int64_t checkpoint_bytes = 0;
  /// The checkpoint's digest as drawn (CheckpointDigest::whole in
  /// digest.h), what the cold loads compared with it are kept by; nothing
  /// where it has none, or once the reload wrote into it.
  std::optional<uint64_t> checkpoint_digest;
};

/// What a step may see and do while a mode runs; the protocol's mode run
/// implements it.
class ModeContext {
 public:
  virtual ~ModeContext() = default;

  /// The subject under test and what it is.
  virtual ReloadSubject& subject() = 0;
  virtual const SubjectInfo& info() const = 0;
  /// The run's options (its device, seed, reloads).
  virtual const RunOptions& options() const = 0;
  /// The layer the mode reloads.
  virtual SubjectLayer& live() = 0;
  /// The run's input as drawn (the live forward is handed a copy).
  virtual const at::Tensor& input() const = 0;
  /// The live bytes recorded so far: after the cold load, then after each
  /// reload (ModeReport::memory_bytes); empty where they are not counted.
  virtual const std::vector<int64_t>& memory_bytes() const = 0;
  /// Where violations go.
  virtual ViolationSink& sink() = 0;

  /// Whether `name` is flagged here for the first time this mode by a step
  /// that compares the layer's state: each name is flagged once, whichever
  /// state step finds it first.
  virtual bool first_state_flag(const std::string& name) = 0;
  /// What the live layer holds, its module caches' tensors included
  /// (layer_state in layer_life.h).
  virtual LayerState live_state() = 0;
  /// cold_state (layer_life.h) of a layer built aside, counted apart from
  /// the live layer's memory (Note [What the layers made aside keep]).
  virtual LayerState cold_state_aside(const Checkpoint& ckpt, int loads,
                                      const at::Tensor& forward_input) = 0;
  /// Calls `compare` with the state to compare `live`, the live layer's
  /// after `reload`, with: a cold load's of the reload's checkpoint, built
  /// aside (as cold_state_aside(checkpoint, 1, {})). Not called when an
  /// earlier mode's cold load of the checkpoint held exactly what `live`
  /// holds (Note [A cold state kept as its digest] in cold_loads.h): no
  /// layer is built. After `compare` the same layer runs the reload's cold
  /// forward for the forward check (Note [One cold layer per reload]), so
  /// `compare` keeps nothing of the state's tensors past its return and
  /// builds no layer aside itself.
  virtual void compare_cold_state(const Reload& reload, const LayerState& live,
                                  const std::function<void(const LayerState& cold)>& compare) = 0;
  /// The forward on `x` of a cold load of `ckpt` made aside (cold_forward
  /// in layer_life.h), counted as cold_state_aside's layers are. `built`: a
  /// layer the subject builds, never a copy (Note [Layers made aside by
  /// copying] proves a copy's state and output, not the ops its forward
  /// runs), for a forward whose trace is compared with the live layer's.
  virtual at::Tensor cold_forward_aside(const Checkpoint& ckpt, const at::Tensor& x,
                                        bool built) = 0;
  /// Runs `run`, something of the live layer's own called `what` ("the
  /// subject's sleep and wake before it"), at reload `reload`; false when it
  /// raised, which is then the violation "reload" and ends the mode (Note [A
  /// reload that raises] in protocol.cc).
  virtual bool layer_step_runs(int reload, const std::string& what,
                               const std::function<void()>& run) = 0;
};

/// A harness step: its hooks, each called once per phase of a mode (see the
/// top of this file), each doing nothing unless the step overrides it.
class Step {
 public:
  virtual ~Step() = default;

  /// Right after the live layer's cold load, before its warm-up forward:
  /// what the load made.
  virtual void cold_loaded(ModeContext& /*mode*/) {}
  /// After the warm-up forward, before the capture: the baseline a step
  /// compares reloads with (what the capture bakes in).
  virtual void started(ModeContext& /*mode*/) {}
  /// Before the reload's load: what an engine does between reloads. False
  /// when the layer raised (layer_step_runs), which ends the mode.
  virtual bool before_reload(ModeContext& /*mode*/, const Reload& /*reload*/) { return true; }
  /// Right before the load and post-processing.
  virtual void before_load(ModeContext& /*mode*/, const Reload& /*reload*/) {}
  /// The load itself, for a step that loads the way an engine does (in
  /// parts, in another order): loads the reload's checkpoint into the live
  /// layer (SubjectLayer::load, any number of times) and returns true. False,
  /// the default, leaves it to the next step, and the protocol's own load of
  /// the whole checkpoint if none loads. Runs where the protocol's load
  /// would (inside the direct mode's scope); post-processing follows once.
  virtual bool load(ModeContext& /*mode*/, const Reload& /*reload*/) { return false; }
  /// Right after the load and post-processing, before anything else runs.
  virtual void after_load(ModeContext& /*mode*/, const Reload& /*reload*/) {}
  /// After the graph's replay and the reload's memory is recorded, before
  /// any forward: what the reload left.
  virtual void after_reload(ModeContext& /*mode*/, const Reload& /*reload*/) {}
  /// Right after the live forward, before the capture's replay runs its ops
  /// on the live tensors: what the forward left.
  virtual void after_forward(ModeContext& /*mode*/, const Reload& /*reload*/) {}

  /// What the step did before every reload, for the message of a reload
  /// that raised ("after a level-2 sleep"); empty when nothing.
  virtual std::string circumstance() const { return ""; }
};

/// What a step's value is.
enum class StepTakes {
  kSwitch,  ///< on or off (on is 1)
  kLevel,   ///< 1 to StepSpec::max_level
  kBytes,   ///< a number of bytes >= 0
};

/// What a step is to a run.
enum class StepKind {
  kEngine,  ///< does to the layer what an engine does between reloads
  kCheck,   ///< compares what the layer names (tensors, host numbers)
  kBound,   ///< bounds the memory a reload holds
};

/// A step as the step table lists it: everything the command line, the
/// Python module, the usage texts and the docs say of it, and how to make it.
struct StepSpec {
  /// The step's name: ReloadSteps' key and Python's keyword ("sleep").
  const char* name;
  /// The harness binaries' flag ("--sleep").
  const char* flag;
  /// What its value is, and for a level the deepest.
  StepTakes takes;
  int max_level;
  StepKind kind;
  /// One sentence: what the step does.
  const char* help;
  /// What a bug it finds looks like in a report (Markdown).
  const char* example;
  /// The step taken with `value` (valid for `takes`).
  std::unique_ptr<Step> (*make)(int64_t value);
};

}  // namespace reloadsafe::harness
