// zoo_rows.h: the C++ rows of the bug zoo as records. A row is a reload bug
// that shipped upstream, re-created as a pair of backends (zoo_backends.cc):
// the layer as it shipped (a negative control) and as its fix left it (a
// sample). Its ZooRow says what the harness must find on the pair.
//
// Invariant: each fact of a row is written once. The row's record, registered
// beside its pair, holds what no backend can be asked: the catalogue id, the
// upstream thread, the mechanism, what the buggy backend must be flagged with
// (with its steps and without them) and the doc's prose. What a backend can
// be asked is asked of it and never copied here: its name (read from the
// classes when the row is registered), the name the upstream fix used
// (Backend::expected_violation() of the buggy one), the steps a run takes
// (Backend::steps()). harness_test reads its expectations for every pair
// from the records, and docs/bug-zoo-cpp.md is generated from them and a run
// of each pair (zoo_doc.h), so neither can list a row the records lack. A
// registered backend named "zoo_..." without a record, or a record whose
// backends are not registered, fails harness_test
// (BugZoo.EveryZooBackendHasARowAndEveryRowNamesRegisteredBackends).
//
// Usage, beside the pair's classes:
//
//   const bool kZ01 = register_zoo_pair<CutlassMoeBuggy, CutlassMoeFixed>([] {
//     ZooRow row;
//     row.id = "Z01";
//     row.thread = "vllm-project/vllm#41670";
//     ...
//     return row;
//   }());
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::harness {

/// One row of the C++ bug zoo: a pair of registered backends and what the
/// harness must report on them.
struct ZooRow {
  /// The catalogue id, "Z01" .. "Z38" (python/tests/zoo/ has every row).
  std::string id;
  /// The upstream thread: "vllm-project/vllm#41670".
  std::string thread;
  /// The catalogue's mechanism class: "F", or "F (+A)" where a second class
  /// shows too (MECHANISMS in python/tests/zoo/__init__.py names them).
  std::string mechanism_class;
  /// The mechanism in one sentence, Markdown, as the doc's table shows it.
  std::string mechanism;

  /// The backend as it shipped: a negative control, flagged in every mode
  /// under its expected_violation(), the name the upstream fix used. Set by
  /// register_zoo_pair from the class.
  std::string buggy;
  /// The backend as the fix left it: a sample that keeps every address in
  /// both modes with the buggy backend's steps. Set by register_zoo_pair.
  std::string fixed;

  /// What a run of the buggy backend must flag in every mode (each a
  /// Violation::tensor or Violation::read, whole): the upstream name or a
  /// name under it, and what else the bug moves or spoils.
  std::vector<std::string> flagged;
  /// Whether the bug computes wrong values on the CPU, so that the buggy
  /// backend's live forward is flagged ("forward"). Without it the values
  /// must stay right and only addresses, numbers or bytes give the bug away.
  bool computes_wrong_values = false;
  /// For a row whose buggy backend asks for steps (Backend::steps()): all
  /// that a run without them flags, in every mode, in order (empty: the run
  /// is clean). Unset for a row that asks for none.
  std::optional<std::vector<std::string>> flagged_without_steps;

  /// The doc's prose for the row (docs/bug-zoo-cpp.md), Markdown. How the
  /// pair's layer is built, where the mechanism sentence is not enough
  /// (may be empty).
  std::string construction;
  /// What the buggy backend's flags show, read against the bug.
  std::string reading;
  /// What the fixed backend does instead.
  std::string fix;
};

/// Adds `row` to the registry; returns true (for a static initialiser).
/// Throws (TORCH_CHECK) when the row lacks an id, a thread, a backend or a
/// flagged name, or when a registered row has its id or names one of its
/// backends: a bug in the records, found when the binary starts.
bool register_zoo_row(ZooRow row);

/// register_zoo_row with `row.buggy` and `row.fixed` the names of the
/// backends `Buggy` and `Fixed` (Backend subclasses, default-constructible).
template <typename Buggy, typename Fixed>
bool register_zoo_pair(ZooRow row) {
  row.buggy = Buggy().name();
  row.fixed = Fixed().name();
  return register_zoo_row(std::move(row));
}

/// Every registered row, in the order registered (the order of
/// zoo_backends.cc, and of the doc).
const std::vector<ZooRow>& zoo_rows();

/// The row whose buggy or fixed backend is named `backend`; nullptr if none.
const ZooRow* find_zoo_row(const std::string& backend);

}  // namespace reloadsafe::harness
