#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/protocol.h"

#include "conformance/harness/cold_loads.h"
#include "conformance/harness/device_graph.h"
#include "conformance/harness/layer_life.h"
#include "conformance/harness/layer_state.h"
#include "conformance/harness/reload_steps.h"
#include "conformance/harness/values.h"
#include "conformance/trace/capture.h"
#include "conformance/trace/memory_census.h"
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

using trace::CapturedForward;
using trace::CapturedRead;
using trace::kOpSequence;
using trace::TensorLocation;
using trace::TensorNames;

// A block of bytes on the check's device that no layer has any business
// writing: a reload that scribbles outside its own tensors shows up here.
constexpr int64_t kCanaryBytes = 4096;
constexpr int kCanaryByte = 0x5a;

// Counts every violation and every flagged name; lists the first few.
class ViolationSink {
 public:
  ViolationSink(ModeReport& report, int max_listed) : report_(report), max_listed_(max_listed) {}

  void add(Violation v) {
    for (std::string* text : {&v.tensor, &v.what, &v.before, &v.after, &v.read}) {
      *text = valid_utf8(std::move(*text));
    }
    ++report_.violation_count;
    flag(v.tensor);
    flag(v.read);
    if (static_cast<int>(report_.violations.size()) < max_listed_) {
      report_.violations.push_back(std::move(v));
    }
  }
  /// Whether the next violation is listed (and so worth its before and
  /// after): listing stops at max_listed, counting and flagging do not.
  bool listing() const { return static_cast<int>(report_.violations.size()) < max_listed_; }

  void add(int reload, std::string tensor, std::string what, std::string before, std::string after,
           std::string read = "") {
    add(Violation{reload, std::move(tensor), std::move(what), std::move(before), std::move(after),
                  std::move(read)});
  }

 private:
  void flag(const std::string& s) {
    if (s.empty()) return;
    if (std::find(report_.flagged.begin(), report_.flagged.end(), s) == report_.flagged.end()) {
      report_.flagged.push_back(s);
    }
  }
  ModeReport& report_;
  int max_listed_;
};

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

void compare_declared(const Locations& before, const Locations& after, int reload,
                      ViolationSink& sink) {
  auto find = [](const Locations& ls, const std::string& name) {
    return std::find_if(ls.begin(), ls.end(), [&](const auto& l) { return l.first == name; });
  };
  for (const auto& [name, b] : before) {
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
    if (find(before, name) == before.end()) {
      sink.add(reload, name, "new declared tensor", "(absent)", a.layout());
    }
  }
}

// The captured forward and the names its reads are given.
struct Capture {
  std::unique_ptr<TensorNames> names;
  std::unique_ptr<CapturedForward> forward;
};

Capture capture(SubjectLayer& layer, const at::Tensor& x) {
  Capture c;
  c.names = std::make_unique<TensorNames>(layer.named_tensors());
  for (const trace::NamedObject& o : layer.named_objects()) c.names->add_object(o.name, o.identity);
  c.names->add("input", x, /*declared=*/true);
  c.forward = std::make_unique<CapturedForward>([&] { return layer.forward(x); });
  return c;
}

// Counts the distinct tensors the capture reads from outside (the input
// excluded), warns once for each undeclared one, and refuses a forward the
// trace cannot see.
void count_reads(const Capture& c, ModeReport& report) {
  // Counted without formatting a read; formatted again only to warn.
  std::vector<CapturedRead> reads = c.forward->reads(*c.names, /*details=*/false);
  DistinctReads distinct = distinct_reads(reads);
  if (!distinct.undeclared.empty()) {
    reads = c.forward->reads(*c.names);
    distinct = distinct_reads(reads);
  }
  for (const CapturedRead* r : distinct.undeclared) {
    report.warnings.push_back(Warning{
        r->name, r->op,
        "read but not declared (" + r->layout +
            "); checked like a declared tensor; declare it if the forward is meant to read it"});
  }
  report.declared_reads = static_cast<int>(distinct.declared.size());
  report.undeclared_reads = static_cast<int>(distinct.undeclared.size());
  const size_t ops = c.forward->trace().ops().size();
  TORCH_CHECK(ops > 0,
              "the forward ran no operator on the calling thread: if it runs its ops on another "
              "thread (a thread pool, an executor, a background stream), the read trace cannot "
              "see them (it records the calling thread only); run the forward's ops on the "
              "thread that calls it while checking");
  TORCH_CHECK(!distinct.declared.empty() || !distinct.undeclared.empty(),
              "the forward reads no tensor besides its input (", ops,
              " ops traced): it must read the layer's weights through dispatcher ops; a kernel "
              "launched without the dispatcher, or ops run on another thread, are invisible to "
              "the trace");
}

