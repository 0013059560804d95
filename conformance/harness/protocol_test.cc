// The protocol on hand-written subjects: what it computes once and what it
// must still compute per mode (Note [One cold load per checkpoint] in
// protocol.cc).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/protocol.h"

#include "conformance/harness/device_graph.h"
#include "conformance/harness/report_format.h"
#include "conformance/harness/step_table.h"
#include "utils/reload_context.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::harness {
namespace {

// y = x @ w^T with w loaded in place; counts what the protocol asks of it.
// The layers the protocol builds aside (to compare a reload with) are built
// with the module caches emptied a second time (layer_life.h): the subject
// counts the depth to tell them from each mode's live layer.
class CountingSubject : public ReloadSubject {
 public:
  SubjectInfo info() const override {
    SubjectInfo info;
    info.name = "counting";
    info.modes = claims;
    return info;
  }
  Checkpoint draw_checkpoint(uint64_t seed) override {
    checkpoint_seeds.push_back(seed);
    // With `vary`, the same seed gives other values on every call.
    at::Generator gen = at::detail::createCPUGenerator(vary ? seed + 7 * ++draws : seed);
    return {{"w", at::randn({8, 16}, gen)}};
  }
  at::Tensor draw_input(uint64_t seed) override {
    ++input_draws;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return at::randn({4, 16}, gen);
  }
  std::shared_ptr<SubjectLayer> new_layer() override;
  void empty_caches() override { ++cache_depth; }
  void restore_caches() override {
    if (--cache_depth == 0 && !restore_error.empty()) throw std::runtime_error(restore_error);
  }

  // x @ w^T; with `route_by_sign`, then through a relu where w sums to a
  // negative number: the ops follow the weights' values, as an MoE loop over
  // the experts that got tokens does.
  at::Tensor routed(const at::Tensor& x, const at::Tensor& w) const {
    at::Tensor y = at::mm(x, w.t());
    if (route_by_sign && at::sum(w).item<double>() < 0) y = at::relu(y);
    return y;
  }
  // A number derived from the weights and handed to an op by value: a graph
  // keeps the captured one. Read on the host by post-processing (a Python
  // float a layer keeps) with `scale_from_checkpoint`, by the forward with
  // `scale_in_forward` (split sizes from tolist(): the forward's numbers
  // follow the weights, and no graph holds the read).
  static double scale_of(const at::Tensor& w) { return 1.0 + w.abs().max().item<double>(); }

  std::vector<ReloadMode> claims = {ReloadMode::kNormal, ReloadMode::kDirect};
  bool vary = false;
  bool wrong_in_direct = false;
  bool scale_from_checkpoint = false;
  bool scale_in_forward = false;
  bool cold_output_buffer = false;  ///< every aside forward's output in one buffer
  bool write_input = false;         ///< the forward adds 1 to its input in place
  bool keep_aside = false;          ///< every aside layer's weight is kept (a registry)
  bool keep_per_reload = false;     ///< every reload keeps a copy of the weight
  bool route_by_sign = false;       ///< see routed()
  bool timed_process = false;       ///< each layer names a number no load decides (a timing)
  /// The layer names "state", which every forward binds to a tensor it
  /// makes (kMade: Recurrent Gemma's prefill state) or to one it computes
  /// from the previous forward's (kCarried: a decode step's).
  enum class State { kNone, kMade, kCarried } state = State::kNone;
  int processes = 0;                   ///< process() calls over every layer
  std::vector<at::Tensor> kept;        ///< what keep_aside and keep_per_reload keep
  int rebuild_at = 0;                  ///< the reload (counted over both modes) that rebuilds w
  std::string reload_error;            ///< every reload throws this, if not empty
  bool reload_error_from_c10 = false;  ///< ... as a c10::Error (TORCH_CHECK)
  std::string restore_error;           ///< the mode's restore_caches() throws this, if not empty
  int reloads_seen = 0;
  int draws = 0;
  int input_draws = 0;
  int cold_forwards = 0;                   ///< forwards of layers built aside
  int aside_layers = 0;                    ///< layers built aside
  int cache_depth = 0;                     ///< empty_caches() not yet restored
  std::vector<uint64_t> checkpoint_seeds;  ///< every draw_checkpoint's seed, in order
  std::vector<at::Tensor> first_inputs;    ///< the input of each live layer's first forward
  at::Tensor out_buf = at::empty({4, 8});  ///< cold_output_buffer's buffer
};

class CountingLayer : public SubjectLayer {
 public:
  explicit CountingLayer(CountingSubject& s) : s_(s), aside_(s.cache_depth > 1) {}

  void load(const Checkpoint& ckpt) override {
    if (!w_.defined()) {
      w_ = ckpt.at("w").clone();
      if (aside_ && s_.keep_aside) s_.kept.push_back(w_);
      return;
    }
    if (!s_.reload_error.empty()) {
      if (s_.reload_error_from_c10) TORCH_CHECK(false, s_.reload_error);
      throw std::runtime_error(s_.reload_error);
    }
    if (s_.rebuild_at == ++s_.reloads_seen) {
      w_ = ckpt.at("w").clone();  // a new tensor: every captured read of w is stale
      return;
    }
    w_.copy_(ckpt.at("w"));
    if (s_.wrong_in_direct && direct_reload_enabled()) w_.add_(1.0);
    if (s_.keep_per_reload) s_.kept.push_back(w_.clone());  // a history nobody reads
  }
  void process() override {
    timed_ = ++s_.processes;
    if (s_.scale_from_checkpoint) scale_ = CountingSubject::scale_of(w_);
  }
  std::vector<NamedNumber> named_numbers() override {
    if (!s_.timed_process) return {};
    return {{"stats.seconds", static_cast<double>(timed_), false}};
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (aside_) {
      ++s_.cold_forwards;
      // Every aside forward's output in the one buffer the subject keeps.
      if (s_.cold_output_buffer) return at::mm_out(s_.out_buf, x, w_.t());
    } else if (first_forward_) {
      s_.first_inputs.push_back(x.clone());
    }
    first_forward_ = false;
    at::Tensor y = s_.routed(x, w_);
    if (s_.state == CountingSubject::State::kMade) state_ = at::relu(y);
    if (s_.state == CountingSubject::State::kCarried) {
      state_ = state_.defined() ? at::add(state_, y) : at::relu(y);
    }
    if (s_.write_input && !aside_) x.add_(1.0);
    if (s_.scale_in_forward) return at::mul(y, CountingSubject::scale_of(w_));
    return s_.scale_from_checkpoint ? at::mul(y, scale_) : y;
  }
  std::vector<NamedTensor> named_tensors() override {
    if (!state_.defined()) return {{"w", w_, true}};
    return {{"w", w_, true}, {"state", state_, true}};
  }

