// report.h: what a reload check found, per subject and mode.
//
// The protocol (protocol.h) fills these; report_format.h writes them as JSON
// for machines and as a table for people; the Python API wraps them. A
// report holds strings and numbers only: nothing in it keeps a tensor or a
// layer alive.
//
// Invariant: ModeReport::violation_count counts every violation and
// ModeReport::flagged names every distinct tensor and read flagged, whether
// or not the violation is listed (listing stops at RunOptions::max_listed);
// verdicts (BackendReport::ok) are decided on those, never on the list.
#pragma once

#include "conformance/harness/subject.h"

#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// One broken promise after one reload.
struct Violation {
  int reload = 0;  ///< 1-based reload number
  /// The tensor's name: a runtime or derived name, "checkpoint:<name>",
  /// "input", "canary", "forward", "replay", "memory", "op sequence", or for
  /// a traced read the name its storage has ("undeclared tensor" if none).
  std::string tensor;
  std::string what;  ///< "address", "storage", "layout", "missing", "grew", ...
  std::string before;
  std::string after;
  /// For a traced read: "aten::div.Tensor arg 1 (other)"; empty otherwise.
  std::string read;
};

/// A remark that is not a violation (an undeclared read that stays put, an
/// op the CPU replay cannot run).
struct Warning {
  std::string tensor;
  std::string read;
  std::string message;
};

struct ModeReport {
  ReloadMode mode = ReloadMode::kNormal;
  bool expected_to_pass = true;  ///< the subject declares this mode
  int reloads_done = 0;
  int64_t violation_count = 0;
  /// Every distinct tensor (Violation::tensor) and read (Violation::read)
  /// flagged, whether or not listed (listing stops at max_listed).
  std::vector<std::string> flagged;
  std::vector<Violation> violations;
  std::vector<Warning> warnings;
  /// Distinct tensors (storages) the captured forward reads from outside,
  /// the input excluded: declared ones and undeclared ones.
  int declared_reads = 0;
  int undeclared_reads = 0;
  /// Bytes in live CPU tensor storages (or CUDA allocated bytes) after the
  /// cold load and after each reload; empty where not measured.
  std::vector<int64_t> memory_bytes;
  /// Replays of the forward's captured device graph (on CUDA: one per
  /// reload; 0 on the CPU).
  int graph_replays = 0;
  /// The message of an exception from the subject or the protocol, whole
  /// (it may run over several lines); then, on a line of its own starting
  /// "release: ", one from the subject's release() at the mode's end.
  std::string error;
  bool clean() const { return error.empty() && violation_count == 0; }
};

/// `text` as valid UTF-8: every byte that does not belong to a well-formed
/// sequence becomes '?'. Messages from libraries can carry raw bytes (c10
/// prints a DeviceIndex of -1 as the byte 0xff); a report's strings go to
/// JSON and to Python, which both need UTF-8.
std::string valid_utf8(std::string text);

struct BackendReport {
  std::string name;
  std::string description;
  bool negative_control = false;
  std::string expected_violation;
  std::vector<ModeReport> modes;

  /// A sample passes when every mode it declares is clean; a negative
  /// control passes (is detected) when some mode flags the tensor or read it
  /// names (matched against every violation, listed or not).
  bool ok() const;
};

}  // namespace reloadsafe::harness
