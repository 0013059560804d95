#include "conformance/harness/harness.h"
#include "conformance/harness/backends/zoo_rows.h"
#include "conformance/harness/report_format.h"

#include "conformance/trace/read_trace.h"
#include "conformance/trace/trace_key.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/zeros.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

RunOptions quick() {
  RunOptions o;
  o.reloads = 5;
  return o;
}

TEST(ReloadHarness, EverySampleBackendKeepsEveryAddressInTheModesItClaims) {
  int samples = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->negative_control()) continue;
    ++samples;
    SCOPED_TRACE(backend->name());
    BackendReport report = run_backend(*backend, quick());
    for (const auto& mode : report.modes) {
      if (!mode.expected_to_pass) continue;
      EXPECT_EQ(mode.error, "") << to_string(mode.mode);
      EXPECT_EQ(mode.violation_count, 0) << to_string(mode.mode) << "\n" << to_table({report});
      EXPECT_EQ(mode.reloads_done, 5);
      EXPECT_TRUE(mode.warnings.empty()) << to_table({report});
      EXPECT_GT(mode.declared_reads, 0);
      EXPECT_EQ(mode.undeclared_reads, 0);
      EXPECT_EQ(mode.memory_bytes.size(), 6u) << "cold load and every reload are counted";
    }
    EXPECT_TRUE(report.ok());
  }
  EXPECT_GE(samples, 7);
}

// What each negative control must be flagged with, in every mode: the
// controls of backends/negative_controls.cc here, and the buggy backend of
// each bug zoo row (backends/zoo_backends.cc) with its row's `flagged`.
const std::map<std::string, std::vector<std::string>>& expected_flags() {
  static const auto* flags = [] {
    auto* flags = new std::map<std::string, std::vector<std::string>>{
        {"neg_fresh_copy", {"weight", "aten::t arg 0 (self)", "replay"}},
        {"neg_realloc_derived", {"W_UK", "aten::mm arg 1 (mat2)", "replay"}},
        {"neg_undeclared_scale",
         {"col_scale (undeclared)", "aten::div.Tensor arg 1 (other)", "replay"}},
        {"neg_held_outside", {"undeclared tensor", "aten::mm arg 1 (mat2)", "replay"}},
        {"neg_leak", {"memory"}},
        // Permuting x and w alike gives the same product: a stale index still
        // computes the right values, so only the op sequence gives it away.
        {"neg_lazy_sort", {"op sequence"}},
        // Reads through a kept raw pointer: nothing but the poisoned freed
        // block (memory_census.h, Note [Poison quarantine]) gives it away.
        {"neg_raw_pointer", {"forward"}},
        // Re-made after every reload: missing at the declared check, and the
        // traced forward now makes what the capture read from outside.
        {"neg_workspace_per_reload", {"workspace"}},
    };
    for (const ZooRow& row : zoo_rows()) {
      if (!flags->emplace(row.buggy, row.flagged).second) {
        throw std::logic_error(row.buggy + " has flags of its own and a zoo row's");
      }
    }
    return flags;
  }();
  return *flags;
}

// The controls whose stale read computes wrong values on the CPU: a zoo
// row's buggy backend as its row says (a step, a sleep or re-created
// parameters, leaves garbage the forward reads), and neg_raw_pointer.
bool computes_wrong_values(const std::string& control) {
  if (const ZooRow* row = find_zoo_row(control)) return row->computes_wrong_values;
  return control == "neg_raw_pointer";
}

TEST(ReloadHarness, EveryNegativeControlIsFlaggedWithTheRightTensorAndOp) {
  int controls = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (!backend->negative_control()) continue;
    ++controls;
    SCOPED_TRACE(backend->name());
    ASSERT_EQ(expected_flags().count(backend->name()), 1u) << "add the control to expected_flags()";
    BackendReport report = run_backend(*backend, quick());
    for (const auto& mode : report.modes) {
      SCOPED_TRACE(to_string(mode.mode));
      EXPECT_EQ(mode.error, "");
      const std::set<std::string> flagged(mode.flagged.begin(), mode.flagged.end());
      for (const auto& want : expected_flags().at(backend->name())) {
        EXPECT_EQ(flagged.count(want), 1u) << "not flagged: " << want << "\n" << to_table({report});
      }
      if (!computes_wrong_values(backend->name())) {
        EXPECT_EQ(flagged.count("forward"), 0u)
            << "values must still be right; only addresses move";
      }
    }
    EXPECT_TRUE(report.ok());
  }
  EXPECT_EQ(controls, static_cast<int>(expected_flags().size()));
}