 private:
  CountingSubject& s_;
  at::Tensor state_;  // CountingSubject::state
  const bool aside_;
  bool first_forward_ = true;
  int timed_ = 0;
  double scale_ = 1.0;  // CountingSubject::scale_from_checkpoint
  at::Tensor w_;
};

std::shared_ptr<SubjectLayer> CountingSubject::new_layer() {
  if (cache_depth > 1) ++aside_layers;
  return std::make_shared<CountingLayer>(*this);
}

RunOptions options(int reloads, bool trace) {
  RunOptions o;
  o.reloads = reloads;
  o.trace = trace;
  return o;
}

// Note [What the layers made aside keep]: a subject that keeps every layer
// it builds keeps the protocol's cold loads too; that is a warning naming
// them, not the reloads' growth, which is still flagged beside it.
TEST(Protocol, WhatTheLayersMadeAsideKeepIsAWarningNotTheReloadsGrowth) {
  for (bool trace : {true, false}) {
    SCOPED_TRACE(trace ? "traced" : "untraced");
    CountingSubject subject;
    subject.keep_aside = true;
    const BackendReport report = run_subject(subject, options(6, trace));
    EXPECT_TRUE(report.ok()) << to_table({report});
    // The first mode builds the cold loads; the second reuses their outputs
    // (Note [One cold load per checkpoint]) and builds nothing aside.
    const std::vector<Warning>& warnings = report.modes.at(0).warnings;
    const bool warned = std::any_of(warnings.begin(), warnings.end(), [](const Warning& w) {
      return w.tensor == "memory" && w.message.find("layers built aside") != std::string::npos;
    });
    EXPECT_TRUE(warned) << to_table({report});
    EXPECT_FALSE(subject.kept.empty());

    CountingSubject growing;
    growing.keep_aside = true;
    growing.keep_per_reload = true;
    const BackendReport grown = run_subject(growing, options(6, trace));
    for (const ModeReport& m : grown.modes) {
      EXPECT_TRUE(std::find(m.flagged.begin(), m.flagged.end(), "memory") != m.flagged.end())
          << to_table({grown});
    }
  }
}

// Note [An op sequence that follows the weights]: a forward whose ops
// depend on the values it reads on the host runs other ops after a correct
// reload; a cold load of the same checkpoint runs them too. A warning, and
// no replay of the capture (one routing) against it.
TEST(Protocol, AnOpSequenceThatFollowsTheWeightsIsAWarningNotAViolation) {
  CountingSubject subject;
  subject.route_by_sign = true;
  const BackendReport report = run_subject(subject, options(8, true));
  EXPECT_TRUE(report.ok()) << to_table({report});
  for (const ModeReport& m : report.modes) {
    const bool warned = std::any_of(m.warnings.begin(), m.warnings.end(), [](const Warning& w) {
      return w.tensor == "op sequence" &&
             w.message.find("follow the weights' values") != std::string::npos;
    });
    EXPECT_TRUE(warned) << "no reload routed otherwise than the capture: " << to_table({report});
  }
}

TEST(Protocol, TheSecondModeReusesTheFirstModesColdLoadsOfTheSameCheckpoints) {
  for (bool trace : {true, false}) {
    SCOPED_TRACE(trace ? "traced" : "untraced");
    CountingSubject subject;
    const BackendReport report = run_subject(subject, options(6, trace));
    EXPECT_TRUE(report.ok()) << to_table({report});
    EXPECT_EQ(subject.cold_forwards, 6) << "one cold load per checkpoint, not per mode";
    for (const ModeReport& m : report.modes) {
      ASSERT_EQ(m.memory_bytes.size(), 7u);
      // The kept outputs are the protocol's: no growth is counted for them.
      EXPECT_EQ(m.memory_bytes[1], m.memory_bytes.back()) << to_string(m.mode);
    }
  }
}

// Note [One cold layer per reload]: the layer compare_state builds to read
// a cold state runs the reload's cold forward too, and the second mode,
// whose states match the first's digests, builds none.
TEST(Protocol, CompareStatesColdLayerRunsTheReloadsColdForwardToo) {
  for (bool trace : {true, false}) {
    SCOPED_TRACE(trace ? "traced" : "untraced");
    CountingSubject subject;
    RunOptions o = options(5, trace);
    o.steps.set("compare_state");
    const BackendReport report = run_subject(subject, o);
    EXPECT_TRUE(report.ok()) << to_table({report});
    // The run's start: reload 1's cold forward (Note [A check that tests
    // nothing]) and one cold state (Note [Numbers that no load decides]).
    // Then one layer per reload of the first mode, whose forward serves
    // reloads 2-5 (reload 1's is kept from the start).
    EXPECT_EQ(subject.aside_layers, 2 + 5);
    EXPECT_EQ(subject.cold_forwards, 5);
  }
}

TEST(Protocol, AForwardThatWritesItsInputIsFlaggedInEachModeAndEachModeStartsFromTheDraw) {
  for (bool trace : {true, false}) {
    SCOPED_TRACE(trace ? "traced" : "untraced");
    CountingSubject subject;
    subject.write_input = true;
    RunOptions o = options(3, trace);
    o.max_listed = 1000;
    const BackendReport report = run_subject(subject, o);
    ASSERT_EQ(report.modes.size(), 2u);
    for (const ModeReport& m : report.modes) {
      std::vector<int> written;
      for (const Violation& v : m.violations) {
        if (v.tensor == "input") written.push_back(v.reload);
      }
      EXPECT_EQ(written, (std::vector<int>{1, 2, 3})) << to_table({report});
    }
    // Drawn once per run; the direct mode's forward is handed the drawn
    // values, not what the normal mode's forwards left in its copy.
    EXPECT_EQ(subject.input_draws, 1);
    ASSERT_EQ(subject.first_inputs.size(), 2u);
    EXPECT_TRUE(at::equal(subject.first_inputs[0], subject.draw_input(input_seed(o.seed))));
    EXPECT_TRUE(at::equal(subject.first_inputs[1], subject.first_inputs[0]));
  }
}

TEST(Protocol, AColdLoadOutputTheSubjectWritesAgainIsKeptAsACopy) {
  // The second mode compares against what each cold load gave then, not
  // what the subject's buffer holds after the last one.
  CountingSubject subject;
  subject.cold_output_buffer = true;
  const BackendReport report = run_subject(subject, options(5, false));
  EXPECT_TRUE(report.ok()) << to_table({report});
  EXPECT_EQ(subject.cold_forwards, 5);
}

// Note [Numbers that no load decides]: a number two cold loads of one
// checkpoint disagree on (a timing, a count over every layer) is left out
// of the comparisons; the same number would be flagged at every reload.
TEST(Protocol, ANumberNoLoadDecidesIsNotCompared) {
  CountingSubject subject;
  subject.timed_process = true;
  RunOptions o = options(3, true);
  o.steps.set("host_numbers").set("compare_state");
  const BackendReport report = run_subject(subject, o);
  EXPECT_TRUE(report.ok()) << to_table({report});
}

TEST(Protocol, CheckpointsThatDifferForTheSameSeedGetColdLoadsOfTheirOwn) {
  CountingSubject subject;
  subject.vary = true;
  const BackendReport report = run_subject(subject, options(5, true));
  EXPECT_TRUE(report.ok()) << to_table({report});
  // One per reload and mode, and the first mode's start asks one more, of
  // reload 1's checkpoint as drawn then (Note [A check that tests nothing]).
  EXPECT_EQ(subject.cold_forwards, 11);
}

TEST(Protocol, AWrongReloadInTheSecondModeIsFlaggedAgainstTheKeptColdLoad) {
  CountingSubject subject;
  subject.wrong_in_direct = true;
  const BackendReport report = run_subject(subject, options(4, true));
  ASSERT_EQ(report.modes.size(), 2u);
  EXPECT_EQ(report.modes[0].violation_count, 0) << to_table({report});
  const ModeReport& direct = report.modes[1];
  EXPECT_EQ(direct.mode, ReloadMode::kDirect);
  ASSERT_FALSE(direct.violations.empty());
  bool forward = false;
  for (const Violation& v : direct.violations) forward = forward || v.tensor == "forward";
  EXPECT_TRUE(forward) << to_table({report});
  EXPECT_EQ(subject.cold_forwards, 4);
}

// Note [A mode not claimed]: an unclaimed mode ends at its first reload with
// a violation; a claimed one, and an unclaimed one that keeps every address,
// run every reload.
TEST(Protocol, AModeNotClaimedEndsAtItsFirstReloadWithAViolation) {
  struct Row {
    const char* name;
    std::vector<ReloadMode> claims;
    bool wrong_in_direct;
    int direct_reloads;  ///< the direct mode's reloads_done
    int normal_reloads;
    bool ok;
  };
  const Row rows[] = {
      {"claimed and wrong", {ReloadMode::kNormal, ReloadMode::kDirect}, true, 5, 5, false},
      {"not claimed and wrong", {ReloadMode::kNormal}, true, 1, 5, true},
      {"not claimed and right", {ReloadMode::kDirect}, false, 5, 5, true},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    CountingSubject subject;
    subject.claims = row.claims;
    subject.wrong_in_direct = row.wrong_in_direct;
    const BackendReport report = run_subject(subject, options(5, true));
    ASSERT_EQ(report.modes.size(), 2u);
    EXPECT_EQ(report.modes[0].reloads_done, row.normal_reloads) << to_table({report});
    EXPECT_EQ(report.modes[1].reloads_done, row.direct_reloads) << to_table({report});
    EXPECT_EQ(report.ok(), row.ok) << to_table({report});
    if (row.wrong_in_direct) {
      EXPECT_GT(report.modes[1].violation_count, 0);
      for (const Violation& v : report.modes[1].violations) EXPECT_LE(v.reload, row.direct_reloads);
    }
  }
}

TEST(Protocol, AViolationCarriesTheNumberOfTheReloadAfterWhichItWasSeen) {
  CountingSubject subject;
  subject.rebuild_at = 3;
  const BackendReport report = run_subject(subject, options(4, true));
  const ModeReport& normal = report.modes[0];
  ASSERT_FALSE(normal.violations.empty()) << to_table({report});
  bool traced = false, declared = false;
  for (const Violation& v : normal.violations) {
    // Rebuilt after reload 3 and kept from then on: reloads 3 and 4 see it.
    EXPECT_GE(v.reload, 3) << v.tensor << " " << v.what;
    traced = traced || (v.reload == 3 && v.read.rfind("aten::", 0) == 0 && v.what == "address");
    declared =
        declared || (v.reload == 3 && v.tensor == "w" && v.read.empty() && v.what == "address");
  }
  EXPECT_TRUE(traced) << "the retrace's violation is numbered: " << to_table({report});
  EXPECT_TRUE(declared) << to_table({report});
  EXPECT_EQ(report.modes[1].violation_count, 0) << "the direct mode starts from a new cold load";
}

TEST(Protocol, ANumberTheGraphBakedInIsFlaggedByTheReplayAfterEveryReload) {
  // The live forward uses each checkpoint's number and matches a cold load;
  // only the replay, with the captured number, shows what a graph computes.
  // A retrace handed another number is no replay of the capture (Note [A
  // retrace that is its own replay]), so every reload's replay runs.
  CountingSubject subject;
  subject.scale_from_checkpoint = true;
  const BackendReport report = run_subject(subject, options(4, true));
  ASSERT_EQ(report.modes.size(), 2u);
  for (const ModeReport& m : report.modes) {
    std::vector<int> replays;
    for (const Violation& v : m.violations) {
      EXPECT_NE(v.tensor, "forward") << to_table({report});
      if (v.tensor != "replay") continue;
      replays.push_back(v.reload);
      EXPECT_NE(v.what.find("(aten::mul.Scalar) handed other numbers"), std::string::npos)
          << "the replay's violation names the call the graph keeps the old number of: " << v.what;
    }
    EXPECT_EQ(replays, (std::vector<int>{1, 2, 3, 4})) << to_table({report});
  }
}

TEST(Protocol, ANumberTheForwardReadsOnTheHostIsAWarningNotAViolation) {
  // The same number, computed by the forward from a value it reads on the
  // host: a cold load hands the retrace's number, and the read comes before
  // the call that changed. No graph holds such a forward; the replay of the
  // capture is not compared, and the message names the call.
  CountingSubject subject;
  subject.scale_in_forward = true;
  const BackendReport report = run_subject(subject, options(4, true));
  EXPECT_TRUE(report.ok()) << to_table({report});
  ASSERT_EQ(report.modes.size(), 2u);
  for (const ModeReport& m : report.modes) {
    const bool warned = std::any_of(m.warnings.begin(), m.warnings.end(), [](const Warning& w) {
      return w.tensor == "op sequence" &&
             w.message.find("follow the weights' values") != std::string::npos &&
             w.message.find("(aten::mul.Scalar) handed other numbers") != std::string::npos;
    });
    EXPECT_TRUE(warned) << to_table({report});
  }
}

TEST(Protocol, AStaleReadIsFlaggedByTheReplayAfterEveryReload) {
  // Rebuilt at the first reload: every later retrace differs from the
  // capture, so the replay runs, and reads the old weight, after each.
  CountingSubject subject;
  subject.rebuild_at = 1;
  RunOptions o = options(4, true);
  o.max_listed = 1000;  // each reload lists the moved reads too
  const BackendReport report = run_subject(subject, o);
  std::vector<int> replays;
  for (const Violation& v : report.modes[0].violations) {
    if (v.tensor == "replay") replays.push_back(v.reload);
  }
  EXPECT_EQ(replays, (std::vector<int>{1, 2, 3, 4})) << to_table({report});
}

// Note [State every forward makes] in forward_checks.cc: a name the forward
// binds to a tensor its own ops make at every call is no address a graph
// depends on (a warning names it, and the tensor the capture holds of it
// is not the layer's memory); state a forward carries over from the
// previous call is read from outside, and that read moves.
TEST(Protocol, StateEveryForwardMakesIsAWarningAndCarriedStateIsFlagged) {
  for (const auto state : {CountingSubject::State::kMade, CountingSubject::State::kCarried}) {
    const bool made = state == CountingSubject::State::kMade;
    SCOPED_TRACE(made ? "made by every forward" : "carried over");
    CountingSubject subject;
    subject.state = state;
    const BackendReport report = run_subject(subject, options(4, true));
    ASSERT_EQ(report.modes.size(), 2u);
    for (const ModeReport& m : report.modes) {
      EXPECT_EQ(m.error, "");
      const bool state_flagged =
          std::find(m.flagged.begin(), m.flagged.end(), "state") != m.flagged.end();
      EXPECT_EQ(state_flagged, !made) << to_table({report});
      if (!made) continue;
      EXPECT_EQ(m.violation_count, 0) << to_table({report});
      const bool warned = std::any_of(m.warnings.begin(), m.warnings.end(), [](const Warning& w) {
        return w.tensor == "state" && w.message.rfind("made by every forward", 0) == 0;
      });
      EXPECT_TRUE(warned) << to_table({report});
      ASSERT_GE(m.memory_bytes.size(), 3u);
      EXPECT_EQ(m.memory_bytes[1], m.memory_bytes.back()) << "the capture's state is the check's";
    }
  }
}

// A binary linked without conformance/harness:device_graph_cuda (this one:
// LibTorch's CPU library only) has no graph step, and says which of "not
// linked" and "no device" it is.
TEST(Protocol, EachModeDrawsTheColdLoadFromTheRunsSeedAndReloadRFromReloadSeed) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 40}) {
    SCOPED_TRACE(seed);
    CountingSubject subject;
    RunOptions o = options(3, false);
    o.seed = seed;
    EXPECT_TRUE(run_subject(subject, o).ok());
    const std::vector<uint64_t> mode = {seed, reload_seed(seed, 1), reload_seed(seed, 2),
                                        reload_seed(seed, 3)};
    // The first mode's start also draws reload 1's checkpoint, to refuse a
    // check that tests nothing (Note [A check that tests nothing]).
    std::vector<uint64_t> both = {seed, reload_seed(seed, 1)};
    both.insert(both.end(), mode.begin() + 1, mode.end());
    both.insert(both.end(), mode.begin(), mode.end());
    EXPECT_EQ(subject.checkpoint_seeds, both);
  }
  EXPECT_EQ(RunOptions{}.reloads, kDefaultReloads);
}

