#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/protocol.h"

#include "conformance/harness/cold_loads.h"
#include "conformance/harness/cold_start.h"
#include "conformance/harness/device_graph.h"
#include "conformance/harness/digest.h"
#include "conformance/harness/forward_checks.h"
#include "conformance/harness/layer_life.h"
#include "conformance/harness/mode_memory.h"
#include "conformance/harness/step_table.h"
#include "conformance/harness/values.h"
#include "conformance/harness/violation_sink.h"
#include "conformance/trace/memory_census.h"
#include "conformance/trace/read_trace.h"
#include "conformance/trace/tensor_location.h"
#include "utils/reload_context.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::harness {
namespace {

using trace::CapturedRead;
using trace::TensorLocation;

// A block of bytes on the check's device that no layer has any business
// writing: a reload that scribbles outside its own tensors shows up here.
constexpr int64_t kCanaryBytes = 4096;
constexpr int kCanaryByte = 0x5a;

// Where each declared tensor is, by name. A Python subclass tensor is
// checked through its inner tensors, which the subject names; its own
// storage is nothing a kernel reads.
using Locations = std::vector<std::pair<std::string, TensorLocation>>;

Locations declared_locations(const std::vector<trace::NamedTensor>& named) {
  Locations out;
  for (const auto& n : named) {
    if (n.declared && trace::has_plain_storage(n.tensor)) {
      out.emplace_back(n.name, TensorLocation::of(n.tensor));
    }
  }
  return out;
}

// Names in `unchecked` (Note [State every forward makes] in
// forward_checks.cc) are compared on neither side.
void compare_declared(const Locations& before, const Locations& after,
                      const std::set<std::string>& unchecked, int reload, ViolationSink& sink) {
  auto find = [](const Locations& ls, const std::string& name) {
    return std::find_if(ls.begin(), ls.end(), [&](const auto& l) { return l.first == name; });
  };
  for (const auto& [name, b] : before) {
    if (unchecked.count(name) > 0) continue;
    auto it = find(after, name);
    if (it == after.end()) {
      sink.add(reload, name, "missing", b.layout(), "(no longer declared)");
      continue;
    }
    for (trace::LocationChange& c : b.diff(it->second)) {
      sink.add(reload, name, std::move(c.what), std::move(c.before), std::move(c.after));
    }
  }
  for (const auto& [name, a] : after) {
    if (unchecked.count(name) == 0 && find(before, name) == before.end()) {
      sink.add(reload, name, "new declared tensor", "(absent)", a.layout());
    }
  }
}

// The bytes `ckpt`'s tensors take.
size_t checkpoint_bytes(const Checkpoint& ckpt) {
  size_t bytes = 0;
  for (const auto& [name, t] : ckpt) bytes += static_cast<size_t>(t.numel()) * t.element_size();
  return bytes;
}

// The forward's input of a run, on the run's device.
at::Tensor draw_run_input(ReloadSubject& subject, const RunOptions& options) {
  return subject.draw_input(input_seed(options.seed)).to(options.device);
}

// Appends `e`'s whole message, every line of it, to `report`'s error, after
// any earlier one on a line of its own. A c10 error gives its message
// without the C++ backtrace LibTorch appends (frames inside LibTorch that
// say nothing about the subject).
void append_error(ModeReport& report, const std::string& prefix, const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!what.empty() && what.back() == '\n') what.pop_back();
  if (!report.error.empty()) report.error += '\n';
  report.error += valid_utf8(prefix + what);
}

// The device graph step (device_graph.h): the live forward captured as a
// graph once, after the trace capture. A forward that cannot be captured is
// a violation (null returned): an engine could not capture it either.
std::unique_ptr<CapturedDeviceGraph> capture_graph(const c10::Device& device, SubjectLayer& live,
                                                   const at::Tensor& x, ViolationSink& sink) {
  const DeviceGraphCapture capture = device_graph_capture(device.type());
  TORCH_CHECK(capture != nullptr, "the protocol on ", device.str(), " needs its graph step, and ",
              cuda_unavailable_reason());
  try {
    return capture(device, [&] { return live.forward(x); });
  } catch (const std::exception& e) {
    const std::string what = e.what();
    sink.add(0, "cuda graph", "capture failed", "", what.substr(0, what.find('\n')));
    return nullptr;
  }
}

