// zoo_doc.h: docs/bug-zoo-cpp.md, written from the bug zoo's C++ rows
// (zoo_rows.h) and a run of each row's pair through the reload harness.
//
// Invariant: the text depends only on the rows, the backends and what the
// harness reports on them under fixed options (zoo_doc_options()), never on
// where the allocator put a tensor: a violation is written as its tensor,
// read and what, without its before and after (which hold addresses and
// byte counts), so a build writes the same text on every run.
// zoo_doc_test holds the committed file to what zoo_doc() writes now, and
// fails when the two differ: after changing a row or a backend, regenerate
// the file (tools/gen_bug_zoo_cpp.sh) and review its diff.
//
// Usage:
//   bazel run //conformance/harness:zoo_doc -- $PWD/docs/bug-zoo-cpp.md
#pragma once

#include "conformance/harness/backends/zoo_rows.h"
#include "conformance/harness/report.h"
#include "conformance/harness/run_options.h"

#include <string>
#include <vector>

namespace reloadsafe::harness {

/// A row's pair, run: what the doc says about the row.
struct ZooPairRun {
  const ZooRow* row = nullptr;
  /// The steps the buggy backend asks for (Backend::steps()).
  ReloadSteps steps;
  /// The buggy backend's run, with its steps.
  BackendReport buggy;
  /// The fixed backend's run, with the buggy backend's steps.
  BackendReport fixed;
};

/// The options of the doc's runs: the harness's defaults (kDefaultReloads
/// reloads per mode, seed 1) on the CPU.
RunOptions zoo_doc_options();

/// Every registered row's pair, run with `options` (as harness_test runs
/// them: the fixed backend with the buggy one's steps). Throws when a row
/// names a backend that is not registered.
std::vector<ZooPairRun> run_zoo_pairs(const RunOptions& options);

/// The Markdown of docs/bug-zoo-cpp.md for `runs`, made with `options`.
std::string zoo_doc_markdown(const std::vector<ZooPairRun>& runs, const RunOptions& options);

/// docs/bug-zoo-cpp.md as the rows and the backends linked give it now:
/// zoo_doc_markdown of run_zoo_pairs, with zoo_doc_options().
std::string zoo_doc();

}  // namespace reloadsafe::harness