// Note [A reload that raises]: after a cold load that ran, a reload that
// raises is the reload's bug, a violation at that reload naming the step and
// what it raised (its first line; a c10 error without LibTorch's
// backtrace); the mode ends there. Putting the module caches back at the
// mode's end, when it fails, is the mode's error.
TEST(Protocol, AReloadThatRaisesIsAViolationAndAFailedRestoreIsTheModesError) {
  struct Row {
    const char* name;
    std::string reload_error;
    bool from_c10;
    std::string restore_error;
    std::string raised;  ///< the violation's after; empty: no reload violation
    std::string error;   ///< the mode's error
  };
  const Row rows[] = {
      {"reload", "first line\nsecond line\n", false, "", "first line", ""},
      {"reload (c10)", "first line\nsecond line", true, "", "first line", ""},
      {"restore", "", false, "gone\nfor good", "", "restoring the module caches: gone\nfor good"},
      {"both", "first line\nsecond line", false, "gone", "first line",
       "restoring the module caches: gone"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    CountingSubject subject;
    subject.reload_error = row.reload_error;
    subject.reload_error_from_c10 = row.from_c10;
    subject.restore_error = row.restore_error;
    const BackendReport report = run_subject(subject, options(2, false));
    ASSERT_EQ(report.modes.size(), 2u);
    for (const ModeReport& m : report.modes) {
      SCOPED_TRACE(to_string(m.mode));
      EXPECT_EQ(m.error, row.error);
      EXPECT_FALSE(m.clean());
      if (row.raised.empty()) {
        EXPECT_EQ(m.reloads_done, 2);
        continue;
      }
      EXPECT_EQ(m.reloads_done, 0) << "the mode ends at the reload that raised";
      ASSERT_EQ(m.violations.size(), 1u) << to_table({report});
      const Violation& v = m.violations[0];
      EXPECT_EQ(v.reload, 1);
      EXPECT_EQ(v.tensor, "reload");
      EXPECT_EQ(v.what, "the reload raised where the cold load did not (at reload 1)");
      EXPECT_EQ(v.after, row.raised);
    }
    EXPECT_FALSE(report.ok());
  }
}

// The steps of ReloadSteps, on a layer with one switch per bug each step
// exists to catch. y = (x @ w^T + pad + bias + derived) * k_scale * number,
// w the first 16 columns of w_padded.
enum class Bug {
  kNone,
  kPlainConstant,            ///< bias a plain attribute set at construction: no wake restores it
  kPaddingFromConstruction,  ///< the loader leaves w_padded's padding as construction zeroed it
  kHostNumber,               ///< `number` derived from the weights on every pass (right eagerly)
  kScaleHalvedPerPass,       ///< k_scale halved by every pass instead of set
  kDerivedOnce,              ///< derived computed by the first pass only
  kCopyKept,                 ///< every pass after the first keeps a copy of w_padded
  kStagedCopy,               ///< the loader stages a copy of w before writing it
  kFirstForwardTiles,        ///< the first forward builds `tiles`, later ones only read it
  kLoaderResetsFused,        ///< w comes as two halves, w.0 and w.1; each load zeroes w first
  kFileLayout,               ///< no bug: the checkpoint names the layer's tensor (w_padded whole)
  kDerivedInLoader,          ///< kFileLayout, with derived computed by the loader, not process
};

// Whether the checkpoint of `bug`'s layer names its tensors, as a file of
// them does (load_from_file loads it by name).
bool file_layout(Bug bug) {
  return bug == Bug::kFileLayout || bug == Bug::kDerivedInLoader;
}

struct StepsLayer {
  explicit StepsLayer(Bug bug) : bug(bug) {}

  void load(const Checkpoint& ckpt) {
    if (bug == Bug::kLoaderResetsFused) {
      w_padded.zero_();  // right only when both halves come in one call
      for (const auto& [name, half] : ckpt) {
        w_padded.narrow(0, name == "w.0" ? 0 : 4, 4).narrow(1, 0, 16).copy_(half);
      }
      return;
    }
    if (file_layout(bug)) {
      const at::Tensor& file_w = ckpt.at("w_padded");
      w_padded.narrow(1, 0, file_w.size(1)).copy_(file_w);
      if (bug == Bug::kDerivedInLoader) derived.copy_(w_padded.narrow(1, 0, 16).sum(1));
      return;
    }
    const at::Tensor& w = ckpt.at("w");
    w_padded.narrow(1, 0, 16).copy_(bug == Bug::kStagedCopy ? w.clone() : w);
    if (bug != Bug::kPaddingFromConstruction) w_padded.narrow(1, 16, 4).zero_();
  }
  void process() {
    if (bug == Bug::kScaleHalvedPerPass) {
      k_scale.mul_(0.5);
    } else {
      k_scale.fill_(0.5);
    }
    if (moves_derived) {
      derived = w_padded.narrow(1, 0, 16).sum(1);  // a new tensor: the capture's is left behind
    } else if ((bug != Bug::kDerivedOnce || passes == 0) && bug != Bug::kDerivedInLoader) {
      derived.copy_(w_padded.narrow(1, 0, 16).sum(1));
    }
    number =
        bug == Bug::kHostNumber ? 1.0 + w_padded.narrow(1, 0, 16).abs().max().item<double>() : 2.0;
    if (bug == Bug::kCopyKept && passes > 0) kept = w_padded.clone();
    ++passes;
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor y = at::mm(x, w_padded.narrow(1, 0, 16).t());
    y = y + w_padded.narrow(1, 16, 4).sum(1) + bias + derived;
    if (bug == Bug::kFirstForwardTiles) {
      if (!tiles.defined()) tiles = at::arange(4, at::kFloat);
      y = y + tiles.sum();
    }
    return at::mul(at::mul(y, k_scale), number);
  }
  LayerState state() const {
    LayerState s{{{"w_padded", w_padded, true},
                  {"k_scale", k_scale, true},
                  {"bias", bias, true},
                  {"derived", derived, true}},
                 {{"number", number, false}}};
    if (tiles.defined()) s.tensors.push_back({"tiles", tiles, true});
    return s;
  }

  Bug bug;
  bool moves_derived = false;
  at::Tensor w_padded = at::zeros({8, 20});
  at::Tensor k_scale = at::ones({1});
  at::Tensor bias = at::full({8}, 0.25);
  at::Tensor derived = at::zeros({8});
  at::Tensor kept;
  mutable at::Tensor tiles;  // made by the first forward
  double number = 0;
  int passes = 0;
};

class StepsSubject : public ReloadSubject {
 public:
  explicit StepsSubject(Bug bug, ReloadSteps asked = {}) : bug_(bug), asked_(std::move(asked)) {}

  SubjectInfo info() const override {
    SubjectInfo info;
    info.name = "steps";
    info.steps = asked_;
    return info;
  }
  Checkpoint draw_checkpoint(uint64_t seed) override {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const at::Tensor w = at::randn({8, 16}, gen);
    if (bug_ == Bug::kLoaderResetsFused)
      return {{"w.0", w.narrow(0, 0, 4)}, {"w.1", w.narrow(0, 4, 4)}};
    if (file_layout(bug_)) {
      at::Tensor file_w = at::zeros({8, file_columns});
      file_w.narrow(1, 0, 16).copy_(w);
      return {{"w_padded", file_w}};
    }
    return {{"w", w}};
  }
  at::Tensor draw_input(uint64_t seed) override {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return at::randn({4, 16}, gen);
  }
  std::shared_ptr<SubjectLayer> new_layer() override;

  bool own_sleep = false;
  bool keep_every_cycle = false;
  bool moves_derived = false;  ///< post-processing rebinds derived to a new tensor
  int64_t file_columns = 20;   ///< w_padded's columns in a file layout's checkpoint
  int w_padded_moves = 0;      ///< post-processing passes that found w_padded elsewhere
  int own_sleeps = 0;
  std::vector<std::vector<at::Tensor>> host_copies;

 private:
  friend class StepsHandle;
  Bug bug_;
  ReloadSteps asked_;
};

class StepsHandle : public SubjectLayer {
 public:
  explicit StepsHandle(StepsSubject& s) : s_(s), layer_(s.bug_) {
    layer_.moves_derived = s.moves_derived;
  }

  void load(const Checkpoint& ckpt) override { layer_.load(ckpt); }
  void process() override {
    if (layer_.w_padded.const_data_ptr() != w_padded_at_) ++s_.w_padded_moves;
    layer_.process();
  }
  at::Tensor forward(const at::Tensor& x) override { return layer_.forward(x); }
  std::vector<NamedTensor> named_tensors() override { return layer_.state().tensors; }
  std::vector<at::Tensor> parameters() override { return {layer_.w_padded}; }
  std::vector<at::Tensor> buffers() override {
    if (s_.bug_ == Bug::kPlainConstant) return {layer_.k_scale};
    return {layer_.k_scale, layer_.bias};
  }
  std::vector<NamedNumber> named_numbers() override { return layer_.state().numbers; }
  // With `own_sleep`: the engine's sleep helper, which keeps a host copy of
  // every tensor while the layer sleeps (one more each cycle with
  // `keep_every_cycle`) and restores all of them.
  bool sleep_and_wake(int /*level*/) override {
    if (!s_.own_sleep) return false;
    ++s_.own_sleeps;
    std::vector<at::Tensor> copies;
    for (const NamedTensor& n : layer_.state().tensors) copies.push_back(n.tensor.clone());
    if (s_.keep_every_cycle || s_.host_copies.empty()) {
      s_.host_copies.push_back(copies);
    } else {
      s_.host_copies.back() = copies;
    }
    for (const NamedTensor& n : layer_.state().tensors) n.tensor.fill_(NAN);
    const std::vector<NamedTensor> tensors = layer_.state().tensors;
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].tensor.copy_(s_.host_copies.back()[i]);
    return true;
  }

 private:
  StepsSubject& s_;
  StepsLayer layer_;
  const void* w_padded_at_ = layer_.w_padded.const_data_ptr();  // where construction put it
};