// The forward's input of a run, on the run's device.
at::Tensor draw_run_input(ReloadSubject& subject, const RunOptions& options) {
  return subject.draw_input(input_seed(options.seed)).to(options.device);
}

// The live layer every capture starts from: a cold load of the run's first
// checkpoint, and its warm-up, the forward run on `x`. `loaded`, if given,
// runs between the two: what the layer holds then is what its load made.
std::shared_ptr<SubjectLayer> cold_load_and_warm_up(
    ReloadSubject& subject, const RunOptions& options, const at::Tensor& x, bool under_trace,
    const std::function<void(SubjectLayer&)>& loaded = {}) {
  std::shared_ptr<SubjectLayer> layer = cold_loaded(subject, subject.draw_checkpoint(options.seed));
  if (loaded) loaded(*layer);
  // Engines run the forward before they capture; state it makes and keeps
  // (a workspace, a first-forward repack) belongs to the capture.
  layer->forward(x);
  if (options.trace && under_trace) {
    // Note [A warm-up under the trace's key]
    // Code that depends on the thread's dispatch keys runs otherwise under
    // the trace, whose key is on: torch.compile's guards include the keys,
    // so a compiled function compiles a variant of its own the first time
    // it runs traced, and that variant's first run takes paths later runs
    // do not (AOTAutograd's first call). An engine warms up every variant it
    // captures; the protocol warms this one up too, under a trace that
    // records nothing beyond the top-level calls and is dropped, so the
    // capture sees what every later forward runs. Only for a subject that
    // says its forward may be such code (SubjectInfo::warm_up_under_trace):
    // for any other it is a forward more, and nothing to see.
    trace::ReadTrace warm_up(trace::ReadTrace::Options{/*nested=*/false, /*hook=*/nullptr});
    layer->forward(x);
  }
  return layer;
}

// One mode of the protocol, as its steps: start (cold load, warm-up,
// baseline, capture), one check per reload, then memory.
class ModeRun {
 public:
  // `input`: the run's input (draw_run_input), drawn by the first mode to
  // start and never handed to the subject: each mode hands the forward a
  // copy and keeps this one to tell whether the forward wrote its input.
  ModeRun(ReloadSubject& subject, const SubjectInfo& info, ReloadMode mode,
          const RunOptions& options, ColdLoadOutputs& cold_loads, at::Tensor& input)
      : subject_(subject),
        options_(options),
        cold_loads_(cold_loads),
        mode_(mode),
        input_(input),
        sink_(report_, options.max_listed),
        info_(info),
        steps_(options.steps.merged_with(info.steps)) {
    report_.mode = mode;
    report_.expected_to_pass =
        std::find(info.modes.begin(), info.modes.end(), mode) != info.modes.end();
  }

  ModeReport run() {
    // The census counts live CPU bytes while the mode runs; storages a reload
    // frees are poisoned and held (Note [Poison quarantine]). Both end with
    // the mode, leaving the process's allocator as it was.
    if (options_.device.is_cpu()) {
      census_.emplace();
      quarantine_.emplace();
    }
    std::optional<CachesEmptied> mode_caches;  // each mode starts from empty caches
    try {
      mode_caches.emplace(subject_);
      start();
      for (int r = 1; r <= options_.reloads && !stopped_; ++r) check_reload(r);
      check_memory();
    } catch (const std::exception& e) {
      add_error("", e);
    }
    // The mode lets go of its layer and puts the caches back however it
    // ended; a restore that fails is the mode's error too (after the run's
    // own, if any), since the next mode or run starts from what it left.
    capture_ = Capture{};
    graph_.reset();
    live_.reset();
    try {
      if (mode_caches) mode_caches->restore();
    } catch (const std::exception& e) {
      add_error("restoring the module caches: ", e);
    }
    return std::move(report_);
  }

 private:
  // Appends `e`'s whole message, every line of it, to the mode's error, after
  // any earlier one on a line of its own. A c10 error gives its message
  // without the C++ backtrace LibTorch appends (frames inside LibTorch that
  // say nothing about the subject).
  void add_error(const std::string& prefix, const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
    while (!what.empty() && what.back() == '\n') what.pop_back();
    if (!report_.error.empty()) report_.error += '\n';
    report_.error += valid_utf8(prefix + what);
  }