// Note [A reload that raises]
// The cold load, its forward and the capture ran; a step of the live
// layer's reload that then raises (its load or post-processing, the sleep
// and wake before it, the forward after it) is the reload's bug (a
// post-processing that asserts on what a sleep zeroed), not bad input: a
// violation named "reload" at that reload, with the step and the first
// line of what it raised. The layer is left as the step left it, so the
// mode ends there; what was measured until then is judged.
// add_reload_raised records that violation for `what` (a step of the live
// layer's reload, named for the message) that raised `e` at reload `r`.
void add_reload_raised(ViolationSink& sink, int r, const std::string& what,
                       const std::vector<std::unique_ptr<Step>>& steps, const std::exception& e) {
  std::string when = "at reload " + std::to_string(r);
  for (const auto& step : steps) {
    const std::string circumstance = step->circumstance();
    if (!circumstance.empty()) when += ", " + circumstance;
  }
  sink.add(r, "reload", what + " raised where the cold load did not (" + when + ")", "",
           raised_text(e));
}

// What the modes of one run share: the subject's info, with what the first
// mode learnt (free names), the run's input (drawn by the first mode to
// start and never handed to the subject: each mode hands the forward a copy
// and keeps this one to tell whether the forward wrote its input), the
// cold-load outputs kept for the next mode, where the layers made aside come
// from, the blocks kept for reuse, and whether the run's one-time checks ran
// and what they refused.
struct RunShared {
  SubjectInfo info;
  ColdLoadOutputs cold_loads;
  AsideLayers aside;
  trace::ReuseCache* reuse;  // on the CPU: the freed blocks kept for reuse
  at::Tensor input;
  bool checked_once = false;
  std::string refused;  // what the one-time checks refused, if anything
};

// Runs `check`, one of the run's one-time checks of its cold load
// (cold_start.h), asked by its first mode, unless an earlier one refused:
// what they refuse is every mode's error.
template <typename F>
void check_once(RunShared& shared, F&& check) {
  if (!shared.refused.empty()) return;
  try {
    check();
  } catch (const c10::Error& e) {
    shared.refused = e.what_without_backtrace();
  }
}

// One mode of the protocol: start (cold load, warm-up, baseline, capture),
// one check per reload, then memory; the run's steps (step.h) hooked in at
// each phase.
class ModeRun final : public ModeContext {
 public:
  ModeRun(ReloadSubject& subject, RunShared& shared, ReloadMode mode, const RunOptions& options)
      : subject_(subject),
        shared_(shared),
        info_(shared.info),
        options_(options),
        mode_(mode),
        input_(shared.input),
        sink_(report_, options.max_listed),
        steps_(merge_steps(options.steps, shared.info.steps)),
        step_objects_(make_steps(steps_)),
        memory_(options, shared.info, shared.cold_loads, report_),
        forward_(*this, report_, shared.cold_loads, x_) {
    report_.mode = mode;
    report_.expected_to_pass =
        std::find(info_.modes.begin(), info_.modes.end(), mode) != info_.modes.end();
  }

  ModeReport run() {
    std::optional<CachesEmptied> mode_caches;  // each mode starts from empty caches
    try {
      mode_caches.emplace(subject_);
      start();
      for (int r = 1; r <= options_.reloads && !stopped_; ++r) check_reload(r);
      memory_.check(sink_);
    } catch (const std::exception& e) {
      append_error(report_, "", e);
    }
    // The mode lets go of its layer and puts the caches back however it
    // ended; a restore that fails is the mode's error too (after the run's
    // own, if any), since the next mode or run starts from what it left.
    forward_.release();
    graph_.reset();
    live_.reset();
    shared_.cold_loads.drop_offer();
    try {
      if (mode_caches) mode_caches->restore();
    } catch (const std::exception& e) {
      append_error(report_, "restoring the module caches: ", e);
    }
    return std::move(report_);
  }