const Backend& backend_named(const std::string& name) {
  static auto* all =
      new std::vector<std::unique_ptr<Backend>>(BackendRegistry::instance().create_all());
  for (const auto& b : *all) {
    if (b->name() == name) return *b;
  }
  throw std::runtime_error("no backend " + name);
}

// `flagged` names `name`: it is the name, or starts with it and a space
// ("scale (undeclared)") or a dot ("kernel.w1_scale" names "kernel").
bool names(const std::string& flagged, const std::string& name) {
  return flagged.rfind(name, 0) == 0 &&
         (flagged.size() == name.size() || flagged[name.size()] == ' ' ||
          flagged[name.size()] == '.' || flagged[name.size()] == '[');
}

// Every registered backend named "zoo_..." is one of a row's pair, and every
// row (zoo_rows.h) names two registered backends: the buggy one a negative
// control whose expected_violation() its row's `flagged` names, the fixed
// one a sample; a row says what is flagged without steps exactly when its
// buggy backend asks for some.
TEST(BugZoo, EveryZooBackendHasARowAndEveryRowNamesRegisteredBackends) {
  std::set<std::string> registered;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name().rfind("zoo_", 0) != 0) continue;
    registered.insert(backend->name());
    EXPECT_NE(find_zoo_row(backend->name()), nullptr)
        << backend->name() << " has no row: register one beside it (zoo_rows.h)";
  }
  EXPECT_GE(registered.size(), 16u) << "the zoo's backends are not linked";
  for (const ZooRow& row : zoo_rows()) {
    SCOPED_TRACE(row.id);
    for (const std::string& name : {row.buggy, row.fixed}) {
      EXPECT_EQ(registered.count(name), 1u) << name << " is not registered";
      EXPECT_EQ(name.rfind("zoo_" + row.id + "_", 0), 0u) << name << " does not carry the row's id";
    }
    if (registered.count(row.buggy) == 0 || registered.count(row.fixed) == 0) continue;
    const Backend& buggy = backend_named(row.buggy);
    EXPECT_TRUE(buggy.negative_control());
    EXPECT_FALSE(backend_named(row.fixed).negative_control());
    EXPECT_TRUE(
        std::any_of(row.flagged.begin(), row.flagged.end(),
                    [&](const std::string& f) { return names(f, buggy.expected_violation()); }))
        << "the row's flagged names miss the upstream name " << buggy.expected_violation();
    EXPECT_EQ(row.flagged_without_steps.has_value(), buggy.steps().any())
        << "a row says what is flagged without steps exactly when its buggy backend asks for some";
  }
}

// The C++ rows of the bug zoo (zoo_rows.h), a pair each: the buggy backend
// is flagged in both modes under the name the upstream fix used (its
// expected_violation()), the fixed one keeps every address in both, without
// a warning, and passes with the steps the buggy one asks for.
TEST(BugZoo, EachBuggyBackendIsFlaggedUnderTheUpstreamNameAndItsFixPasses) {
  ASSERT_GE(zoo_rows().size(), 8u) << "the zoo's rows are not linked";
  RunOptions options = quick();
  options.max_listed = 1000;
  for (const ZooRow& row : zoo_rows()) {
    SCOPED_TRACE(row.id + " " + row.buggy);
    const Backend& buggy = backend_named(row.buggy);
    EXPECT_TRUE(buggy.negative_control());
    const std::string upstream_name = buggy.expected_violation();
    ASSERT_NE(upstream_name, "");
    const BackendReport flagged = run_backend(buggy, options);
    ASSERT_EQ(flagged.modes.size(), 2u);
    for (const auto& mode : flagged.modes) {
      SCOPED_TRACE(to_string(mode.mode));
      EXPECT_EQ(mode.error, "");
      EXPECT_TRUE(std::any_of(mode.flagged.begin(), mode.flagged.end(), [&](const std::string& f) {
        return names(f, upstream_name);
      })) << to_table({flagged});
    }
    EXPECT_TRUE(flagged.ok());

    const Backend& fixed = backend_named(row.fixed);
    EXPECT_FALSE(fixed.negative_control());
    RunOptions with_buggy_steps = options;
    with_buggy_steps.steps = buggy.steps();
    const BackendReport clean = run_backend(fixed, with_buggy_steps);
    ASSERT_EQ(clean.modes.size(), 2u);
    for (const auto& mode : clean.modes) {
      SCOPED_TRACE(to_string(mode.mode));
      EXPECT_TRUE(mode.expected_to_pass);
      EXPECT_TRUE(mode.clean()) << to_table({clean});
      EXPECT_TRUE(mode.warnings.empty()) << to_table({clean});
      EXPECT_EQ(mode.undeclared_reads, 0);
    }
    EXPECT_TRUE(clean.ok());
  }
}