  void start() {
    if (!input_.defined()) input_ = draw_run_input(subject_, options_);
    x_ = input_.clone();
    live_ = cold_load_and_warm_up(subject_, options_, x_, info_.warm_up_under_trace,
                                  [&](SubjectLayer& layer) {
                                    if (steps_.sleep_level == 1) remember_loaded_storages(layer);
                                  });
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    canary_ = at::full({kCanaryBytes}, kCanaryByte, bytes.device(options_.device));
    canary_bytes_ = at::full({kCanaryBytes}, kCanaryByte, bytes);
    // The declared baseline is taken after the warm-up, as the capture is;
    // so are the host numbers the capture bakes in.
    declared_ = declared_locations(live_->named_tensors());
    if (steps_.host_numbers) captured_numbers_ = checked_numbers(*live_, info_);
    TORCH_CHECK(!steps_.recreate_parameters || !live_->parameters().empty(),
                "recreate_parameters: the subject names no registered parameters "
                "(SubjectLayer::parameters), so none can be re-created");
    if (options_.trace) {
      capture_ = capture(*live_, x_);
      count_reads(capture_, report_);
    }
    if (!options_.device.is_cpu()) capture_graph();
    // Cold-load outputs kept for the next mode are not the subject's (Note
    // [One cold load per checkpoint]).
    kept_before_ = cold_loads_.kept_bytes();
    record_memory();
  }

  void check_reload(int r) {
    // What the checkpoint and its snapshots add to the live bytes: there
    // while the reload is measured, not while the cold load was.
    const int64_t before_draw = live_bytes();
    const Checkpoint ckpt = subject_.draw_checkpoint(reload_seed(options_.seed, r));
    std::map<std::string, Snapshot> pristine;
    for (const auto& [n, t] : ckpt) pristine.emplace(n, Snapshot(t));
    const int64_t checkpoint_bytes = live_bytes() - before_draw;
    if (!before_reload(r)) return;
    const int64_t before_load = live_bytes();
    if (steps_.reload_peak_budget_bytes) trace::take_peak_tensor_bytes(options_.device);
    const bool reloaded = layer_step_runs(r, "the reload", [&] {
      DirectReloadScope direct(mode_ == ReloadMode::kDirect);
      std::optional<trace::Quarantine::Capturing> capturing;
      if (quarantine_) capturing.emplace(*quarantine_);
      live_->load(ckpt);
      live_->process();
    });
    if (!reloaded) return;
    if (steps_.reload_peak_budget_bytes) check_peak(r, before_load);
    report_.reloads_done = r;
    // The graph replays first, before any other forward runs on the device:
    // what it reads is what the reload left (Note [Device quarantine]).
    at::Tensor replayed_graph;
    if (graph_) {
      replayed_graph = graph_->replay();
      ++report_.graph_replays;
    }
    record_memory();
    if (steps_.cold_footprint_tolerance_bytes) check_footprint(r, checkpoint_bytes);
    // What the reload left, before any forward runs on it: state a forward
    // writes is not the reload's (and the capture's replay may write the
    // live layer's tensors). After the graph's replay, as every step that
    // allocates on the device is.
    if (steps_.host_numbers) check_host_numbers(r);
    if (steps_.compare_state) check_state(r, ckpt);
    compare_declared(declared_, declared_locations(live_->named_tensors()), r, sink_);
    for (const auto& [n, t] : ckpt) {
      // The loaders and post-processing must not write into the checkpoint.
      if (!pristine.at(n).unchanged(t)) sink_.add(r, "checkpoint:" + n, "bytes changed", "", "");
    }
    if (!same_bytes(x_, input_)) sink_.add(r, "input", "bytes changed", "", "");
    if (!same_bytes(canary_, canary_bytes_)) sink_.add(r, "canary", "bytes changed", "", "");
    check_forward(r, ckpt, replayed_graph);
  }

