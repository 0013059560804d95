// cold_start.h: the cold load a mode starts from, and the rules the
// protocol asks of it once per run: a check that would test nothing is
// refused, and host numbers no load decides are left out.
//
// Invariant: what the steps of a cold load raise is the mode's error, named
// by the step and the seeds it drew with (in_stage), never a reload's
// violation: no reload has run yet.
#pragma once

#include "conformance/harness/cold_loads.h"
#include "conformance/harness/digest.h"
#include "conformance/harness/step.h"
#include "conformance/harness/subject.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// The warm-up of `layer` on `x`: engines run the forward before they
/// capture, and state it makes and keeps (a workspace, a first-forward
/// repack) belongs to the capture. With `under_trace`, the forward runs
/// once more under the trace's key (Note [A warm-up under the trace's key]).
/// Returns the first forward's output.
at::Tensor warm_up(SubjectLayer& layer, const at::Tensor& x, bool under_trace);

/// What a layer's step raised, in one line of valid UTF-8: a c10 error
/// without the C++ backtrace LibTorch appends, any other the first line of
/// its message.
std::string raised_text(const std::exception& e);

/// Runs `run`, the step of a cold load called `stage` ("the cold load's
/// forward (checkpoint seed 1, input seed 7920)"); what it raises is
/// rethrown as a c10::Error "<stage> raised <what it raised>" (Note [The
/// cold load a run starts from]).
template <typename F>
auto in_stage(const std::string& stage, F&& run) -> decltype(run()) {
  try {
    return run();
  } catch (const std::exception& e) {
    C10_THROW_ERROR(Error, stage + " raised " + raised_text(e));
  }
}

/// Throws c10::Error when the forward gives `out`, the output of the cold
/// load of the checkpoint `first` digested, for a cold load of reload 1's
/// checkpoint too (Note [A check that tests nothing]); that cold load's
/// output is kept in `cold_loads` for reload 1.
void refuse_a_check_that_tests_nothing(ModeContext& mode, ColdLoadOutputs& cold_loads,
                                       const CheckpointDigest& first, const at::Tensor& out);

/// Appends to `free_names` the host numbers of the live layer (after its
/// warm-up) that a cold load of `ckpt` leaves at another value (Note
/// [Numbers that no load decides]).
void free_numbers_no_load_decides(ModeContext& mode, const Checkpoint& ckpt,
                                  std::vector<std::string>& free_names);

}  // namespace reloadsafe::harness
