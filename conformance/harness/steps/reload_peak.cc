// The reload_peak_budget_bytes step: while a reload loads and
// post-processes, the live bytes rise at most the budget above what was
// live just before it (a second copy of the weights staged before the first
// is freed is flagged).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step.h"
#include "conformance/trace/memory_census.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace reloadsafe::harness {
namespace {

class ReloadPeakStep : public Step {
 public:
  explicit ReloadPeakStep(int64_t budget) : budget_(budget) {}

  void before_load(ModeContext& mode, const Reload& /*reload*/) override {
    before_ = trace::live_tensor_bytes(mode.options().device).value_or(0);
    trace::take_peak_tensor_bytes(mode.options().device);  // the peak from here on
  }

  // Flagged at the first reload over, once per mode.
  void after_load(ModeContext& mode, const Reload& reload) override {
    const std::optional<int64_t> peak = trace::take_peak_tensor_bytes(mode.options().device);
    if (!peak || over_) return;
    const int64_t extra = *peak - before_;
    if (extra <= budget_) return;
    over_ = true;
    mode.sink().add(
        reload.index, "memory",
        "peak during reload " + std::to_string(reload.index) + " is " + std::to_string(extra) +
            " bytes above the bytes live before it, over the budget of " + std::to_string(budget_),
        std::to_string(before_) + " B before the reload", std::to_string(*peak) + " B at its peak");
  }

 private:
  const int64_t budget_;
  int64_t before_ = 0;
  bool over_ = false;
};

}  // namespace

StepSpec reload_peak_step() {
  return StepSpec{
      "reload_peak_budget_bytes",
      "--reload-peak-budget",
      StepTakes::kBytes,
      /*max_level=*/0,
      StepKind::kBound,
      "While a reload loads and post-processes, the live bytes rise at most this many above "
      "what was live just before it.",
      "`memory: peak during reload 1 is ... over the budget of N`",
      [](int64_t budget) -> std::unique_ptr<Step> {
        return std::make_unique<ReloadPeakStep>(budget);
      },
  };
}

}  // namespace reloadsafe::harness
