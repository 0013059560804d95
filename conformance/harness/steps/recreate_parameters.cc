// The recreate_parameters step: before every reload's load, every registered
// parameter's storage is filled with a sentinel, as the memory of a
// parameter that a layerwise reload re-creates holds garbage
// (reload_steps.h).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/reload_steps.h"
#include "conformance/harness/step.h"

#include <c10/util/Exception.h>

#include <memory>
#include <string>

namespace reloadsafe::harness {
namespace {

class RecreateParametersStep : public Step {
 public:
  void started(ModeContext& mode) override {
    TORCH_CHECK(!mode.live().parameters().empty(),
                "recreate_parameters: the subject names no registered parameters "
                "(SubjectLayer::parameters), so none can be re-created");
  }

  bool before_reload(ModeContext& mode, const Reload& /*reload*/) override {
    recreate_parameters(mode.live().parameters());
    return true;
  }

  std::string circumstance() const override { return "parameters re-created"; }
};

}  // namespace

StepSpec recreate_parameters_step() {
  return StepSpec{
      "recreate_parameters",
      "--recreate-parameters",
      StepTakes::kSwitch,
      /*max_level=*/0,
      StepKind::kEngine,
      "Before every reload's load, every registered parameter's storage is filled with NaN (-1 "
      "for integers), as a layerwise reload re-creates its parameters uninitialised.",
      "padding or elements the loader does not write read as NaN",
      [](int64_t) -> std::unique_ptr<Step> { return std::make_unique<RecreateParametersStep>(); },
  };
}

}  // namespace reloadsafe::harness