  // Note [A reload that raises]
  // The cold load, its forward and the capture ran; a step of the live
  // layer's reload that then raises (its load or post-processing, the sleep
  // and wake before it, the forward after it) is the reload's bug (a
  // post-processing that asserts on what a sleep zeroed), not bad input: a
  // violation named "reload" at that reload, with the step and the first
  // line of what it raised. The layer is left as the step left it, so the
  // mode ends there; what was measured until then is judged.
  template <typename F>
  bool layer_step_runs(int r, const char* step, F&& run) {
    try {
      run();
      return true;
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
      what = what.substr(0, what.find('\n'));
      std::string when = "at reload " + std::to_string(r);
      if (steps_.sleep_level > 0) {
        when += ", after a level-" + std::to_string(steps_.sleep_level) + " sleep";
      }
      if (steps_.recreate_parameters) when += ", parameters re-created";
      sink_.add(r, "reload",
                std::string(step) + " raised where the cold load did not (" + when + ")", "",
                valid_utf8(what));
      stopped_ = true;
      return false;
    }
  }

  // What the live layer holds, its module caches' tensors included.
  LayerState live_state() { return layer_state(*live_, subject_.cache_tensors(), info_); }

  // Right after the live forward, before the capture's replay runs its ops
  // on the live tensors: the layer against a cold load that ran one forward
  // on the same input; each name flagged once, as compare_state's are.
  void check_forward_state(int r, const Checkpoint& ckpt) {
    const LayerState live = live_state();
    const at::Tensor x = input_.clone();  // the aside forward may write its input
    const LayerState cold = aside([&] { return cold_state(subject_, info_, ckpt, 1, x); });
    for (const StateDifference& d : state_differences(live, cold)) {
      if (!flagged_state_.insert(d.name).second) continue;
      sink_.add(r, d.name,
                "after the forward, differs from a cold load of the same checkpoint after one "
                "forward",
                d.before, d.after);
    }
  }

  // The steps an engine takes between reloads, when asked (reload_steps.h):
  // sleep and wake, then parameters re-created for a layerwise reload. False
  // when the subject's own sleep and wake raised (Note [A reload that
  // raises]).
  bool before_reload(int r) {
    bool own_sleep = false;
    if (steps_.sleep_level > 0 &&
        !layer_step_runs(r, "the subject's sleep and wake before it",
                         [&] { own_sleep = live_->sleep_and_wake(steps_.sleep_level); })) {
      return false;
    }
    if (steps_.sleep_level > 0 && !own_sleep) {
      std::vector<trace::NamedTensor> reached = live_->named_tensors();
      std::vector<trace::NamedTensor> caches = subject_.cache_tensors();
      reached.insert(reached.end(), caches.begin(), caches.end());
      std::vector<at::Tensor> restored = live_->buffers();
      if (steps_.sleep_level == 1) {
        // Level 1 keeps the weights' memory on the host while asleep: all
        // the load made comes back, parameters, buffers and any other
        // storage the layer reached right after its cold load (a quant
        // state, a kernel object's table); what a forward made since does
        // not.
        std::set<const c10::StorageImpl*> loaded;
        for (const auto& weak : loaded_storages_) {
          if (auto storage = weak.lock()) loaded.insert(storage.get());
        }
        for (const trace::NamedTensor& n : reached) {
          if (n.tensor.defined() && n.tensor.has_storage() &&
              loaded.count(n.tensor.storage().unsafeGetStorageImpl()) > 0) {
            restored.push_back(n.tensor);
          }
        }
        std::vector<at::Tensor> params = live_->parameters();
        restored.insert(restored.end(), params.begin(), params.end());
      }
      sleep_and_wake(reached, restored);
    }
    if (steps_.recreate_parameters) recreate_parameters(live_->parameters());
    return true;
  }

  // For sleep level 1: the storages the layer reaches right after its cold
  // load, held weakly (a storage the layer lets go of is not kept alive).
  void remember_loaded_storages(SubjectLayer& layer) {
    for (const trace::NamedTensor& n : layer.named_tensors()) {
      if (n.tensor.defined() && n.tensor.has_storage()) {
        loaded_storages_.emplace_back(n.tensor.storage().getWeakStorageImpl());
      }
    }
  }

  // Live bytes on the run's device, 0 where they are not counted.
  int64_t live_bytes() const { return trace::live_tensor_bytes(options_.device).value_or(0); }

