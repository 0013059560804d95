#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/cold_start.h"

#include "conformance/harness/layer_life.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/values.h"
#include "conformance/trace/read_trace.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace reloadsafe::harness {

// Note [The cold load a run starts from]
// Before any reload, a step of the cold load that raises (drawing the input
// or the checkpoint, the load and post-processing, the forward) is bad input,
// not a reload's bug: the mode's error, naming the step and the seeds it
// drew with, so the author can run that very step again.

at::Tensor warm_up(SubjectLayer& layer, const at::Tensor& x, bool under_trace) {
  at::Tensor out = layer.forward(x);
  if (under_trace) {
    // Note [A warm-up under the trace's key]
    // Code that depends on the thread's dispatch keys runs otherwise under
    // the trace, whose key is on: torch.compile's guards include the keys,
    // so a compiled function compiles a variant of its own the first time
    // it runs traced, and that variant's first run takes paths later runs
    // do not (AOTAutograd's first call). An engine warms up every variant it
    // captures; the protocol warms this one up too, under a trace that
    // records nothing beyond the top-level calls and is dropped, so the
    // capture sees what every later forward runs. Only for a subject that
    // says its forward may be such code (SubjectInfo::warm_up_under_trace):
    // for any other it is a forward more, and nothing to see.
    trace::ReadTrace warm_up(trace::ReadTrace::Options{/*nested=*/false, /*hook=*/nullptr});
    layer.forward(x);
  }
  return out;
}

std::string raised_text(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  return valid_utf8(what.substr(0, what.find('\n')));
}

// Note [A check that tests nothing]
// Two different checkpoints must give two different outputs of the forward
// on the run's input, or no reload can show a stale read: a forward that
// does not read what the load writes passes every check. (A Python module
// instance whose closures hold its own tensors is the usual cause: every
// copy the check makes reads the instance's never-loaded tensors.) Asked
// once per run, of the cold load's output `out` and a cold load of reload
// 1's checkpoint, kept for reload 1's comparison (Note [One cold load per
// checkpoint]); a subject whose output may ignore its weights says so
// (SubjectInfo::constant_output_allowed).
void refuse_a_check_that_tests_nothing(ModeContext& mode, ColdLoadOutputs& cold_loads,
                                       const CheckpointDigest& first, const at::Tensor& out) {
  const RunOptions& options = mode.options();
  const SubjectInfo& info = mode.info();
  if (options.reloads < 1 || info.constant_output_allowed) return;
  const uint64_t seed = reload_seed(options.seed, 1);
  const std::string stage = "checkpoint seed " + std::to_string(seed);
  const Checkpoint second = in_stage("drawing reload 1's checkpoint (" + stage + ")",
                                     [&] { return mode.subject().draw_checkpoint(seed); });
  const CheckpointDigest digest(second);
  if (first.same_as(digest)) return;  // a same-weights reload is a check of its own
  const at::Tensor x = mode.input().clone();
  const at::Tensor other =
      in_stage("the forward of a cold load of reload 1's checkpoint (" + stage + ")", [&] {
        return cold_loads.forward(1, digest.whole(), x,
                                  [&] { return mode.cold_forward_aside(second, x, false); });
      });
  TORCH_CHECK(!same_bytes(out, other), "the forward gives the same output (shape ", out.sizes(),
              ") for two different checkpoints (checkpoint seeds ", options.seed, " and ", seed,
              "), so no reload can show a stale read: the forward does not read what the load "
              "writes. ",
              info.constant_output_hint.empty()
                  ? "For a layer whose output truly does not depend on its weights for this "
                    "input, say so (Backend::output_ignores_weights, "
                    "SubjectInfo::constant_output_allowed)"
                  : info.constant_output_hint);
}

// Note [Numbers that no load decides]
// A host number that two cold loads of the same checkpoint leave at other
// values (a timing, a count kept across layers, a count of forwards) is no
// function of the weights: neither a cold load nor the capture says what
// it should hold. Asked once per run, where a step compares numbers, of the
// live layer after its warm-up and a cold load of the same checkpoint
// without one; each such name joins SubjectInfo::free_names for the run.
void free_numbers_no_load_decides(ModeContext& mode, const Checkpoint& ckpt,
                                  std::vector<std::string>& free_names) {
  const std::vector<NamedNumber> live = checked_numbers(mode.live(), mode.info());
  const LayerState cold = mode.cold_state_aside(ckpt, 1, {});
  for (const NamedNumber& n : live) {
    const auto twin = std::find_if(cold.numbers.begin(), cold.numbers.end(),
                                   [&](const NamedNumber& c) { return c.name == n.name; });
    if (twin == cold.numbers.end()) continue;
    if (twin->value == n.value || (std::isnan(twin->value) && std::isnan(n.value))) continue;
    free_names.push_back(n.name);
  }
}

}  // namespace reloadsafe::harness
