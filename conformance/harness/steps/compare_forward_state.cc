// The compare_forward_state step: right after every reload's forward, every
// tensor and host number the layer names equals a cold load's of the same
// checkpoint after one forward on the same input: state the first forward
// makes (a tile schedule, a workspace) that a sleep or a reload left wrong.
// For layers whose forward state does not depend on how many forwards ran.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step.h"

#include <memory>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

class CompareForwardStateStep : public Step {
 public:
  // Before the capture's replay runs its ops on the live tensors; each name
  // flagged once, as compare_state's are.
  void after_forward(ModeContext& mode, const Reload& reload) override {
    const LayerState live = mode.live_state();
    const at::Tensor x = mode.input().clone();  // the aside forward may write its input
    const LayerState cold = mode.cold_state_aside(reload.checkpoint, 1, x);
    for (const StateDifference& d : state_differences(live, cold)) {
      if (!mode.first_state_flag(d.name)) continue;
      mode.sink().add(reload.index, d.name,
                      "after the forward, differs from a cold load of the same checkpoint after "
                      "one forward",
                      d.before, d.after);
    }
  }
};

}  // namespace

StepSpec compare_forward_state_step() {
  return StepSpec{
      "compare_forward_state",
      "--compare-forward-state",
      StepTakes::kSwitch,
      /*max_level=*/0,
      StepKind::kCheck,
      "Right after every reload's forward, every tensor and host number the layer names equals a "
      "cold load's of the same checkpoint after one forward on the same input: state the first "
      "forward makes, left wrong by a sleep or a reload.",
      "`kernel.meta: after the forward, differs ...`",
      [](int64_t) -> std::unique_ptr<Step> { return std::make_unique<CompareForwardStateStep>(); },
  };
}

}  // namespace reloadsafe::harness