  // The most a reload held above what was live before it, against the
  // budget; flagged at the first reload over, once per mode.
  void check_peak(int r, int64_t before) {
    const std::optional<int64_t> peak = trace::take_peak_tensor_bytes(options_.device);
    if (!peak || over_peak_) return;
    const int64_t extra = *peak - before;
    if (extra <= *steps_.reload_peak_budget_bytes) return;
    over_peak_ = true;
    sink_.add(r, "memory",
              "peak during reload " + std::to_string(r) + " is " + std::to_string(extra) +
                  " bytes above the bytes live before it, over the budget of " +
                  std::to_string(*steps_.reload_peak_budget_bytes),
              std::to_string(before) + " B before the reload",
              std::to_string(*peak) + " B at its peak");
  }

  // The bytes live after reload r (its checkpoint's own not counted) against
  // the cold load's; flagged at the first reload over, once per mode.
  void check_footprint(int r, int64_t checkpoint_bytes) {
    const std::vector<int64_t>& bytes = report_.memory_bytes;
    if (bytes.size() < 2 || over_footprint_) return;
    const int64_t size = bytes.back() - checkpoint_bytes;
    const int64_t over = size - bytes.front();
    if (over <= *steps_.cold_footprint_tolerance_bytes) return;
    over_footprint_ = true;
    sink_.add(r, "memory",
              "footprint after reload " + std::to_string(r) + " exceeds the cold load's by " +
                  std::to_string(over) + " bytes",
              std::to_string(bytes.front()) + " B after the cold load",
              std::to_string(size) + " B after reload " + std::to_string(r));
  }

  // Every host number keeps its captured value; each name is flagged at
  // the first reload that changes it.
  void check_host_numbers(int r) {
    for (const NamedNumber& n : checked_numbers(*live_, info_)) {
      const auto old = std::find_if(captured_numbers_.begin(), captured_numbers_.end(),
                                    [&](const NamedNumber& c) { return c.name == n.name; });
      if (old == captured_numbers_.end() || flagged_numbers_.count(n.name) > 0) continue;
      if (old->value == n.value || (std::isnan(old->value) && std::isnan(n.value))) continue;
      flagged_numbers_.insert(n.name);
      sink_.add(r, n.name,
                "host number changed since the capture (a captured graph keeps the old value)",
                format_number(*old), format_number(n));
    }
  }

  // The live layer against a cold load of the same checkpoint, by name;
  // each name is flagged at the first reload where it differs.
  void check_state(int r, const Checkpoint& ckpt) {
    const LayerState live = live_state();
    const LayerState cold = aside([&] { return cold_state(subject_, info_, ckpt, 1, {}); });
    const std::vector<StateDifference> differences = state_differences(live, cold);
    if (differences.empty()) return;
    if (!not_idempotent_) {
      // Asked once per mode, of the first checkpoint that shows a difference.
      not_idempotent_.emplace();
      const LayerState twice = aside([&] { return cold_state(subject_, info_, ckpt, 2, {}); });
      for (const StateDifference& d : state_differences(twice, cold)) {
        not_idempotent_->insert(d.name);
      }
    }
    for (const StateDifference& d : differences) {
      if (!flagged_state_.insert(d.name).second) continue;
      const bool twice = not_idempotent_->count(d.name) > 0;
      sink_.add(r, d.name,
                twice ? "not idempotent: loading the same checkpoint twice gives another value "
                        "than loading it once"
                      : "differs from a cold load of the same checkpoint",
                d.before, d.after);
    }
  }

  // The device graph step (device_graph.h): the live forward captured as a
  // graph once, after the trace capture. A forward that cannot be captured
  // is a violation: an engine could not capture it either.
  void capture_graph() {
    const DeviceGraphCapture capture = device_graph_capture(options_.device.type());
    TORCH_CHECK(capture != nullptr, "the protocol on ", options_.device.str(),
                " needs its graph step, and ", cuda_unavailable_reason());
    try {
      graph_ = capture(options_.device, [&] { return live_->forward(x_); });
    } catch (const std::exception& e) {
      const std::string what = e.what();
      sink_.add(0, "cuda graph", "capture failed", "", what.substr(0, what.find('\n')));
    }
  }