// A Backend's subject with the steps it asks for taken away: what a run
// without them sees.
class WithoutItsSteps : public BackendSubject {
 public:
  using BackendSubject::BackendSubject;
  SubjectInfo info() const override {
    SubjectInfo info = BackendSubject::info();
    info.steps = ReloadSteps();
    return info;
  }
};

// The zoo rows only a step brings out: each buggy backend asks for its step
// (Backend::steps(), which the subject hands the protocol as
// SubjectInfo::steps), and without it the upstream name is flagged in
// neither mode: what is flagged then is exactly the row's
// `flagged_without_steps` (nothing, or for Z37, whose captured ops still
// replay the old number, `replay`: only the host_numbers step says which
// number).
TEST(BugZoo, EachBackendThatAsksForAStepIsNotNamedWithoutIt) {
  const RunOptions options = quick();
  int rows = 0;
  for (const ZooRow& row : zoo_rows()) {
    if (!row.flagged_without_steps) continue;
    ++rows;
    SCOPED_TRACE(row.id + " " + row.buggy);
    const Backend& buggy = backend_named(row.buggy);
    EXPECT_TRUE(buggy.steps().any());
    EXPECT_TRUE(BackendSubject(buggy, options.device).info().steps.any())
        << "the subject hands the protocol the backend's steps";
    WithoutItsSteps subject(buggy, options.device);
    ASSERT_FALSE(subject.info().steps.any());
    const BackendReport report = run_subject(subject, options);
    ASSERT_EQ(report.modes.size(), 2u);
    for (const auto& mode : report.modes) {
      SCOPED_TRACE(to_string(mode.mode));
      EXPECT_EQ(mode.error, "");
      EXPECT_EQ(mode.reloads_done, options.reloads);
      EXPECT_FALSE(
          std::any_of(mode.flagged.begin(), mode.flagged.end(),
                      [&](const std::string& f) { return names(f, buggy.expected_violation()); }))
          << "named without its step\n"
          << to_table({report});
      EXPECT_EQ(mode.flagged, *row.flagged_without_steps) << to_table({report});
      EXPECT_TRUE(mode.warnings.empty()) << to_table({report});
    }
  }
  EXPECT_GE(rows, 5) << "the zoo's rows with steps are not linked";
}

// A TorchBind instance handed to its op from C++ is named by the instance:
// the buggy backend's new instance is "object replaced" under its name; the
// fixed one, refilled in place, is the same object on every call.
TEST(BugZoo, ATorchBindKernelHandedFromCppIsReplacedOnlyWhenItsInstanceIs) {
  RunOptions options = quick();
  options.max_listed = 1000;
  const auto replaced = [](const ModeReport& mode) {
    return std::count_if(mode.violations.begin(), mode.violations.end(),
                         [](const Violation& v) { return v.what == "object replaced"; });
  };
  const BackendReport buggy = run_backend(backend_named("zoo_Z01_cutlass_moe_buggy"), options);
  for (const auto& mode : buggy.modes) {
    EXPECT_EQ(replaced(mode), options.reloads) << "once per reload";
    for (const auto& v : mode.violations) {
      if (v.what == "object replaced") {
        EXPECT_EQ(v.tensor, "kernel");
        EXPECT_EQ(v.read, "reloadsafe_zoo_cpp::cutlass_moe arg 3 (kernel)");
      }
    }
  }
  const BackendReport fixed = run_backend(backend_named("zoo_Z01_cutlass_moe_fixed"), options);
  for (const auto& mode : fixed.modes) {
    EXPECT_EQ(replaced(mode), 0) << to_table({fixed});
    EXPECT_GT(mode.declared_reads, 0);
  }
}

