// run_flags.h: the command-line flags of a protocol run (RunOptions), shared
// by the harness binaries: reload_harness (harness_main.cc) and the main of
// every reload_harness_test (harness_test_main.cc).
//
// Invariant: a flag is taken only with a value the protocol can run with
// (--reloads N >= 1, --seed S >= 0, --device cpu or cuda[:I], --sleep 1 or 2,
// byte bounds >= 0); any other value,
// or a flag without its value, is a BadFlag naming the flag and what it
// takes. Each binary prints that with its usage and exits 2.
#pragma once

#include "conformance/harness/run_options.h"
#include "conformance/harness/step_table.h"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// A command line refused; what() says which argument and what it takes.
class BadFlag : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The value of the flag at argv[i] (argv[i + 1]); advances i past it.
/// Throws BadFlag when argv[i] is the last argument.
std::string flag_value(int argc, char** argv, int& i);

/// The steps' flags (step_table.h) as a usage line, "[--sleep 1|2]
/// [--recreate-parameters] ...", each line starting with `indent` and wrapped before `width`
/// characters; ends with a newline.
std::string steps_usage(const std::string& indent, size_t width = 100);

/// If argv[i] is one of RunOptions' flags (--reloads N, --device D, --seed S,
/// --no-trace) or a step's (StepSpec::flag in step_table.h), sets it in `options`, advances i
/// past its value and returns true; returns false, changing nothing, for any
/// other argument. Throws BadFlag for a missing or bad value.
bool parse_run_flag(int argc, char** argv, int& i, RunOptions& options);

}  // namespace reloadsafe::harness