  // The live forward (retraced against the capture) and the replay of the
  // capture, each against a cold load of the same checkpoint.
  // `replayed_graph`: the device graph's output after this reload, or
  // undefined where no graph was captured.
  void check_forward(int r, const Checkpoint& ckpt, const at::Tensor& replayed_graph) {
    at::Tensor out;
    bool replays_as_retraced = false;
    bool follows_the_weights = false;
    if (options_.trace) {
      trace::CheckingRetrace retrace(*capture_.forward);
      const bool ran =
          layer_step_runs(r, "the forward after the reload", [&] { out = live_->forward(x_); });
      retrace.stop();
      if (!ran) return;
      if (steps_.compare_forward_state) check_forward_state(r, ckpt);
      const bool details = sink_.listing();
      std::vector<trace::ReadChange> changes =
          capture_.forward->compare(retrace, *capture_.names, details);
      const auto sequence = std::find_if(changes.begin(), changes.end(),
                                         [](const auto& c) { return c.tensor == kOpSequence; });
      if (sequence != changes.end() && sequence_follows_the_weights(retrace, ckpt)) {
        follows_the_weights = true;
        warn_sequence_follows_the_weights(*sequence);
        changes.erase(std::remove_if(changes.begin(), changes.end(),
                                     [](const auto& c) { return c.tensor == kOpSequence; }),
                      changes.end());
      }
      for (trace::ReadChange& c : changes) {
        sink_.add(r, std::move(c.tensor), std::move(c.what), std::move(c.before),
                  std::move(c.after), std::move(c.read));
      }
      replays_as_retraced = capture_.forward->replays_as(retrace);
    } else {
      if (!layer_step_runs(r, "the forward after the reload", [&] { out = live_->forward(x_); })) {
        return;
      }
      if (steps_.compare_forward_state) check_forward_state(r, ckpt);
    }
    const at::Tensor expected = cold_loads_.forward(
        r, ckpt, x_, [&] { return aside([&] { return cold_forward(subject_, ckpt, x_); }); });
    const bool out_close = close(out, expected);
    if (!out_close) {
      sink_.add(r, "forward", "differs from a cold load of the same checkpoint", "cold load",
                sink_.listing() ? max_diff(out, expected) : "");
    }
    if (options_.trace && !follows_the_weights) {
      check_replay(r, expected, replays_as_retraced ? &out : nullptr, out_close);
    }
    if (replayed_graph.defined() && !close(replayed_graph, expected)) {
      sink_.add(r, "cuda graph replay",
                "the captured graph, replayed, differs from a cold load (it read an address the "
                "reload abandoned, or a tensor the reload did not refill)",
                "cold load", sink_.listing() ? max_diff(replayed_graph, expected) : "");
    }
  }

  // Note [An op sequence that follows the weights]
  // Some forwards choose their ops by the values they compute: an MoE layer
  // written with a loop over the experts that received tokens (Hugging
  // Face's Qwen2-MoE and Mixtral) runs other ops when new weights route the
  // tokens otherwise. Such a retrace differs from the capture in its op
  // sequence after a correct reload. A CUDA graph cannot capture such a
  // forward as one graph (it replays one sequence), so the change is no
  // reload bug: it is a property of the forward, and the protocol tells the
  // two apart by asking a cold load of the same checkpoint, traced, on the
  // same input: if it runs the retrace's ops, and the capture read a value
  // on the host before the first op that changed (without which no value
  // could have chosen the ops: a reload that moved work from its
  // post-processing into the forward changes ops from the first), the
  // sequence follows the weights. The reads before the first changed op
  // are still compared, and every named tensor's location; the replay of
  // the capture (one routing) is not compared with a forward that routes
  // otherwise. Otherwise the change is the reload's, and a violation.
  bool sequence_follows_the_weights(const trace::CheckingRetrace& retrace, const Checkpoint& ckpt) {
    const at::Tensor x = input_.clone();  // the aside forward may write its input
    trace::ReadTrace cold;
    aside([&] { return cold_forward(subject_, ckpt, x); });
    cold.stop();
    return capture_.forward->follows_values(retrace, cold.ops());
  }

  void warn_sequence_follows_the_weights(const trace::ReadChange& change) {
    if (warned_sequence_) return;
    warned_sequence_ = true;
    report_.warnings.push_back(Warning{
        std::string(kOpSequence), "",
        "the forward's ops follow the weights' values (" + change.what +
            (change.before.empty() ? "" : ": " + change.before + " -> " + change.after) +
            ", and a cold load of the same checkpoint runs the same ops): control flow that "
            "reads tensor values (an MoE loop over the experts that got tokens) cannot be "
            "captured as one CUDA graph; named tensors and the reads before that op are "
            "checked, the capture's replay is not"});
  }