// Everyday CPU work that goes through oneDNN and the CPU allocator's raw
// path, which the census used to abort on.
void everyday_cpu_work() {
  const at::Tensor x = at::randn({2, 3, 16, 16});
  const at::Tensor w = at::randn({4, 3, 3, 3});
  at::Tensor y = at::conv2d(x, w, {}, 1, 1);
  ASSERT_EQ(y.sizes(), (at::IntArrayRef{2, 4, 16, 16}));
  at::Tensor z = at::max_pool2d(at::relu(y), {2, 2});
  ASSERT_EQ(z.size(3), 8);
  if (at::hasMKLDNN()) {
    at::Tensor m = x.to_mkldnn();
    at::Tensor back = at::add(m, m).to_dense();
    ASSERT_TRUE(at::allclose(back, x * 2));
  }
  ASSERT_TRUE(at::allclose(at::mm(at::eye(8), at::ones({8, 8})), at::ones({8, 8})));
}

TEST(ReloadHarness, ACheckLeavesTheProcessAsItFoundIt) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  everyday_cpu_work();  // oneDNN caches made before the first check
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    BackendReport report = run_backend(backend_named("conv2d_in_place"), quick());
    EXPECT_TRUE(report.ok()) << to_table({report});
    EXPECT_EQ(c10::GetCPUAllocator(), allocator) << "the census is removed when the check ends";
    everyday_cpu_work();
    {
      trace::ReadTrace trace;  // and a trace, which installs the census too
      everyday_cpu_work();
    }
    EXPECT_EQ(c10::GetCPUAllocator(), allocator);
  }
}

TEST(ReloadHarness, StateMadeByTheFirstForwardAndKeptIsPartOfTheBaseline) {
  BackendReport report = run_backend(backend_named("first_forward_workspace"), quick());
  EXPECT_TRUE(report.ok()) << to_table({report});
  for (const auto& mode : report.modes) EXPECT_EQ(mode.violation_count, 0) << to_table({report});
}

TEST(ReloadHarness, ANegativeControlIsJudgedOnEveryViolationNotOnlyTheListedOnes) {
  RunOptions options = quick();
  options.max_listed = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name() != "neg_lazy_sort") continue;
    BackendReport report = run_backend(*backend, options);
    EXPECT_TRUE(report.modes[0].violations.empty());
    EXPECT_GT(report.modes[0].violation_count, 0);
    EXPECT_TRUE(report.ok());
    return;
  }
  FAIL() << "neg_lazy_sort is not registered";
}

// Violations past the listed ones are counted and flagged without their
// before and after (nothing is formatted for them): the verdict, the count
// and the flagged names must not depend on how many are listed.
TEST(ReloadHarness, HowManyAreListedChangesOnlyTheList) {
  RunOptions few = quick();
  few.max_listed = 1;
  RunOptions all = quick();
  all.max_listed = 1000;
  int checked = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    const BackendReport a = run_backend(*backend, few);
    const BackendReport b = run_backend(*backend, all);
    ASSERT_EQ(a.modes.size(), b.modes.size()) << backend->name();
    EXPECT_EQ(a.ok(), b.ok()) << backend->name();
    for (size_t m = 0; m < a.modes.size(); ++m) {
      SCOPED_TRACE(backend->name() + " mode " + std::to_string(m));
      EXPECT_EQ(a.modes[m].violation_count, b.modes[m].violation_count);
      EXPECT_EQ(a.modes[m].flagged, b.modes[m].flagged);
      EXPECT_LE(a.modes[m].violations.size(), 1u);
      if (b.modes[m].violation_count > 1) ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no backend had more violations than listed";
}

TEST(ReloadHarness, RowPaddingLosesItsAddressOutsideDirectReload) {
  // Documents why rocm_row_padding claims only the direct mode.
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name() != "rocm_row_padding") continue;
    BackendReport report = run_backend(*backend, quick());
    ASSERT_EQ(report.modes[0].mode, ReloadMode::kNormal);
    EXPECT_GT(report.modes[0].violation_count, 0);
    EXPECT_TRUE(report.modes[1].clean());
    return;
  }
  FAIL() << "rocm_row_padding is not registered";
}

