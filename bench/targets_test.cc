#include "bench/targets.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace reloadsafe::bench {
namespace {

Measurement time_ns(double ns) {
  Measurement m;
  m.time_ns = ns;
  return m;
}

Measurement throughput(double bytes_per_second) {
  Measurement m;
  m.bytes_per_second = bytes_per_second;
  return m;
}

struct SubjectCase {
  const char* pattern;
  const char* name;
  std::optional<std::string> subject;
};

TEST(TargetsTest, SubjectOfTable) {
  const SubjectCase cases[] = {
      {"BM_Run/*/traced/", "BM_Run/marlin/traced/process_time", "marlin"},
      {"BM_Own/*/", "BM_Own/marlin/process_time", "marlin"},
      {"BM_Own/*", "BM_Own/marlin", "marlin"},
      {"BM_Run/*/traced/", "BM_Run/marlin/untraced/process_time", std::nullopt},
      {"BM_Run/*/traced/", "BM_Other/marlin/traced/process_time", std::nullopt},
      {"BM_Run/*/traced/", "BM_Run//traced/process_time", std::nullopt},  // no component
      {"BM_Run/*/traced/", "BM_Run/marlin", std::nullopt},                // no tail
      {"BM_Run/marlin/", "BM_Run/marlin/traced", std::nullopt},           // no '*'
  };
  for (const SubjectCase& c : cases) {
    EXPECT_EQ(subject_of(c.pattern, c.name), c.subject) << c.pattern << " on " << c.name;
  }
}

// One kMedianTimeRatioAtMost target over the subjects a..e, run on a table
// of measurements.
struct MedianCase {
  const char* what;
  std::map<std::string, Measurement> measured;
  bool applies;
  double median;
  bool met;
};

TEST(TargetsTest, MedianTimeRatioTable) {
  const Target target{Target::Kind::kMedianTimeRatioAtMost,
                      "overhead",
                      "BM_Run/*/traced/",
                      "BM_Run/*/untraced/",
                      0,
                      1.3};
  const std::vector<MedianCase> cases = {
      {"odd count: the middle ratio, however far out the others are",
       {{"BM_Run/a/traced/process_time", time_ns(120)},
        {"BM_Run/a/untraced/process_time", time_ns(100)},
        {"BM_Run/b/traced/process_time", time_ns(900)},
        {"BM_Run/b/untraced/process_time", time_ns(100)},
        {"BM_Run/c/traced/process_time", time_ns(125)},
        {"BM_Run/c/untraced/process_time", time_ns(100)}},
       true,
       1.25,
       true},
      {"even count: the mean of the two middle ratios",
       {{"BM_Run/a/traced/process_time", time_ns(110)},
        {"BM_Run/a/untraced/process_time", time_ns(100)},
        {"BM_Run/b/traced/process_time", time_ns(150)},
        {"BM_Run/b/untraced/process_time", time_ns(100)}},
       true,
       1.3,
       true},
      {"a median above the bound is missed",
       {{"BM_Run/a/traced/process_time", time_ns(140)},
        {"BM_Run/a/untraced/process_time", time_ns(100)}},
       true,
       1.4,
       false},
      {"a candidate without its subject's limit is left out",
       {{"BM_Run/a/traced/process_time", time_ns(110)},
        {"BM_Run/a/untraced/process_time", time_ns(100)},
        {"BM_Run/b/traced/process_time", time_ns(900)}},
       true,
       1.1,
       true},
      {"a subject's limit is its fastest",
       {{"BM_Run/a/traced/process_time", time_ns(120)},
        {"BM_Run/a/untraced/process_time", time_ns(200)},
        {"BM_Run/a/untraced/bytes:64/process_time", time_ns(100)}},
       true,
       1.2,
       true},
      {"nothing to pair: no row, never met",
       {{"BM_Run/a/traced/process_time", time_ns(120)}},
       false,
       0,
       false},
  };
  for (const MedianCase& c : cases) {
    const std::vector<TargetResult> results = evaluate_targets({target}, c.measured);
    if (!c.applies) {
      EXPECT_TRUE(results.empty()) << c.what;
      continue;
    }
    ASSERT_EQ(results.size(), 1u) << c.what;
    EXPECT_NEAR(results[0].value, c.median, 1e-9) << c.what;
    EXPECT_EQ(results[0].met, c.met) << c.what;
    EXPECT_TRUE(results[0].at_most) << c.what;
    EXPECT_EQ(results[0].description, "overhead") << c.what;
  }
}

Measurement with_counter(const std::string& name, double value) {
  Measurement m = time_ns(1000);
  m.counters[name] = value;
  return m;
}

// The counter kinds over one table of measurements: which rows each target
// gives, with what value and verdict.
struct CounterCase {
  const char* what;
  Target target;
  std::vector<std::pair<std::string, double>> rows;  // candidate judged, value
  std::vector<bool> met;
};

TEST(TargetsTest, CounterTable) {
  const std::map<std::string, Measurement> measured = {
      {"BM_Pair/a/process_time", with_counter("overhead", 1.2)},
      {"BM_Pair/b/process_time", with_counter("overhead", 1.5)},
      {"BM_Pair/c/process_time", with_counter("overhead", 1.25)},
      {"BM_Pair/d/process_time", with_counter("other", 9.0)},  // without the counter
      {"BM_Other/a/process_time", with_counter("overhead", 7.0)},
  };
  using K = Target::Kind;
  const std::vector<CounterCase> cases = {
      {"each candidate with the counter, judged on its own",
       {K::kCounterAtMost, "each", "BM_Pair/", "", 0, 1.3, "overhead"},
       {{"BM_Pair/a/process_time", 1.2},
        {"BM_Pair/b/process_time", 1.5},
        {"BM_Pair/c/process_time", 1.25}},
       {true, false, true}},
      {"one candidate by its prefix",
       {K::kCounterAtMost, "one", "BM_Pair/b/", "", 0, 1.3, "overhead"},
       {{"BM_Pair/b/process_time", 1.5}},
       {false}},
      {"a counter nobody reports: no row, never met",
       {K::kCounterAtMost, "none", "BM_Pair/", "", 0, 1.3, "missing"},
       {},
       {}},
      {"the median over the subjects that report it",
       {K::kMedianCounterAtMost, "median", "BM_Pair/*/", "", 0, 1.3, "overhead"},
       {{"BM_Pair/* (median of 3)", 1.25}},
       {true}},
      {"a median above the bound is missed",
       {K::kMedianCounterAtMost, "median", "BM_Pair/*/", "", 0, 1.2, "overhead"},
       {{"BM_Pair/* (median of 3)", 1.25}},
       {false}},
  };
  for (const CounterCase& c : cases) {
    const std::vector<TargetResult> results = evaluate_targets({c.target}, measured);
    ASSERT_EQ(results.size(), c.rows.size()) << c.what;
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(results[i].candidate, c.rows[i].first) << c.what;
      EXPECT_NEAR(results[i].value, c.rows[i].second, 1e-9) << c.what;
      EXPECT_EQ(results[i].met, c.met[i]) << c.what;
      EXPECT_TRUE(results[i].at_most) << c.what;
      EXPECT_FALSE(results[i].is_time) << c.what;
    }
  }
}