  // `retraced`: the retraced forward's output, when the retrace made exactly
  // the captured calls (CapturedForward::replays_as). After the first
  // reload's replay has run, that output is taken as the replay's instead of
  // running the ops again: the same ops on the same bytes (Note [A retrace
  // that is its own replay] in capture.cc). `retraced_close`: whether that
  // output is close to `expected` (check_forward has compared them).
  void check_replay(int r, const at::Tensor& expected, const at::Tensor* retraced,
                    bool retraced_close) {
    std::optional<at::Tensor> replayed;
    std::string why;
    bool replayed_close = false;
    if (retraced != nullptr && replayed_once_) {
      replayed = *retraced;
      replayed_close = retraced_close;
    } else {
      replayed = capture_.forward->replay(&why);
      if (replayed) replayed_close = close(*replayed, expected);
    }
    if (!replayed) {
      if (r == 1) report_.warnings.push_back(Warning{"replay", "", "not replayed: " + why});
      return;
    }
    replayed_once_ = true;
    if (!replayed_close) {
      sink_.add(r, "replay", "the captured ops, replayed, differ from a cold load (a stale read)",
                "cold load", sink_.listing() ? max_diff(*replayed, expected) : "");
    }
  }

  // Note [What the layers made aside keep]
  // Each reload is compared with layers the protocol builds aside (cold
  // loads, and the cold states of compare_state). A factory or a library
  // that keeps every layer it builds (a module-level registry, a cache keyed
  // by layer) keeps those alive too, which is a leak of theirs and not the
  // reload's: a reload that keeps its memory must not be flagged for it. On
  // the CPU the census tells the two apart by when a block was allocated:
  // what the aside steps allocated and is still alive is counted apart
  // (the kept cold-load outputs, counted already, left out), and its growth
  // is a warning naming the layers made aside; the rest is the live layer's.
  // Elsewhere (the device's allocator has no such record) it stays in the
  // reload's count.
  template <typename F>
  auto aside(F&& step) -> decltype(step()) {
    const std::optional<uint64_t> from = census_ ? trace::cpu_allocation_epoch() : std::nullopt;
    auto out = step();
    if (from) {
      const uint64_t to = trace::cpu_allocation_epoch().value_or(*from);
      if (to > *from) aside_epochs_.emplace_back(*from, to);
    }
    return out;
  }

  int64_t aside_live_bytes() const {
    if (aside_epochs_.empty()) return 0;
    return trace::live_cpu_bytes_allocated_in(aside_epochs_, cold_loads_.kept_data()).value_or(0);
  }

  void record_memory() {
    if (auto bytes = trace::live_tensor_bytes(options_.device)) {
      const int64_t made_aside = aside_live_bytes();
      aside_bytes_.push_back(made_aside);
      report_.memory_bytes.push_back(*bytes - (cold_loads_.kept_bytes() - kept_before_) -
                                     made_aside);
    }
  }

  // Growth after the first reload: the cold load and the first reload may
  // legitimately allocate (a storage released by the first post-processing
  // is re-made by the first load).
  void check_memory() {
    const std::vector<int64_t>& bytes = report_.memory_bytes;
    if (bytes.size() < 3) return;
    if (aside_bytes_.back() - aside_bytes_[1] > info_.memory_tolerance_bytes) {
      report_.warnings.push_back(
          Warning{"memory", "",
                  "layers built aside (the check's cold loads) keep " +
                      std::to_string(aside_bytes_.back() - aside_bytes_[1]) + " bytes alive over " +
                      std::to_string(options_.reloads - 1) + " reloads (" +
                      std::to_string(aside_bytes_[1]) + " B after reload 1 -> " +
                      std::to_string(aside_bytes_.back()) + " B after reload " +
                      std::to_string(options_.reloads) +
                      ") after the check let go of them: the layer factory or a library keeps each "
                      "layer it builds (a registry, a cache keyed by layer). Not counted as the "
                      "reloads' growth; an engine that builds one layer does not grow with it"});
    }
    const int64_t first = bytes[1];
    const int64_t last = bytes.back();
    if (last - first <= info_.memory_tolerance_bytes) return;
    sink_.add(options_.reloads, "memory",
              "grew by " + std::to_string(last - first) + " bytes over " +
                  std::to_string(options_.reloads - 1) + " reloads",
              std::to_string(first) + " B after reload 1",
              std::to_string(last) + " B after reload " + std::to_string(options_.reloads));
  }