TEST(ReloadHarness, ReportsAreWellFormed) {
  std::vector<BackendReport> reports;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name() == "neg_fresh_copy") reports.push_back(run_backend(*backend, quick()));
  }
  ASSERT_EQ(reports.size(), 1u);
  const std::string json = to_json(reports, quick());
  EXPECT_NE(json.find("\"tensor\": \"weight\""), std::string::npos);
  EXPECT_NE(json.find("\"what\": \"address\""), std::string::npos);
  EXPECT_NE(json.find("\"read\": \"aten::t arg 0 (self)\""), std::string::npos);
  EXPECT_NE(json.find("\"declared_reads\": 1"), std::string::npos);
  EXPECT_NE(json.find("\"undeclared_reads\": 0"), std::string::npos);
  EXPECT_NE(to_table(reports).find("flagged (negative control)"), std::string::npos);
}

// Bad backends, run directly (not registered: the CLI must stay green).
class BadBackend : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<Layer>();
    layer->register_param("weight", make_checkpoint_param({4, 4}, at::kFloat, device));
    return layer;
  }
  void process_weights_after_loading(Layer&) const override {}
  std::vector<int64_t> input_shape() const override { return {2, 4}; }
};

class ThrowingForward : public BadBackend {
 public:
  std::string name() const override { return "throwing_forward"; }
  std::string description() const override { return "forward throws"; }
  at::Tensor forward(const Layer&, const at::Tensor&) const override {
    TORCH_CHECK(false, "kernel not built for this GPU");
  }
};

class ReadsNoWeight : public BadBackend {
 public:
  std::string name() const override { return "reads_no_weight"; }
  std::string description() const override { return "forward ignores the layer"; }
  at::Tensor forward(const Layer&, const at::Tensor& x) const override { return x * 2; }
};

TEST(ReloadHarness, AForwardThatThrowsIsThatBackendsErrorAndLeavesNoTraceBehind) {
  BackendReport report = run_backend(ThrowingForward(), quick());
  for (const auto& mode : report.modes) {
    EXPECT_NE(mode.error.find("kernel not built for this GPU"), std::string::npos) << mode.error;
  }
  EXPECT_FALSE(report.ok());
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(trace::kTraceKey));
  // Named by the step of the cold load that raised, and the seeds it drew with.
  EXPECT_NE(to_table({report}).find("error: the cold load's forward (checkpoint seed 1, input seed "
                                    "7920) raised kernel not built"),
            std::string::npos)
      << to_table({report});
  // The next backend runs as usual.
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name() == "transposed") {
      EXPECT_TRUE(run_backend(*backend, quick()).ok());
    }
  }
}

// Two checkpoints give it one output: a check of it would test nothing
// (Note [A check that tests nothing]), refused once for the run, each mode's
// error.
TEST(ReloadHarness, AForwardThatReadsNoWeightIsReportedAsSuch) {
  BackendReport report = run_backend(ReadsNoWeight(), quick());
  for (const auto& mode : report.modes) {
    EXPECT_NE(mode.error.find("the forward gives the same output (shape [2, 4]) for two different "
                              "checkpoints (checkpoint seeds 1 and 1000004)"),
              std::string::npos)
        << mode.error;
    EXPECT_NE(mode.error.find("Backend::output_ignores_weights"), std::string::npos) << mode.error;
  }
  EXPECT_FALSE(report.ok());
}

// A backend that says its output ignores its weights is run: here its
// forward reads none, which the trace then names.
class SaysItIgnoresItsWeights : public ReadsNoWeight {
 public:
  bool output_ignores_weights() const override { return true; }
};

TEST(ReloadHarness, ABackendThatSaysItsOutputIgnoresItsWeightsIsRun) {
  BackendReport report = run_backend(SaysItIgnoresItsWeights(), quick());
  for (const auto& mode : report.modes) {
    EXPECT_NE(mode.error.find("reads no tensor besides its input"), std::string::npos)
        << mode.error;
  }
}

