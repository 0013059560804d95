// step_table.h: the one table of the harness steps (step.h), and what is
// derived from it: the validation of a run's steps, their merge, the steps
// a mode runs, and their descriptions for usage texts, docs and the Python
// module.
//
// Invariant: a step is written once, as its spec and its Step class in its
// own file under steps/, and listed once, in step_table.cc. The harness
// binaries' flags (run_flags.h), the Python module's keywords and their
// validation (reloadsafe._C.step_table), the usage texts and the docs'
// table of steps (docs/harness-steps.md, drift-tested) all read the table;
// none lists the steps itself. Adding a step touches its file under steps/,
// a test of it, and this table.
#pragma once

#include "conformance/harness/run_options.h"
#include "conformance/harness/step.h"

#include <memory>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// Every step, in the order their hooks run within a phase.
const std::vector<StepSpec>& step_table();

/// The step named `name`, or nullptr.
const StepSpec* find_step(const std::string& name);

/// What a step's value is, as a usage line shows it: "" for a switch,
/// "1|2" for a level, "BYTES" for a bound.
std::string value_text(const StepSpec& spec);

/// Throws c10::Error naming the first step of `steps` that cannot be taken:
/// a name the table lacks (the message lists the names there are), a level
/// outside 1..max_level, a switch other than 1, a negative byte bound.
void check_steps(const ReloadSteps& steps);

/// Every step either asks for: the deeper level, each switch either takes,
/// the tighter of two bounds.
ReloadSteps merge_steps(const ReloadSteps& a, const ReloadSteps& b);

/// The steps of `steps` made, in table order (check_steps first).
std::vector<std::unique_ptr<Step>> make_steps(const ReloadSteps& steps);

/// Whether `steps` takes a step of `kind`.
bool takes_kind(const ReloadSteps& steps, StepKind kind);

/// `steps` as Markdown words, one per step in table order: "`sleep` 2",
/// "`compare_state`".
std::vector<std::string> step_words(const ReloadSteps& steps);

/// The table as a Markdown table (name, flag, value, kind, what it does):
/// the one docs/harness-steps.md holds, drift-tested against this.
std::string steps_markdown_table();

}  // namespace reloadsafe::harness
