// The compare_state step: after every reload, every tensor and host number
// the layer names holds what a cold load of the same checkpoint holds, by
// name (layer_state.h). A name that differs is "not idempotent" when
// loading that checkpoint twice into a fresh layer already changes it.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

class CompareStateStep : public Step {
 public:
  // What the reload left, before any forward runs on it: state a forward
  // writes is not the reload's.
  void after_reload(ModeContext& mode, const Reload& reload) override {
    const LayerState live = mode.live_state();
    std::vector<StateDifference> differences;  // none where the kept digest matched
    mode.compare_cold_state(
        reload, live, [&](const LayerState& cold) { differences = state_differences(live, cold); });
    if (differences.empty()) return;
    if (!not_idempotent_) {
      // Asked once per mode, of the first checkpoint that shows a
      // difference: a layer loaded twice against one loaded once.
      not_idempotent_.emplace();
      const LayerState once = mode.cold_state_aside(reload.checkpoint, 1, {});
      const LayerState twice = mode.cold_state_aside(reload.checkpoint, 2, {});
      for (const StateDifference& d : state_differences(twice, once)) {
        not_idempotent_->insert(d.name);
      }
    }
    for (const StateDifference& d : differences) {
      if (!mode.first_state_flag(d.name)) continue;
      const bool twice = not_idempotent_->count(d.name) > 0;
      mode.sink().add(reload.index, d.name,
                      twice ? "not idempotent: loading the same checkpoint twice gives another "
                              "value than loading it once"
                            : "differs from a cold load of the same checkpoint",
                      d.before, d.after);
    }
  }

 private:
  std::optional<std::set<std::string>> not_idempotent_;
};

}  // namespace

StepSpec compare_state_step() {
  return StepSpec{
      "compare_state",
      "--compare-state",
      StepTakes::kSwitch,
      /*max_level=*/0,
      StepKind::kCheck,
      "After every reload, every tensor and host number the layer names equals a cold load's of "
      "the same checkpoint, by name; one that does not is \"not idempotent\" when loading that "
      "checkpoint twice already changes it.",
      "`k_scale: not idempotent ...`, `kernel.w_scaled: differs from a cold load ...`",
      [](int64_t) -> std::unique_ptr<Step> { return std::make_unique<CompareStateStep>(); },
  };
}

}  // namespace reloadsafe::harness
