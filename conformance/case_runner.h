// case_runner.h: the conformance case runner. It evaluates cases written in
// the case format (golden/FORMAT.md, version 1; its first three operations
// are those of the shared case-format.md) against the reloadsafe utilities
// and reports, as JSON, what the utilities did to tensors, storages and
// layers.
//
// Invariant: evaluating a case never throws and never aborts the process,
// whatever the input line holds. Every case the runner cannot evaluate (bad
// JSON, unknown operation or dtype, negative or overflowing sizes, a layout
// that does not fit its storage, a storage above kMaxCaseStorageBytes
// (case_tensors.h), JSON nested beyond kMaxJsonDepth (case_json.h), an
// exception from a utility) yields a line `{"id": ..., "error": "..."}`.
// Cases share no state: each builds its own tensors and layer.
//
// Usage:
//   std::string out = reloadsafe::conformance::evaluate_case(
//       R"({"id": "E2", "op": "extent", "shape": [4, 4], "stride": [1, 4]})");
//   // out == R"({"id":"E2","extent":16})"
#pragma once

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>

namespace reloadsafe::conformance {

/// Evaluates one case, given as one line of JSON, and returns its result as
/// one line of compact JSON (without a newline): the case's `id` first, then
/// either the operation's outputs or `error`. Never throws.
std::string evaluate_case(const std::string& line);

/// Whether a line of a case file holds a case. Lines that are empty or hold
/// only whitespace are not cases: runners skip them and write nothing.
bool is_case_line(const std::string& line);

/// Evaluates every case line of `in` in order and writes one result line for
/// each to `out`. Returns the number of cases evaluated.
int64_t run_cases(std::istream& in, std::ostream& out);

}  // namespace reloadsafe::conformance
