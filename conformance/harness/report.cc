#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/report.h"

namespace reloadsafe::harness {
namespace {

bool matches(const std::string& expected, const std::string& flagged) {
  if (expected.empty()) return false;
  if (flagged == expected) return true;
  // "aten::div" matches "aten::div.Tensor arg 1 (other)"; "scale" matches
  // "scale (undeclared)"; a module cache matches its entries ("cache[key]").
  if (flagged.rfind(expected, 0) != 0 || flagged.size() <= expected.size()) return false;
  const char next = flagged[expected.size()];
  return next == ' ' || next == '.' || next == '[';
}

}  // namespace

std::string valid_utf8(std::string text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = byte(i);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size() && !(n == 2 && c < 0xc2) && !(n == 4 && c > 0xf4);
    for (size_t k = 1; ok && k < n; ++k) ok = (byte(i + k) & 0xc0) == 0x80;
    if (ok && n == 3) {
      const unsigned char d = byte(i + 1);
      ok = !(c == 0xe0 && d < 0xa0) && !(c == 0xed && d >= 0xa0);  // overlong, surrogate
    }
    if (ok && n == 4) {
      const unsigned char d = byte(i + 1);
      ok = !(c == 0xf0 && d < 0x90) && !(c == 0xf4 && d >= 0x90);  // overlong, past U+10FFFF
    }
    if (!ok) {
      text[i] = '?';
      n = 1;
    }
    i += n;
  }
  return text;
}

bool BackendReport::ok() const {
  if (negative_control) {
    for (const auto& m : modes) {
      for (const auto& f : m.flagged) {
        if (matches(expected_violation, f)) return true;
      }
    }
    return false;
  }
  for (const auto& m : modes) {
    if (m.expected_to_pass && !m.clean()) return false;
  }
  return true;
}

}  // namespace reloadsafe::harness