  ReloadSubject& subject_;
  const RunOptions& options_;
  ColdLoadOutputs& cold_loads_;
  const ReloadMode mode_;
  at::Tensor& input_;  // the run's input as drawn, which x_ must still equal
  at::Tensor x_;       // the copy of input_ the forward is handed
  ModeReport report_;
  ViolationSink sink_;
  const SubjectInfo& info_;
  const ReloadSteps steps_;
  std::shared_ptr<SubjectLayer> live_;                   // the layer the mode reloads
  std::vector<NamedNumber> captured_numbers_;            // host_numbers: as captured
  std::set<std::string> flagged_numbers_;                // host_numbers: names flagged
  std::set<std::string> flagged_state_;                  // compare_state: names flagged
  std::optional<std::set<std::string>> not_idempotent_;  // compare_state, once asked
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> loaded_storages_;  // sleep level 1
  bool over_peak_ = false;
  bool over_footprint_ = false;
  std::optional<trace::CpuCensusScope> census_;
  std::optional<trace::Quarantine> quarantine_;
  at::Tensor canary_, canary_bytes_;
  Locations declared_;
  Capture capture_;
  std::unique_ptr<CapturedDeviceGraph> graph_;  // on a device: the captured graph
  bool replayed_once_ = false;  // a replay of the capture ran and returned an output
  int64_t kept_before_ = 0;
  bool warned_sequence_ = false;                 // Note [An op sequence that follows the weights]
  bool stopped_ = false;                         // Note [A reload that raises]
  std::vector<trace::EpochRange> aside_epochs_;  // Note [What the layers made aside keep]
  std::vector<int64_t> aside_bytes_;             // per record_memory(), what they keep
};

}  // namespace

void check_steps(const ReloadSteps& steps) {
  TORCH_CHECK(steps.sleep_level >= 0 && steps.sleep_level <= kMaxSleepLevel,
              "sleep level must be 1 to ", kMaxSleepLevel, " (0: no sleep), not ",
              steps.sleep_level);
  TORCH_CHECK(steps.cold_footprint_tolerance_bytes.value_or(0) >= 0,
              "the cold footprint tolerance is a number of bytes >= 0, not ",
              steps.cold_footprint_tolerance_bytes.value_or(0));
  TORCH_CHECK(steps.reload_peak_budget_bytes.value_or(0) >= 0,
              "the reload peak budget is a number of bytes >= 0, not ",
              steps.reload_peak_budget_bytes.value_or(0));
}

DistinctReads distinct_reads(const std::vector<CapturedRead>& reads) {
  DistinctReads out;
  std::set<const void*> declared, undeclared;
  for (const CapturedRead& r : reads) {
    if (r.name == "input") continue;
    if (r.kind == CapturedRead::Kind::kSubclass || r.kind == CapturedRead::Kind::kNoStorage)
      continue;
    if (r.declared) {
      if (declared.insert(r.storage).second) out.declared.push_back(&r);
    } else if (undeclared.insert(r.storage).second) {
      out.undeclared.push_back(&r);
    }
  }
  return out;
}

BackendReport run_subject(ReloadSubject& subject, const RunOptions& options) {
  const SubjectInfo info = subject.info();
  check_steps(options.steps.merged_with(info.steps));
  BackendReport report;
  report.name = info.name;
  report.description = info.description;
  report.negative_control = info.negative_control;
  report.expected_violation = info.expected_violation;
  // Large CPU blocks freed by one step are reused by the next (Note [Reusing
  // freed blocks]), across both modes.
  std::optional<trace::ReuseCache> reuse;
  if (options.device.is_cpu()) reuse.emplace();
  ColdLoadOutputs cold_loads(/*keep=*/options.device.is_cpu());
  at::Tensor input;
  for (ReloadMode mode : {ReloadMode::kNormal, ReloadMode::kDirect}) {
    report.modes.push_back(ModeRun(subject, info, mode, options, cold_loads, input).run());
  }
  return report;
}

std::vector<CapturedRead> captured_reads(ReloadSubject& subject, const RunOptions& options) {
  const at::Tensor x = draw_run_input(subject, options);
  CachesEmptied caches(subject);
  std::shared_ptr<SubjectLayer> layer =
      cold_load_and_warm_up(subject, options, x, subject.info().warm_up_under_trace);
  std::vector<CapturedRead> reads;
  {
    const Capture c = capture(*layer, x);
    reads = c.forward->reads(*c.names);
  }
  layer.reset();
  caches.restore();
  return reads;
}

}  // namespace reloadsafe::harness