// A forward that reads its weights without the dispatcher: the outputs
// differ, and the trace sees no read of them.
class ReadsWeightsUnseen : public BadBackend {
 public:
  std::string name() const override { return "reads_weights_unseen"; }
  std::string description() const override { return "reads the weight's bytes by pointer"; }
  at::Tensor forward(const Layer& l, const at::Tensor& x) const override {
    const float w = *l.get("weight").const_data_ptr<float>();  // no op: the trace cannot see it
    return x * 2 + static_cast<double>(w);
  }
};

TEST(ReloadHarness, AForwardWhoseReadsTheTraceCannotSeeIsReportedAsSuch) {
  BackendReport report = run_backend(ReadsWeightsUnseen(), quick());
  for (const auto& mode : report.modes) {
    EXPECT_NE(mode.error.find("reads no tensor besides its input"), std::string::npos)
        << mode.error;
  }
  EXPECT_FALSE(report.ok());
}

// A layer whose only parameter carries no checkpoint layout (made without
// make_checkpoint_param).
class NoCheckpointParameter : public BadBackend {
 public:
  std::string name() const override { return "no_checkpoint_parameter"; }
  std::string description() const override { return "a parameter without _ckpt"; }
  std::shared_ptr<Layer> create_layer(const c10::Device&) const override {
    auto layer = std::make_shared<Layer>();
    layer->register_param("weight", at::zeros({4, 4}));
    return layer;
  }
  at::Tensor forward(const Layer& l, const at::Tensor& x) const override {
    return at::mm(x, l.get("weight").t());
  }
};

TEST(ReloadHarness, ABackendWithoutACheckpointParameterIsToldHowToDeclareOne) {
  const std::string says =
      "backend 'no_checkpoint_parameter' created no checkpoint parameter (use "
      "make_checkpoint_param or set _ckpt)";
  const NoCheckpointParameter backend;
  // A session on its own, and the protocol's subject (which reads the
  // layouts before the first cold load).
  try {
    ReloadSession session(backend, c10::kCPU, /*seed=*/1);
    ADD_FAILURE() << "the session was made";
  } catch (const c10::Error& e) {
    EXPECT_EQ(e.what_without_backtrace(), says);
  }
  const BackendReport report = run_backend(backend, quick());
  ASSERT_EQ(report.modes.size(), 2u);
  for (const auto& mode : report.modes) {
    EXPECT_EQ(
        mode.error,
        "drawing the cold load's checkpoint (checkpoint seed 1, input seed 7920) raised " + says)
        << to_string(mode.mode);
  }
}

// A correct backend that counts the layers the harness asks it for.
class CountsLayers : public BadBackend {
 public:
  std::string name() const override { return "counts_layers"; }
  std::string description() const override { return "y = x @ weight^T, counting layers"; }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    ++layers;
    return BadBackend::create_layer(device);
  }
  at::Tensor forward(const Layer& l, const at::Tensor& x) const override {
    return at::mm(x, l.get("weight").t());
  }
  mutable int layers = 0;
};

TEST(ReloadHarness, ARunCreatesALayerPerColdLoadAndPerCheckpointAndNoMore) {
  // The layer made to read the checkpoint layouts is the first cold load's;
  // the second mode's cold load and each checkpoint's cold forward make
  // their own.
  CountsLayers backend;
  const BackendReport report = run_backend(backend, quick());
  EXPECT_TRUE(report.ok()) << to_table({report});
  EXPECT_EQ(backend.layers, 2 + quick().reloads);
}

class TolerantLeak : public Backend {
 public:
  explicit TolerantLeak(std::unique_ptr<Backend> leak) : leak_(std::move(leak)) {}
  std::string name() const override { return "tolerant_leak"; }
  std::string description() const override { return "neg_leak with a tolerance"; }
  std::shared_ptr<Layer> create_layer(const c10::Device& d) const override {
    return leak_->create_layer(d);
  }
  void process_weights_after_loading(Layer& l) const override {
    leak_->process_weights_after_loading(l);
  }
  at::Tensor forward(const Layer& l, const at::Tensor& x) const override {
    return leak_->forward(l, x);
  }
  std::vector<int64_t> input_shape() const override { return leak_->input_shape(); }
  int64_t memory_tolerance_bytes() const override { return 1 << 20; }

