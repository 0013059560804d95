#include "conformance/harness/report.h"

namespace reloadsafe::harness {
namespace {

bool matches(const std::string& expected, const std::string& flagged) {
  if (expected.empty()) return false;
  if (flagged == expected) return true;
  // "aten::div" matches "aten::div.Tensor arg 1 (other)"; "scale" matches
  // "scale (undeclared)".
  return flagged.rfind(expected, 0) == 0 && flagged.size() > expected.size() &&
         (flagged[expected.size()] == ' ' || flagged[expected.size()] == '.');
}

}  // namespace

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
