// The load_per_tensor step: every reload loads its checkpoint one tensor per
// load call, in reverse name order, then post-processes once, as an RL
// trainer's weight sync pushes the weights in buckets (vLLM's load_weights
// called once per bucket) in whatever order it holds them. A loader that
// resets what an earlier call wrote (a fused buffer zeroed before each
// shard), or that depends on the order of the names, shows in the values.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step.h"

#include <memory>

namespace reloadsafe::harness {
namespace {

class LoadPerTensorStep : public Step {
 public:
  bool load(ModeContext& mode, const Reload& reload) override {
    const Checkpoint& ckpt = reload.checkpoint;
    for (auto it = ckpt.rbegin(); it != ckpt.rend(); ++it) mode.live().load({*it});
    return true;
  }

  std::string circumstance() const override { return "loaded one tensor per load call"; }
};

}  // namespace

StepSpec load_per_tensor_step() {
  return StepSpec{
      "load_per_tensor",
      "--load-per-tensor",
      StepTakes::kSwitch,
      /*max_level=*/0,
      StepKind::kEngine,
      "Every reload loads its checkpoint one tensor per load call, in reverse name order, then "
      "post-processes once, as a weight sync pushes weights in buckets.",
      "a fused weight whose loader resets it per call: `forward: differs from a cold load`",
      [](int64_t) -> std::unique_ptr<Step> { return std::make_unique<LoadPerTensorStep>(); },
  };
}

}  // namespace reloadsafe::harness