std::shared_ptr<SubjectLayer> StepsSubject::new_layer() {
  return std::make_shared<StepsHandle>(*this);
}

bool flagged_in_every_mode(const BackendReport& report, const std::string& name) {
  for (const ModeReport& m : report.modes) {
    if (std::find(m.flagged.begin(), m.flagged.end(), name) == m.flagged.end()) return false;
  }
  return true;
}

const Violation* first_named(const BackendReport& report, const std::string& name) {
  for (const ModeReport& m : report.modes) {
    for (const Violation& v : m.violations) {
      if (v.tensor == name) return &v;
    }
  }
  return nullptr;
}

ReloadSteps sleeping(int level) {
  return ReloadSteps().set("sleep", level).set("compare_state");
}

// Each step catches its bug by name, the same bug passes (or is not named)
// without the step, and the layer without the bug passes with it.
TEST(ProtocolSteps, EachStepNamesTheBugItExistsForAndPassesTheFixedLayer) {
  const ReloadSteps recreate = ReloadSteps().set("recreate_parameters").set("compare_state");
  const ReloadSteps numbers = ReloadSteps().set("host_numbers");
  const ReloadSteps state = ReloadSteps().set("compare_state");
  const ReloadSteps footprint = ReloadSteps().set("cold_footprint_tolerance_bytes", 0);
  // The staged copy of w is 512 B.
  const ReloadSteps peak = ReloadSteps().set("reload_peak_budget_bytes", 256);
  const ReloadSteps forward_state = sleeping(2).set("compare_forward_state");
  const ReloadSteps forward_state_level_1 = sleeping(1).set("compare_forward_state");
  const ReloadSteps per_tensor = ReloadSteps().set("load_per_tensor").set("compare_state");
  const ReloadSteps from_file = ReloadSteps().set("load_from_file").set("compare_state");
  struct Row {
    const char* name;
    Bug bug;
    ReloadSteps steps;
    std::string flagged;       ///< flagged in both modes with the steps
    std::string what;          ///< the start of its violation's `what`
    bool passes_without;       ///< the bug passes without the steps (not only unnamed)
    ReloadSteps without = {};  ///< the steps of the run without the step under test
    Bug fixed = Bug::kNone;    ///< the layer without the bug
  };
  const Row rows[] = {
      {"sleep 2", Bug::kPlainConstant, sleeping(2), "bias", "differs from a cold load", true},
      {"recreate", Bug::kPaddingFromConstruction, recreate, "w_padded", "differs from a cold load",
       true},
      {"host numbers", Bug::kHostNumber, numbers, "number", "host number changed since the capture",
       false},
      {"idempotence", Bug::kScaleHalvedPerPass, state, "k_scale", "not idempotent", false},
      {"stale derived", Bug::kDerivedOnce, state, "derived", "differs from a cold load", false},
      {"footprint", Bug::kCopyKept, footprint, "memory", "footprint after reload 1", true},
      {"peak", Bug::kStagedCopy, peak, "memory", "peak during reload 1", true},
      {"forward state", Bug::kFirstForwardTiles, forward_state, "tiles", "after the forward", false,
       sleeping(2)},
      {"sleep 1 loses what a forward made", Bug::kFirstForwardTiles, forward_state_level_1, "tiles",
       "after the forward", false, sleeping(1)},
      {"per-tensor loads", Bug::kLoaderResetsFused, per_tensor, "w_padded",
       "differs from a cold load", true},
      {"file loads",
       Bug::kDerivedInLoader,
       from_file,
       "derived",
       "differs from a cold load",
       true,
       {},
       Bug::kFileLayout},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    StepsSubject buggy(row.bug);
    RunOptions o = options(3, true);
    o.steps = row.steps;
    const BackendReport caught = run_subject(buggy, o);
    EXPECT_TRUE(flagged_in_every_mode(caught, row.flagged)) << to_table({caught});
    const Violation* v = first_named(caught, row.flagged);
    ASSERT_NE(v, nullptr) << to_table({caught});
    EXPECT_EQ(v->reload, 1);
    EXPECT_EQ(v->what.rfind(row.what, 0), 0u) << v->what;

    StepsSubject without(row.bug);
    RunOptions without_step = options(3, true);
    without_step.steps = row.without;
    const BackendReport plain = run_subject(without, without_step);
    for (const ModeReport& m : plain.modes) {
      EXPECT_EQ(m.error, "");
      EXPECT_EQ(std::count(m.flagged.begin(), m.flagged.end(), row.flagged), 0)
          << "named without the step\n"
          << to_table({plain});
    }
    if (row.passes_without) {
      EXPECT_TRUE(plain.ok()) << to_table({plain});
    }

    StepsSubject fixed(row.fixed);
    const BackendReport clean = run_subject(fixed, o);
    EXPECT_TRUE(clean.ok()) << to_table({clean});
  }
}