  // What the steps see of the mode (ModeContext).
  ReloadSubject& subject() override { return subject_; }
  const SubjectInfo& info() const override { return info_; }
  const RunOptions& options() const override { return options_; }
  SubjectLayer& live() override { return *live_; }
  const at::Tensor& input() const override { return input_; }
  const std::vector<int64_t>& memory_bytes() const override { return report_.memory_bytes; }
  ViolationSink& sink() override { return sink_; }
  bool first_state_flag(const std::string& name) override {
    return flagged_state_.insert(name).second;
  }
  LayerState live_state() override { return layer_state(*live_, subject_.cache_tensors(), info_); }
  LayerState cold_state_aside(const Checkpoint& ckpt, int loads,
                              const at::Tensor& forward_input) override {
    return memory_.aside(
        [&] { return cold_state(shared_.aside, info_, ckpt, loads, forward_input); });
  }
  void compare_cold_state(const Reload& reload, const LayerState& live,
                          const std::function<void(const LayerState&)>& compare) override {
    ColdLoadOutputs& kept = shared_.cold_loads;
    const Checkpoint& ckpt = reload.checkpoint;
    const std::optional<uint64_t> digest = reload.checkpoint_digest;
    if (kept.matches_kept_state(reload.index, digest, input_, live)) return;
    // Note [One cold layer per reload]: its forward (on a copy: it may write
    // its input) serves the forward check, unless an earlier mode's is kept.
    const bool kept_forward = kept.has_kept_forward(reload.index, digest, input_);
    const at::Tensor x = kept_forward ? at::Tensor() : input_.clone();
    std::optional<at::Tensor> out = memory_.aside([&] {
      return cold_state_then_forward(
          shared_.aside, info_, ckpt,
          [&](const LayerState& cold) {
            kept.keep_state(reload.index, digest, input_, cold);
            compare(cold);
          },
          x);
    });
    if (out) kept.offer(reload.index, x, std::move(*out));
  }
  at::Tensor cold_forward_aside(const Checkpoint& ckpt, const at::Tensor& x, bool built) override {
    return memory_.aside([&] { return cold_forward(shared_.aside, ckpt, x, built); });
  }

  bool layer_step_runs(int r, const std::string& what, const std::function<void()>& run) override {
    try {
      run();
      return true;
    } catch (const std::exception& e) {
      add_reload_raised(sink_, r, what, step_objects_, e);
      stopped_ = true;
      return false;
    }
  }

 private:
  // Note [The cold load a run starts from]
  void start() {
    const uint64_t seed = options_.seed;
    const std::string seeds = "checkpoint seed " + std::to_string(seed) + ", input seed " +
                              std::to_string(input_seed(seed));
    if (!input_.defined()) {
      input_ = in_stage("drawing the input (" + seeds + ")",
                        [&] { return draw_run_input(subject_, options_); });
    }
    x_ = input_.clone();
    cold_load(seeds);
    if (!shared_.refused.empty()) C10_THROW_ERROR(Error, shared_.refused);
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    canary_ = at::full({kCanaryBytes}, kCanaryByte, bytes.device(options_.device));
    canary_bytes_ = at::full({kCanaryBytes}, kCanaryByte, bytes);
    // The declared baseline is taken after the warm-up, as the capture is;
    // so is every step's.
    declared_ = declared_locations(live_->named_tensors());
    for (const auto& step : step_objects_) step->started(*this);
    forward_.capture();
    forward_state_ = forward_.made_by_every_forward(live_->named_tensors());
    if (!options_.device.is_cpu()) graph_ = capture_graph(options_.device, *live_, x_, sink_);
    memory_.start();
  }