TEST(TargetsTest, TimeRatioJudgesEachCandidateAgainstItsOwnLimit) {
  const Target target{
      Target::Kind::kTimeRatioAtMost, "own work", "BM_Run/a/traced/", "BM_Own/a/", 0, 3.0};
  const std::map<std::string, Measurement> measured = {
      {"BM_Run/a/traced/process_time", time_ns(320)},
      {"BM_Own/a/process_time", time_ns(100)},
      {"BM_Own/b/process_time", time_ns(1)},  // another subject's: never the limit
  };
  const std::vector<TargetResult> results = evaluate_targets({target}, measured);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_NEAR(results[0].value, 3.2, 1e-9);
  EXPECT_FALSE(results[0].met);
}

TEST(TargetsTest, BestAtLeastTakesTheFastestCandidateOfEachSize) {
  const Target target{
      Target::Kind::kBestAtLeast, "best vs memcpy", "BM_Copy/", "BM_Limit/", 1024, 0.9};
  const std::map<std::string, Measurement> measured = {
      {"BM_Copy/slow/bytes:4096", throughput(10)},
      {"BM_Copy/fast/bytes:4096", throughput(95)},
      {"BM_Limit/memcpy/bytes:4096", throughput(100)},
      {"BM_Copy/fast/bytes:512", throughput(1)},  // below min_bytes: not judged
      {"BM_Limit/memcpy/bytes:512", throughput(100)},
  };
  const std::vector<TargetResult> results = evaluate_targets({target}, measured);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].bytes, 4096);
  EXPECT_NEAR(results[0].value, 0.95, 1e-9);
  EXPECT_TRUE(results[0].met);
  EXPECT_EQ(results[0].candidate, "BM_Copy/fast/bytes:4096");
}

TEST(TargetsTest, PrintedRowNamesTheSeriesAndHowManySubjects) {
  const Target target{Target::Kind::kMedianTimeRatioAtMost,
                      "overhead",
                      "BM_Run/*/traced/",
                      "BM_Run/*/untraced/",
                      0,
                      1.3};
  const std::map<std::string, Measurement> measured = {
      {"BM_Run/a/traced/process_time", time_ns(120)},
      {"BM_Run/a/untraced/process_time", time_ns(100)},
  };
  std::ostringstream out;
  print_target_results(out, evaluate_targets({target}, measured), "this run");
  EXPECT_NE(out.str().find("met"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("[traced (median of 1)]"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace reloadsafe::bench