 private:
  std::unique_ptr<Backend> leak_;
};

TEST(ReloadHarness, MemoryGrowthWithinTheBackendsToleranceIsNotAViolation) {
  for (auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->name() != "neg_leak") continue;
    BackendReport report = run_backend(TolerantLeak(std::move(backend)), quick());
    EXPECT_TRUE(report.ok()) << to_table({report});
    ASSERT_EQ(report.modes[0].memory_bytes.size(), 6u);
    EXPECT_GT(report.modes[0].memory_bytes.back(), report.modes[0].memory_bytes[1])
        << "the census sees the growth";
    return;
  }
  FAIL() << "neg_leak is not registered";
}

// Note [Device-clean backends]
// A backend must make every tensor with the options of the weights or the
// input it is given; one that calls at::zeros({16, 64}) works on a CPU and
// breaks on a GPU. On a CPU machine the probe runs the backend with its
// weights and input on the meta device: a tensor made without options is a
// CPU tensor there, and the first op that mixes it with a meta tensor
// throws, or it is found among the layer's tensors afterwards.
std::string device_clean_failure(const Backend& backend) {
  const c10::Device meta(c10::kMeta);
  const auto on_meta = [&](Checkpoint ckpt) {
    for (auto& [name, t] : ckpt) t = t.to(meta);
    return ckpt;
  };
  try {
    const ReloadSession drawer(backend, c10::Device(c10::kCPU), /*seed=*/1);
    ReloadSession session(backend, meta, on_meta(drawer.draw_checkpoint(1)));
    const at::Tensor x = at::empty(backend.input_shape(), at::TensorOptions().device(meta));
    at::Tensor out = backend.forward(session.layer(), x);
    session.reload(ReloadMode::kDirect, on_meta(drawer.draw_checkpoint(2)));
    out = backend.forward(session.layer(), x);
    if (!out.is_meta()) return "the forward's output is on " + out.device().str();
    for (const NamedTensor& n : session.named_tensors()) {
      if (n.tensor.defined() && n.tensor.numel() > 0 && !n.tensor.is_meta()) {
        return n.name + " is on " + n.tensor.device().str();
      }
    }
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Whether a probe's failure is an op the meta device lacks (the C++
// library registers fewer meta kernels than Python does): the probe says
// nothing about that backend, either way.
bool no_meta_kernel(const std::string& failure) {
  return failure.find("no fake impl or Meta kernel") != std::string::npos ||
         failure.find("_overrideable not implemented") != std::string::npos;
}

TEST(DeviceClean, EveryBackendMakesItsTensorsOnItsWeightsDevice) {
  std::string probed, unprobed;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (backend->cpu_only()) continue;  // its kernel reads host memory by design
    const std::string failure = device_clean_failure(*backend);
    if (no_meta_kernel(failure)) {
      unprobed += backend->name() + " ";
      continue;
    }
    probed += backend->name() + " ";
    EXPECT_EQ(failure, "") << backend->name();
  }
  RecordProperty("probed", probed);
  RecordProperty("no_meta_kernel", unprobed);  // covered on a GPU by the GPU check
  EXPECT_GE(std::count(probed.begin(), probed.end(), ' '), 10)
      << "probed: " << probed << "; unprobed: " << unprobed;
}

// The probe's negative control: a padding buffer made without options.
class PadsOnTheCpu : public BadBackend {
 public:
  std::string name() const override { return "pads_on_the_cpu"; }
  std::string description() const override { return "a buffer made without the weight's options"; }
  void process_weights_after_loading(Layer& layer) const override {
    layer.set_attribute("padded", at::zeros({4, 8}));  // no options: always the CPU
  }
  at::Tensor forward(const Layer& l, const at::Tensor& x) const override {
    return at::mm(x, l.get("weight").t()) + l.get("padded").narrow(1, 0, 4).sum();
  }
};

TEST(DeviceClean, ATensorMadeWithoutOptionsIsFound) {
  const std::string failure = device_clean_failure(PadsOnTheCpu());
  EXPECT_NE(failure, "");
  EXPECT_TRUE(failure.find("padded") != std::string::npos ||
              failure.find("device") != std::string::npos)
      << failure;
}

}  // namespace
}  // namespace reloadsafe::harness