  // The live layer's cold load and warm-up, with what the run asks of its
  // first mode's: a copy tried (Note [Layers made aside by copying]) and
  // the one-time checks. What they make is let go of on return, before the
  // baseline: what the layer keeps of it counts.
  void cold_load(const std::string& seeds) {
    const bool once = !shared_.checked_once;
    std::optional<CheckpointDigest> first;  // the cold load's checkpoint, for the checks
    at::Tensor out;
    {
      const Checkpoint ckpt = in_stage("drawing the cold load's checkpoint (" + seeds + ")",
                                       [&] { return subject_.draw_checkpoint(options_.seed); });
      // Between two reloads a checkpoint is freed and the next reload draws
      // one again (Note [Reusing freed blocks]); a layer made aside is made
      // on its checkpoint (Note [A copy on its checkpoint]). No more: blocks
      // kept beyond what the next reload takes would add to its peak.
      if (shared_.reuse != nullptr) shared_.reuse->raise_limit(checkpoint_bytes(ckpt));
      // Note [The second mode's live layer]
      // The first mode's live layer is one the subject builds. The second's
      // is a copy of a layer as built where a copy has proven to load as a
      // built layer does (Note [Layers made aside by copying]) and the
      // subject claims both modes: for a real model building a layer is
      // the most a check costs beyond the reloads (initialising weights the
      // load overwrites), and the first mode has reloaded a built layer
      // already. A copy loads as a built layer does but need not reload as
      // one: a layer whose reload keeps state per layer object (vLLM's
      // layerwise reload) reloads wrongly as a copy, a false alarm of the
      // second mode only; a subject makes no copies of such a layer (the
      // Python package: layer_copies.reloads_by_identity). A subject that
      // claims one mode has a built layer in each.
      const bool copy = !once && shared_.aside.proven() && info_.modes.size() == 2;
      live_ = in_stage("the cold load's load or post-processing (" + seeds + ")", [&] {
        return copy ? cold_loaded(shared_.aside.new_copy(), ckpt) : cold_loaded(subject_, ckpt);
      });
      for (const auto& step : step_objects_) step->cold_loaded(*this);
      if (once) first.emplace(ckpt);  // before a copy may be made on it
      // Note [Layers made aside by copying]: the first cold load tries a
      // copy, on the checkpoint's tensors where nothing reads the checkpoint
      // after it (Note [A copy on its checkpoint]: the host numbers' check
      // does).
      const bool numbers = takes_kind(steps_, StepKind::kCheck);
      std::optional<at::Tensor> copied;
      if (shared_.aside.untried() && first) {
        copied = memory_.aside([&] {
          return shared_.aside.try_copy(*live_, ckpt, input_.clone(), info_, numbers,
                                        /*on_checkpoint=*/!numbers);
        });
      }
      out = in_stage("the cold load's forward (" + seeds + ")", [&] {
        return warm_up(*live_, x_, options_.trace && info_.warm_up_under_trace);
      });
      if (copied) {
        shared_.aside.settle(close(*copied, out), first->changed(ckpt).empty());
      }
      if (once) {
        shared_.checked_once = true;
        if (numbers) {
          check_once(shared_,
                     [&] { free_numbers_no_load_decides(*this, ckpt, shared_.info.free_names); });
        }
      }
    }
    // Reload 1's checkpoint is drawn once the cold load's is let go of: the
    // protocol holds one checkpoint at a time.
    if (once) {
      check_once(shared_, [&] {
        refuse_a_check_that_tests_nothing(*this, shared_.cold_loads, *first, out);
      });
    }
  }

  void check_reload(int r) {
    shared_.cold_loads.drop_offer();  // one a reload that raised left
    // What the checkpoint adds to the live bytes: there while the reload is
    // measured, not while the cold load was. Its digest, not a copy, tells
    // whether the reload wrote into it (Note [A digest instead of a copy]).
    const int64_t before_draw = memory_.live_bytes();
    const Checkpoint ckpt = subject_.draw_checkpoint(reload_seed(options_.seed, r));
    CheckpointDigest pristine(ckpt);
    Reload reload{r, ckpt, memory_.live_bytes() - before_draw, pristine.whole()};
    for (const auto& step : step_objects_) {
      if (!step->before_reload(*this, reload)) return;
    }
    for (const auto& step : step_objects_) step->before_load(*this, reload);
    const bool reloaded = layer_step_runs(r, "the reload", [&] {
      DirectReloadScope direct(mode_ == ReloadMode::kDirect);
      std::optional<trace::Quarantine::Capturing> capturing;
      if (trace::Quarantine* quarantine = memory_.quarantine()) capturing.emplace(*quarantine);
      const bool loaded = std::any_of(step_objects_.begin(), step_objects_.end(),
                                      [&](const auto& step) { return step->load(*this, reload); });
      if (!loaded) live_->load(ckpt);
      live_->process();
    });
    if (!reloaded) return;
    for (const auto& step : step_objects_) step->after_load(*this, reload);
    report_.reloads_done = r;
    // The graph replays first, before any other forward runs on the device:
    // what it reads is what the reload left (Note [Device quarantine]).
    at::Tensor replayed_graph;
    if (graph_) {
      replayed_graph = graph_->replay();
      ++report_.graph_replays;
    }
    // The state the capture made that later forwards rebound is the check's
    // (Note [State every forward makes] in forward_checks.cc).
    memory_.record(
        forward_state_.empty() ? 0 : forward_.state_only_the_capture_holds(live_->named_tensors()));
    // What the reload left, before any forward runs on it: state a forward
    // writes is not the reload's (and the capture's replay may write the
    // live layer's tensors). After the graph's replay, as every step that
    // allocates on the device is.
    for (const auto& step : step_objects_) step->after_reload(*this, reload);
    compare_declared(declared_, declared_locations(live_->named_tensors()), forward_state_, r,
                     sink_);
    // The loaders and post-processing must not write into the checkpoint.
    for (const std::string& n : pristine.changed(ckpt)) {
      sink_.add(r, "checkpoint:" + n, "bytes changed", "", "");
      reload.checkpoint_digest.reset();  // no longer what cold loads are kept by
    }
    if (!same_bytes(x_, input_)) sink_.add(r, "input", "bytes changed", "", "");
    if (!same_bytes(canary_, canary_bytes_)) sink_.add(r, "canary", "bytes changed", "", "");
    forward_.check(reload, replayed_graph, [&] {
      for (const auto& step : step_objects_) step->after_forward(*this, reload);
    });
    // Note [A mode not claimed]
    // A mode the subject does not claim (SubjectInfo::modes) runs to tell
    // whether it keeps every address anyway; the verdict leaves it out. Its
    // first reload with a violation answers that, and each further reload
    // would repeat the answer at the cost of a whole reload and its report:
    // the mode ends there, and reloads_done says where.
    if (!report_.expected_to_pass && report_.violation_count > 0) stopped_ = true;
  }

