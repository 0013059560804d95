// violation_sink.h: where one mode's violations go (ModeReport), as the
// protocol and its steps find them.
//
// Invariant: every violation is counted and every name it flags (its tensor
// and its read) is in ModeReport::flagged, once; only the first `max_listed`
// violations are kept whole. Their text is valid UTF-8 whatever a layer put
// in a name or a message.
#pragma once

#include "conformance/harness/report.h"

#include <string>

namespace reloadsafe::harness {

/// Counts every violation of a mode and lists the first few.
class ViolationSink {
 public:
  /// Adds to `report`, listing at most `max_listed` violations.
  ViolationSink(ModeReport& report, int max_listed) : report_(report), max_listed_(max_listed) {}

  /// Counts `v`, flags its names and lists it while listing().
  void add(Violation v);

  /// add() of a violation at `reload` of `tensor` (and, for a traced read,
  /// its `read`).
  void add(int reload, std::string tensor, std::string what, std::string before, std::string after,
           std::string read = "");

  /// Whether the next violation is listed (and so worth its before and
  /// after): listing stops at max_listed, counting and flagging do not.
  bool listing() const { return static_cast<int>(report_.violations.size()) < max_listed_; }

 private:
  void flag(const std::string& name);

  ModeReport& report_;
  int max_listed_;
};

}  // namespace reloadsafe::harness
