#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step_table.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// Every step is whole: a name, a flag and words of its own, a value its
// kind can merge, and it can be made with each value it takes.
TEST(StepTable, EveryStepIsWholeAndDistinct) {
  std::set<std::string> names, flags;
  for (const StepSpec& spec : step_table()) {
    SCOPED_TRACE(spec.name);
    EXPECT_TRUE(names.insert(spec.name).second) << "a name twice";
    EXPECT_TRUE(flags.insert(spec.flag).second) << "a flag twice";
    EXPECT_EQ(std::string(spec.flag).rfind("--", 0), 0u);
    EXPECT_GT(std::string(spec.help).size(), 20u);
    EXPECT_GT(std::string(spec.example).size(), 5u);
    EXPECT_EQ(spec.takes == StepTakes::kLevel, spec.max_level > 0);
    EXPECT_EQ(find_step(spec.name), &spec);
    const int64_t top = spec.takes == StepTakes::kLevel   ? spec.max_level
                        : spec.takes == StepTakes::kBytes ? 4096
                                                          : 1;
    for (int64_t value = spec.takes == StepTakes::kBytes ? 0 : 1; value <= top;
         value += spec.takes == StepTakes::kBytes ? 4096 : 1) {
      const ReloadSteps steps = ReloadSteps().set(spec.name, value);
      check_steps(steps);
      EXPECT_EQ(make_steps(steps).size(), 1u);
      EXPECT_TRUE(takes_kind(steps, spec.kind));
    }
  }
  EXPECT_EQ(find_step("hibernate"), nullptr);
}

struct Refused {
  const char* name;
  ReloadSteps steps;
  std::string says;
};

TEST(StepTable, CheckStepsRefusesWhatNoStepTakesNamingIt) {
  const std::vector<Refused> cases = {
      {"unknown", ReloadSteps().set("hibernate"), "no harness step is named 'hibernate'"},
      {"level 0", ReloadSteps().set("sleep", 0), "sleep takes a level from 1 to 2"},
      {"level 3", ReloadSteps().set("sleep", 3), "sleep takes a level from 1 to 2"},
      {"switch 2", ReloadSteps().set("compare_state", 2), "compare_state is a switch"},
      {"negative", ReloadSteps().set("cold_footprint_tolerance_bytes", -1),
       "cold_footprint_tolerance_bytes is a number of bytes >= 0, not -1"},
  };
  for (const Refused& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      check_steps(c.steps);
      ADD_FAILURE() << "accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(c.says), std::string::npos)
          << e.what_without_backtrace();
    }
  }
}

TEST(StepTable, StepsAreMadeInTableOrder) {
  // Asked in reverse, made in the table's order: hooks of one phase run so.
  ReloadSteps all;
  for (auto it = step_table().rbegin(); it != step_table().rend(); ++it) {
    all.set(it->name, it->takes == StepTakes::kBytes ? 0 : 1);
  }
  EXPECT_EQ(make_steps(all).size(), step_table().size());
  std::vector<std::string> words = step_words(all);
  ASSERT_EQ(words.size(), step_table().size());
  for (size_t i = 0; i < words.size(); ++i) {
    EXPECT_EQ(words[i].rfind("`" + std::string(step_table()[i].name) + "`", 0), 0u) << words[i];
  }
}

struct Merge {
  const char* name;
  ReloadSteps a, b, merged;
};

TEST(StepTable, MergeTakesTheDeeperLevelEverySwitchAndTheTighterBound) {
  const std::vector<Merge> cases = {
      {"levels", ReloadSteps().set("sleep", 1), ReloadSteps().set("sleep", 2),
       ReloadSteps().set("sleep", 2)},
      {"bounds", ReloadSteps().set("reload_peak_budget_bytes", 100),
       ReloadSteps().set("reload_peak_budget_bytes", 50),
       ReloadSteps().set("reload_peak_budget_bytes", 50)},
      {"a bound of 0", ReloadSteps().set("cold_footprint_tolerance_bytes", 0),
       ReloadSteps().set("cold_footprint_tolerance_bytes", 7),
       ReloadSteps().set("cold_footprint_tolerance_bytes", 0)},
      {"either's", ReloadSteps().set("host_numbers"), ReloadSteps().set("compare_state"),
       ReloadSteps().set("host_numbers").set("compare_state")},
      {"none", ReloadSteps(), ReloadSteps(), ReloadSteps()},
  };
  for (const Merge& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(merge_steps(c.a, c.b), c.merged);
    EXPECT_EQ(merge_steps(c.b, c.a), c.merged);
  }
}

// docs/harness-steps.md holds the table as steps_markdown_table() writes it,
// between its markers: a step added, removed or reworded without the docs
// fails here.
TEST(StepTable, TheDocsTableIsTheTables) {
  std::ifstream in("docs/harness-steps.md", std::ios::binary);
  ASSERT_TRUE(in) << "docs/harness-steps.md is not among the test's data";
  std::stringstream page;
  page << in.rdbuf();
  const std::string text = page.str();
  const std::string begin = "<!-- the step table (step_table.h): begin -->\n";
  const std::string end = "<!-- the step table: end -->";
  const size_t from = text.find(begin);
  const size_t to = text.find(end);
  ASSERT_NE(from, std::string::npos) << begin;
  ASSERT_NE(to, std::string::npos) << end;
  const std::string have = text.substr(from + begin.size(), to - from - begin.size());
  const std::string want = steps_markdown_table();
  EXPECT_EQ(have, want) << "docs/harness-steps.md's step table is stale; between its markers "
                           "it must read:\n"
                        << want;
}

}  // namespace
}  // namespace reloadsafe::harness