  ReloadSubject& subject_;
  RunShared& shared_;
  const SubjectInfo& info_;  // shared_.info
  const RunOptions& options_;
  const ReloadMode mode_;
  at::Tensor& input_;  // the run's input as drawn, which x_ must still equal
  at::Tensor x_;       // the copy of input_ the forward is handed
  ModeReport report_;
  ViolationSink sink_;
  const ReloadSteps steps_;                                // the run's and the subject's
  const std::vector<std::unique_ptr<Step>> step_objects_;  // steps_, in step-table order
  ModeMemory memory_;
  ForwardChecks forward_;
  std::shared_ptr<SubjectLayer> live_;   // the layer the mode reloads
  std::set<std::string> flagged_state_;  // first_state_flag
  at::Tensor canary_, canary_bytes_;
  Locations declared_;
  std::set<std::string> forward_state_;         // ForwardChecks::made_by_every_forward
  std::unique_ptr<CapturedDeviceGraph> graph_;  // on a device: the captured graph
  bool stopped_ = false;                        // Note [A reload that raises]
};

}  // namespace

BackendReport run_subject(ReloadSubject& subject, const RunOptions& options) {
  const SubjectInfo info = subject.info();
  check_steps(merge_steps(options.steps, info.steps));
  BackendReport report;
  report.name = info.name;
  report.description = info.description;
  report.negative_control = info.negative_control;
  report.expected_violation = info.expected_violation;
  // Large CPU blocks freed by one step are reused by the next (Note [Reusing
  // freed blocks]), across both modes.
  std::optional<trace::ReuseCache> reuse;
  if (options.device.is_cpu()) reuse.emplace();
  RunShared shared{info,
                   ColdLoadOutputs(/*keep=*/options.device.is_cpu()),
                   AsideLayers(subject),
                   reuse ? &*reuse : nullptr,
                   {},
                   false,
                   {}};
  for (ReloadMode mode : {ReloadMode::kNormal, ReloadMode::kDirect}) {
    report.modes.push_back(ModeRun(subject, shared, mode, options).run());
  }
  return report;
}

std::vector<CapturedRead> captured_reads(ReloadSubject& subject, const RunOptions& options) {
  const at::Tensor x = draw_run_input(subject, options);
  CachesEmptied caches(subject);
  std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, subject.draw_checkpoint(options.seed));
  warm_up(*layer, x, options.trace && subject.info().warm_up_under_trace);
  std::vector<CapturedRead> reads;
  {
    const ForwardCapture c = capture_forward(*layer, x);
    reads = c.forward->reads(*c.names);
  }
  layer.reset();
  caches.restore();
  return reads;
}

}  // namespace reloadsafe::harness
