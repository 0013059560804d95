// operation.h: the table of case operations the runner dispatches on.
//
// Each operation reads its case (already parsed, with its `id` written to
// `out`) and adds its outputs to `out` in the documented order. It reports a
// case it cannot evaluate by throwing (c10::Error with an actionable
// message); the runner turns that into the case's error line. Operations
// share no state: each builds its own tensors and layer.
//
// The list of operations is ops/operations.inc; it declares the functions
// and fills the table, so the two cannot drift apart.
#pragma once

#include "conformance/case_json.h"

#include <string>

namespace reloadsafe::conformance {

/// An operation of the case format.
using Operation = void (*)(const Json& c, OJson& out);

#define RS_CASE_OPERATION(name) void run_##name(const Json& c, OJson& out);
#include "conformance/ops/operations.inc"
#undef RS_CASE_OPERATION

/// The operation a case names in `op`, or nullptr for an unknown name.
Operation find_operation(const std::string& name);

}  // namespace reloadsafe::conformance
