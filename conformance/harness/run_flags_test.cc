#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/run_flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// Runs parse_run_flag over `args` as a binary's loop would; the arguments it
// did not take, in order.
std::vector<std::string> parse(std::vector<std::string> args, RunOptions& options) {
  std::vector<char*> argv{const_cast<char*>("binary")};
  for (std::string& a : args) argv.push_back(a.data());
  std::vector<std::string> rest;
  for (int i = 1; i < static_cast<int>(argv.size()); ++i) {
    if (!parse_run_flag(static_cast<int>(argv.size()), argv.data(), i, options))
      rest.push_back(argv[i]);
  }
  return rest;
}

TEST(RunFlags, SetsEachOptionAndLeavesOtherArguments) {
  RunOptions options;
  const auto rest = parse(
      {"--reloads", "7", "--json", "--device", "cpu", "--seed", "0", "--no-trace", "--backend"},
      options);
  EXPECT_EQ(options.reloads, 7);
  EXPECT_TRUE(options.device.is_cpu());
  EXPECT_EQ(options.seed, 0u);
  EXPECT_FALSE(options.trace);
  EXPECT_EQ(rest, (std::vector<std::string>{"--json", "--backend"}));
}

TEST(RunFlags, SetsEachStep) {
  RunOptions options;
  const auto rest =
      parse({"--sleep", "2", "--recreate-parameters", "--host-numbers", "--compare-state",
             "--compare-forward-state", "--cold-footprint-tolerance", "4096",
             "--reload-peak-budget", "0", "--x"},
            options);
  EXPECT_EQ(options.steps, ReloadSteps()
                               .set("sleep", 2)
                               .set("recreate_parameters")
                               .set("host_numbers")
                               .set("compare_state")
                               .set("compare_forward_state")
                               .set("cold_footprint_tolerance_bytes", 4096)
                               .set("reload_peak_budget_bytes", 0));
  EXPECT_EQ(rest, (std::vector<std::string>{"--x"}));
}

TEST(RunFlags, TakesACudaDeviceWithoutNeedingOne) {
  RunOptions options;
  parse({"--device", "cuda:1"}, options);
  EXPECT_TRUE(options.device.is_cuda());
  EXPECT_EQ(options.device.index(), 1);
}

// The usage the binaries print names every step's flag, each once, with
// what it takes, in lines no wider than asked.
TEST(RunFlags, TheUsageOfTheStepsComesFromTheTable) {
  const std::string usage = steps_usage("    ", 60);
  for (const StepSpec& step : step_table()) {
    const std::string value = value_text(step);
    const std::string item =
        std::string("[") + step.flag + (value.empty() ? "" : " " + value) + "]";
    const size_t at = usage.find(item);
    ASSERT_NE(at, std::string::npos) << item << "\n" << usage;
    EXPECT_EQ(usage.find(item, at + 1), std::string::npos) << item;
  }
  size_t start = 0;
  for (size_t end = usage.find('\n'); end != std::string::npos; end = usage.find('\n', start)) {
    const std::string line = usage.substr(start, end - start);
    EXPECT_LE(line.size(), 60u) << line;
    EXPECT_EQ(line.rfind("    [", 0), 0u) << line;
    start = end + 1;
  }
  EXPECT_EQ(start, usage.size()) << "ends with a newline";
  // Every flag of the table is taken, and a switch takes no value.
  for (const StepSpec& step : step_table()) {
    SCOPED_TRACE(step.flag);
    RunOptions options;
    std::vector<std::string> args = {step.flag};
    if (step.takes != StepTakes::kSwitch)
      args.push_back(step.takes == StepTakes::kLevel ? "1" : "0");
    args.push_back("--next");
    EXPECT_EQ(parse(args, options), (std::vector<std::string>{"--next"}));
    EXPECT_TRUE(options.steps.has(step.name));
    check_steps(options.steps);  // what a flag sets, the protocol takes
  }
}

struct BadCase {
  std::vector<std::string> args;
  std::string message;
};

TEST(RunFlags, RefusesBadValuesNamingTheFlag) {
  const std::vector<BadCase> cases = {
      {{"--reloads", "0"}, "--reloads takes an integer >= 1, not '0'"},
      {{"--reloads", "3x"}, "--reloads takes an integer >= 1, not '3x'"},
      {{"--reloads", "-2"}, "--reloads takes an integer >= 1, not '-2'"},
      {{"--seed", "-1"}, "--seed takes an integer >= 0, not '-1'"},
      {{"--seed", ""}, "--seed takes an integer >= 0, not ''"},
      {{"--device", "meta"}, "--device takes cpu or cuda[:I], not 'meta'"},
      {{"--device", "gpu"}, "--device takes cpu or cuda[:I], not 'gpu'"},
      {{"--reloads"}, "--reloads needs a value"},
      {{"--device"}, "--device needs a value"},
      {{"--sleep", "0"}, "--sleep takes an integer >= 1, not '0'"},
      {{"--sleep", "3"}, "--sleep takes 1 to 2, not 3"},
      {{"--cold-footprint-tolerance", "-1"},
       "--cold-footprint-tolerance takes an integer >= 0, not '-1'"},
      {{"--reload-peak-budget"}, "--reload-peak-budget needs a value"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.args.front());
    RunOptions options;
    try {
      parse(c.args, options);
      ADD_FAILURE() << "accepted";
    } catch (const BadFlag& e) {
      EXPECT_EQ(std::string(e.what()), c.message);
    }
    EXPECT_EQ(options.reloads, RunOptions{}.reloads) << "a refused flag changes nothing";
    EXPECT_FALSE(options.steps.any()) << "a refused flag changes nothing";
  }
}

}  // namespace
}  // namespace reloadsafe::harness
