// The protocol on hand-written subjects: what it computes once and what it
// must still compute per mode (Note [One cold load per checkpoint] in
// protocol.cc).
#include "conformance/harness/protocol.h"

#include "conformance/harness/device_graph.h"
#include "conformance/harness/report_format.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// y = x @ w^T with w loaded in place; counts the cold loads it is asked for.
class CountingSubject : public ReloadSubject {
 public:
  SubjectInfo info() const override {
    SubjectInfo info;
    info.name = "counting";
    return info;
  }
  Checkpoint draw_checkpoint(uint64_t seed) override {
    checkpoint_seeds.push_back(seed);
    // With `vary`, the same seed gives other values on every call.
    at::Generator gen = at::detail::createCPUGenerator(vary ? seed + 7 * ++draws : seed);
    return {{"w", at::randn({8, 16}, gen)}};
  }
  void cold_load(const Checkpoint& ckpt) override {
    w_ = ckpt.at("w").clone();
    first_forward_ = true;
    if (cold_output_buffer) out_buf_ = at::empty({4, 8});
  }
  void reload(ReloadMode mode, const Checkpoint& ckpt) override {
    if (!reload_error.empty()) {
      if (reload_error_from_c10) TORCH_CHECK(false, reload_error);
      throw std::runtime_error(reload_error);
    }
    if (rebuild_at == ++reloads_seen) {
      w_ = ckpt.at("w").clone();  // a new tensor: every captured read of w is stale
      return;
    }
    w_.copy_(ckpt.at("w"));
    if (wrong_in_direct && mode == ReloadMode::kDirect) w_.add_(1.0);
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (first_forward_) first_inputs.push_back(x.clone());
    first_forward_ = false;
    at::Tensor y = at::mm(x, w_.t());
    if (write_input) x.add_(1.0);
    return scale_from_checkpoint ? at::mul(y, scale_of(w_)) : y;
  }
  at::Tensor cold_forward(const Checkpoint& ckpt, const at::Tensor& x) override {
    ++cold_forwards;
    const at::Tensor w = ckpt.at("w").clone();
    // Every cold forward's output in the one buffer the subject keeps.
    if (cold_output_buffer) return at::mm_out(out_buf_, x, w.t());
    at::Tensor y = at::mm(x, w.t());
    return scale_from_checkpoint ? at::mul(y, scale_of(w)) : y;
  }
  // A number derived from the weights and handed to an op by value, as a
  // Python float computed in post-processing is: a graph keeps the captured one.
  static double scale_of(const at::Tensor& w) { return 1.0 + w.abs().max().item<double>(); }
  std::vector<NamedTensor> named_tensors() override { return {{"w", w_, true}}; }
  at::Tensor draw_input(uint64_t seed) override {
    ++input_draws;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return at::randn({4, 16}, gen);
  }
  void release() override {
    w_ = at::Tensor();
    if (!release_error.empty()) throw std::runtime_error(release_error);
  }

  bool vary = false;
  bool wrong_in_direct = false;
  bool scale_from_checkpoint = false;
  bool cold_output_buffer = false;
  bool write_input = false;            ///< the forward adds 1 to its input in place
  int rebuild_at = 0;                  ///< the reload (counted over both modes) that rebuilds w
  std::string reload_error;            ///< every reload throws this, if not empty
  bool reload_error_from_c10 = false;  ///< ... as a c10::Error (TORCH_CHECK)
  std::string release_error;           ///< release() throws this, if not empty
  int reloads_seen = 0;
  int draws = 0;
  int input_draws = 0;
  int cold_forwards = 0;
  std::vector<uint64_t> checkpoint_seeds;  ///< every draw_checkpoint's seed, in order
  std::vector<at::Tensor> first_inputs;    ///< the input of each cold load's first forward

 private:
  bool first_forward_ = false;
  at::Tensor w_;
  at::Tensor out_buf_;
};

RunOptions options(int reloads, bool trace) {
  RunOptions o;
  o.reloads = reloads;
  o.trace = trace;
  return o;
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

TEST(Protocol, CheckpointsThatDifferForTheSameSeedGetColdLoadsOfTheirOwn) {
  CountingSubject subject;
  subject.vary = true;
  const BackendReport report = run_subject(subject, options(5, true));
  EXPECT_TRUE(report.ok()) << to_table({report});
  EXPECT_EQ(subject.cold_forwards, 10);
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
      if (v.tensor == "replay") replays.push_back(v.reload);
    }
    EXPECT_EQ(replays, (std::vector<int>{1, 2, 3, 4})) << to_table({report});
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
    std::vector<uint64_t> both = mode;
    both.insert(both.end(), mode.begin(), mode.end());
    EXPECT_EQ(subject.checkpoint_seeds, both);
  }
  EXPECT_EQ(RunOptions{}.reloads, kDefaultReloads);
}

TEST(Protocol, AModesErrorKeepsEveryLineAndAFailedReleaseFollowsIt) {
  struct Row {
    const char* name;
    std::string reload_error;
    bool from_c10;
    std::string release_error;
    std::string expected;
  };
  const Row rows[] = {
      {"reload", "first line\nsecond line\n", false, "", "first line\nsecond line"},
      // TORCH_CHECK's error without the backtrace LibTorch appends to what().
      {"reload (c10)", "first line\nsecond line", true, "", "first line\nsecond line"},
      {"release", "", false, "gone\nfor good", "release: gone\nfor good"},
      {"both", "first line\nsecond line", false, "gone", "first line\nsecond line\nrelease: gone"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    CountingSubject subject;
    subject.reload_error = row.reload_error;
    subject.reload_error_from_c10 = row.from_c10;
    subject.release_error = row.release_error;
    const BackendReport report = run_subject(subject, options(2, false));
    ASSERT_EQ(report.modes.size(), 2u);
    for (const ModeReport& m : report.modes) {
      EXPECT_EQ(m.error, row.expected) << to_string(m.mode);
      EXPECT_FALSE(m.clean());
      EXPECT_EQ(m.reloads_done, row.reload_error.empty() ? 2 : 0);
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
