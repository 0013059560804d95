// The report model: its strings valid UTF-8 whatever the messages they came
// from, and the verdicts decided on its counts and flagged names.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/report.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::harness {
namespace {

struct Utf8Case {
  const char* name;
  std::string in;
  std::string out;
};

TEST(ValidUtf8, KeepsWellFormedTextAndReplacesEveryStrayByte) {
  const Utf8Case cases[] = {
      {"ascii", "address: 0x7f -> 0x80", "address: 0x7f -> 0x80"},
      {"two-byte", "\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9"},
      {"three-byte", "\xe2\x86\x92", "\xe2\x86\x92"},
      {"four-byte", "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
      // c10 prints a DeviceIndex of -1 as one raw byte.
      {"device index -1", "Invalid device argument \xff: did you call init?",
       "Invalid device argument ?: did you call init?"},
      {"truncated", "ab\xe2\x86", "ab??"},
      {"lone continuation", "\x80x", "?x"},
      {"overlong", "\xc0\xaf", "??"},
      {"surrogate", "\xed\xa0\x80", "???"},
      {"past U+10FFFF", "\xf4\x90\x80\x80", "????"},
      {"empty", "", ""},
  };
  for (const Utf8Case& c : cases) {
    EXPECT_EQ(valid_utf8(c.in), c.out) << c.name;
  }
}

ModeReport mode(ReloadMode m, bool claimed, int64_t violations, std::string error = "",
                std::vector<std::string> flagged = {}) {
  ModeReport r;
  r.mode = m;
  r.expected_to_pass = claimed;
  r.violation_count = violations;
  r.error = std::move(error);
  r.flagged = std::move(flagged);
  return r;
}

TEST(ModeReport, IsCleanWithoutAnErrorOrAViolation) {
  EXPECT_TRUE(mode(ReloadMode::kNormal, true, 0).clean());
  EXPECT_FALSE(mode(ReloadMode::kNormal, true, 1).clean());
  EXPECT_FALSE(mode(ReloadMode::kNormal, true, 0, "release: gone").clean());
}

struct OkCase {
  const char* name;
  BackendReport report;
  bool ok;
};

BackendReport sample(std::vector<ModeReport> modes) {
  BackendReport r;
  r.name = "sample";
  r.modes = std::move(modes);
  return r;
}

BackendReport control(std::string expected, std::vector<std::string> flagged_in_direct) {
  BackendReport r;
  r.name = "control";
  r.negative_control = true;
  r.expected_violation = std::move(expected);
  r.modes = {mode(ReloadMode::kNormal, true, 0),
             mode(ReloadMode::kDirect, true, 1, "", std::move(flagged_in_direct))};
  return r;
}

TEST(BackendReport, ASamplePassesWhenEveryClaimedModeIsCleanAControlWhenItsNameIsFlagged) {
  const OkCase cases[] = {
      {"sample, both clean",
       sample({mode(ReloadMode::kNormal, true, 0), mode(ReloadMode::kDirect, true, 0)}), true},
      {"sample, a violation",
       sample({mode(ReloadMode::kNormal, true, 0), mode(ReloadMode::kDirect, true, 2)}), false},
      {"sample, an error",
       sample({mode(ReloadMode::kNormal, true, 0, "boom"), mode(ReloadMode::kDirect, true, 0)}),
       false},
      {"sample, violations in a mode it does not claim",
       sample({mode(ReloadMode::kNormal, false, 5), mode(ReloadMode::kDirect, true, 0)}), true},
      {"control, the tensor itself", control("weight", {"weight"}), true},
      {"control, an op's read", control("aten::div", {"aten::div.Tensor arg 1 (other)"}), true},
      {"control, a name with a remark", control("scale", {"scale (undeclared)"}), true},
      {"control, a module cache's entry", control("_perm", {"_perm[(16, cpu)]"}), true},
      {"control, another cache that starts the same", control("_perm", {"_perms[(16, cpu)]"}),
       false},
      {"control, another op that starts the same", control("aten::div", {"aten::divide"}), false},
      {"control, another name", control("weight", {"bias"}), false},
      {"control, a name it only starts", control("weight_scale", {"weight"}), false},
      {"control, nothing expected", control("", {"weight"}), false},
      {"control, nothing flagged", control("weight", {}), false},
  };
  for (const OkCase& c : cases) {
    EXPECT_EQ(c.report.ok(), c.ok) << c.name;
  }
}

}  // namespace
}  // namespace reloadsafe::harness
