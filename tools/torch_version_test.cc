// The LibTorch this build compiles against, checked and recorded.
//
// The version LibTorch's own headers declare (torch/version.h) must be the
// one third_party/libtorch/libtorch.bzl read from the installation, and this
// translation unit must be compiled with the C++ standard the rule picked for
// it (tools/defs.bzl passes both in). The version is recorded as the test
// property `torch_version`, which the test summary (tools/summarize_tests.py)
// and the main job's report (tools/report.py) list as the torch tested.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <string>

namespace {

TEST(LibTorch, HeadersAreTheVersionTheRepositoryRuleRead) {
  const std::string rule_version = RELOADSAFE_LIBTORCH_VERSION;  // "2.15.0+cu132"
  RecordProperty("torch_version", rule_version);
  EXPECT_EQ(rule_version.substr(0, rule_version.find('+')), TORCH_VERSION);
}

TEST(LibTorch, CompiledWithTheStandardTheRuleChose) {
  RecordProperty("cxx_standard", RELOADSAFE_CXX_STANDARD);
  const std::string standard = RELOADSAFE_CXX_STANDARD;  // "c++20"
  const long year = std::stol(standard.substr(standard.size() - 2));
  // __cplusplus is 201703L for C++17, 202002L for C++20.
  EXPECT_EQ(__cplusplus / 100 % 100, year) << "__cplusplus is " << __cplusplus;
}

}  // namespace
