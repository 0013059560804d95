// The host_numbers step: every host number the layer names keeps the value
// it had when the forward was captured, since a captured graph bakes the
// value of a number handed to a kernel into its launch.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/layer_life.h"
#include "conformance/harness/step.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

class HostNumbersStep : public Step {
 public:
  void started(ModeContext& mode) override {
    captured_ = checked_numbers(mode.live(), mode.info());
  }

  // Each name is flagged at the first reload that changes it.
  void after_reload(ModeContext& mode, const Reload& reload) override {
    for (const NamedNumber& n : checked_numbers(mode.live(), mode.info())) {
      const auto old = std::find_if(captured_.begin(), captured_.end(),
                                    [&](const NamedNumber& c) { return c.name == n.name; });
      if (old == captured_.end() || flagged_.count(n.name) > 0) continue;
      if (old->value == n.value || (std::isnan(old->value) && std::isnan(n.value))) continue;
      flagged_.insert(n.name);
      mode.sink().add(reload.index, n.name,
                      "host number changed since the capture (a captured graph keeps the old "
                      "value)",
                      format_number(*old), format_number(n));
    }
  }

 private:
  std::vector<NamedNumber> captured_;
  std::set<std::string> flagged_;
};

}  // namespace

StepSpec host_numbers_step() {
  return StepSpec{
      "host_numbers",
      "--host-numbers",
      StepTakes::kSwitch,
      /*max_level=*/0,
      StepKind::kCheck,
      "After every reload, every host number the layer names keeps the value it had when the "
      "forward was captured (a graph bakes it into a launch).",
      "`_k_scale_float: host number changed since the capture`",
      [](int64_t) -> std::unique_ptr<Step> { return std::make_unique<HostNumbersStep>(); },
  };
}

}  // namespace reloadsafe::harness
