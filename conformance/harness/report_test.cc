// The report's strings: valid UTF-8 whatever the messages they came from.
#include "conformance/harness/report.h"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace reloadsafe::harness