// load_from_file loads the file into the live tensors at their addresses
// (the layer's own load is not called: a loader's work shows, as the row
// above has it); what post-processing breaks is still flagged; a layer
// whose checkpoint does not name its tensors is each mode's error, saying
// so and what to do instead.
TEST(ProtocolSteps, LoadFromFileWritesTheLiveTensorsInPlaceAndRefusesAnotherLayout) {
  RunOptions o = options(3, true);
  o.steps = ReloadSteps().set("load_from_file").set("compare_state");

  StepsSubject kept(Bug::kFileLayout);
  const BackendReport clean = run_subject(kept, o);
  EXPECT_TRUE(clean.ok()) << to_table({clean});
  EXPECT_EQ(clean.modes.size(), 2u);
  for (const ModeReport& m : clean.modes) EXPECT_EQ(m.reloads_done, 3);
  EXPECT_EQ(kept.w_padded_moves, 0);

  StepsSubject moving(Bug::kFileLayout);
  moving.moves_derived = true;
  const BackendReport moved = run_subject(moving, o);
  EXPECT_TRUE(flagged_in_every_mode(moved, "derived")) << to_table({moved});
  EXPECT_FALSE(moved.ok());

  struct Row {
    const char* name;
    Bug bug;
    int64_t file_columns;
    ReloadSteps steps;
    std::string says;
  };
  const std::string fix =
      "the layer's checkpoint layout differs from its tensors, so its checkpoint cannot be "
      "loaded into them by name. Check it through its own loader (run without load_from_file)";
  const Row rows[] = {
      {"a name the layer lacks", Bug::kNone, 20, o.steps,
       "load_from_file: the checkpoint's tensor 'w' (Float [8, 16]) is no tensor of the layer: " +
           fix},
      {"another shape", Bug::kFileLayout, 16, o.steps,
       "load_from_file: the checkpoint's tensor 'w_padded' is Float [8, 16], the layer's "
       "'w_padded' is Float [8, 20]: " +
           fix},
      {"two loads asked", Bug::kFileLayout, 20, ReloadSteps(o.steps).set("load_per_tensor"),
       "load_from_file and load_per_tensor both load in place of the layer's load"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    StepsSubject subject(row.bug);
    subject.file_columns = row.file_columns;
    RunOptions refused = o;
    refused.steps = row.steps;
    const BackendReport report = run_subject(subject, refused);
    EXPECT_FALSE(report.ok());
    for (const ModeReport& m : report.modes) {
      EXPECT_NE(m.error.find(row.says), std::string::npos) << m.error;
      EXPECT_TRUE(m.violations.empty()) << to_table({report});
    }
  }
}

// Level 1 keeps the weights' memory on the host: what the cold load made
// comes back, a plain tensor made at construction included; level 2 loses it.
TEST(ProtocolSteps, SleepLevelOneRestoresWhatTheColdLoadMadeAndLevelTwoDoesNot) {
  StepsSubject level_1(Bug::kPlainConstant);
  RunOptions o = options(3, true);
  o.steps = sleeping(1);
  const BackendReport restored = run_subject(level_1, o);
  EXPECT_TRUE(restored.ok()) << to_table({restored});
  StepsSubject level_2(Bug::kPlainConstant);
  o.steps = sleeping(2);
  const BackendReport lost = run_subject(level_2, o);
  EXPECT_TRUE(flagged_in_every_mode(lost, "bias")) << to_table({lost});
}

TEST(ProtocolSteps, ASubjectsOwnSleepRunsInPlaceOfTheEmulationAndWhatItKeepsIsCounted) {
  RunOptions o = options(3, true);
  o.steps.set("sleep", 2);
  // The emulation would discard `bias` (not a buffer): the helper restores
  // every tensor, so the layer passes, and the helper ran once per reload.
  StepsSubject restoring(Bug::kPlainConstant);
  restoring.own_sleep = true;
  const BackendReport clean = run_subject(restoring, o);
  EXPECT_TRUE(clean.ok()) << to_table({clean});
  EXPECT_EQ(restoring.own_sleeps, 2 * 3);

  StepsSubject leaking(Bug::kNone);
  leaking.own_sleep = true;
  leaking.keep_every_cycle = true;
  const BackendReport leaked = run_subject(leaking, o);
  EXPECT_TRUE(flagged_in_every_mode(leaked, "memory")) << to_table({leaked});
}

TEST(ProtocolSteps, ASubjectsOwnStepsAreMergedWithTheRuns) {
  const ReloadSteps asked = ReloadSteps().set("sleep", 2);
  StepsSubject buggy(Bug::kPlainConstant, asked);
  const BackendReport report = run_subject(buggy, options(2, false));
  EXPECT_TRUE(flagged_in_every_mode(report, "forward")) << to_table({report});

  const ReloadSteps a = ReloadSteps().set("sleep", 1).set("reload_peak_budget_bytes", 100);
  const ReloadSteps b = ReloadSteps()
                            .set("sleep", 2)
                            .set("reload_peak_budget_bytes", 50)
                            .set("cold_footprint_tolerance_bytes", 7)
                            .set("host_numbers");
  const ReloadSteps m = merge_steps(a, b);
  EXPECT_EQ(m.get("sleep"), 2);
  EXPECT_EQ(m.get("reload_peak_budget_bytes"), 50);
  EXPECT_EQ(m.get("cold_footprint_tolerance_bytes"), 7);
  EXPECT_TRUE(m.has("host_numbers"));
  EXPECT_FALSE(m.has("compare_state"));
  EXPECT_TRUE(m.any());
  EXPECT_FALSE(ReloadSteps{}.any());
}

TEST(ProtocolSteps, StepsThatCannotBeTakenAreRefusedWithTheirName) {
  struct Row {
    const char* name;
    ReloadSteps steps;
    std::string says;
  };
  const ReloadSteps sleep3 = ReloadSteps().set("sleep", 3);
  const ReloadSteps negative = ReloadSteps().set("reload_peak_budget_bytes", -1);
  const ReloadSteps unknown = ReloadSteps().set("hibernate");
  const ReloadSteps recreate = ReloadSteps().set("recreate_parameters");
  // Refused before anything runs.
  for (const Row& row :
       {Row{"sleep 3", sleep3, "sleep takes a level from 1 to 2"},
        Row{"negative budget", negative, "reload_peak_budget_bytes is a number of bytes >= 0"},
        Row{"unknown", unknown, "no harness step is named 'hibernate'; the steps are sleep, "}}) {
    SCOPED_TRACE(row.name);
    CountingSubject subject;
    RunOptions o = options(2, false);
    o.steps = row.steps;
    try {
      run_subject(subject, o);
      ADD_FAILURE() << "not refused";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(row.says), std::string::npos) << e.what();
    }
    EXPECT_TRUE(subject.checkpoint_seeds.empty());
  }
  // A subject that cannot answer what the step needs: each mode's error.
  for (const Row& row : {Row{"recreate", recreate, "recreate_parameters: the subject names no"}}) {
    SCOPED_TRACE(row.name);
    CountingSubject subject;
    RunOptions o = options(2, false);
    o.steps = row.steps;
    const BackendReport report = run_subject(subject, o);
    for (const ModeReport& m : report.modes) {
      EXPECT_NE(m.error.find(row.says), std::string::npos) << m.error;
    }
    EXPECT_FALSE(report.ok());
  }
}

TEST(DeviceGraph, ABinaryWithoutCudaSaysItWasBuiltWithoutIt) {
  EXPECT_EQ(device_graph_capture(c10::kCUDA), nullptr);
  const std::string why = cuda_unavailable_reason();
  EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
  EXPECT_NE(cuda_build_info().find("CUDA not linked"), std::string::npos) << cuda_build_info();
}

}  // namespace
}  // namespace reloadsafe::harness
