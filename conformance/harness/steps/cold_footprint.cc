// The cold_footprint_tolerance_bytes step: the live bytes after a reload
// (its checkpoint's own not counted) exceed the cold load's by at most the
// tolerance: an extra copy kept from the first reload on is flagged.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

class ColdFootprintStep : public Step {
 public:
  explicit ColdFootprintStep(int64_t tolerance) : tolerance_(tolerance) {}

  // Flagged at the first reload over, once per mode.
  void after_reload(ModeContext& mode, const Reload& reload) override {
    const std::vector<int64_t>& bytes = mode.memory_bytes();
    if (bytes.size() < 2 || over_) return;
    const int64_t size = bytes.back() - reload.checkpoint_bytes;
    const int64_t over = size - bytes.front();
    if (over <= tolerance_) return;
    over_ = true;
    const std::string r = std::to_string(reload.index);
    mode.sink().add(reload.index, "memory",
                    "footprint after reload " + r + " exceeds the cold load's by " +
                        std::to_string(over) + " bytes",
                    std::to_string(bytes.front()) + " B after the cold load",
                    std::to_string(size) + " B after reload " + r);
  }

 private:
  const int64_t tolerance_;
  bool over_ = false;
};

}  // namespace

StepSpec cold_footprint_step() {
  return StepSpec{
      "cold_footprint_tolerance_bytes",
      "--cold-footprint-tolerance",
      StepTakes::kBytes,
      /*max_level=*/0,
      StepKind::kBound,
      "The live bytes after a reload exceed the cold load's by at most this many (an extra copy "
      "kept from the first reload on is flagged).",
      "`memory: footprint after reload 1 exceeds ...`",
      [](int64_t tolerance) -> std::unique_ptr<Step> {
        return std::make_unique<ColdFootprintStep>(tolerance);
      },
  };
}

}  // namespace reloadsafe::harness
