#include "conformance/harness/harness.h"

#include <gtest/gtest.h>

#include <set>

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
    }
    EXPECT_TRUE(report.ok());
  }
  EXPECT_GE(samples, 7);
}

TEST(ReloadHarness, EveryNegativeControlIsFlaggedWithTheRightTensor) {
  int controls = 0;
  for (const auto& backend : BackendRegistry::instance().create_all()) {
    if (!backend->negative_control()) continue;
    ++controls;
    SCOPED_TRACE(backend->name());
    BackendReport report = run_backend(*backend, quick());
    for (const auto& mode : report.modes) {
      std::set<std::string> flagged;
      for (const auto& v : mode.violations) flagged.insert(v.tensor);
      EXPECT_EQ(flagged.count(backend->expected_violation()), 1u) << to_string(mode.mode);
      EXPECT_EQ(flagged.count("forward"), 0u) << "values must still be right; only addresses move";
    }
    EXPECT_TRUE(report.ok());
  }
  EXPECT_GE(controls, 2);
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
  EXPECT_NE(to_table(reports).find("flagged (negative control)"), std::string::npos);
}

}  // namespace
}  // namespace reloadsafe::harness
