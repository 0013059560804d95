// The sleep step: before every reload the live layer sleeps and wakes, as
// an engine's sleep mode does between RL steps (reload_steps.h says what
// each level discards and restores). A layer with its own sleep and wake
// (SubjectLayer::sleep_and_wake) sleeps its own way.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/reload_steps.h"
#include "conformance/harness/step.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

class SleepStep : public Step {
 public:
  explicit SleepStep(int level) : level_(level) {}

  // Level 1 keeps on the host all the load made: the storages the layer
  // reaches right after its cold load, held weakly (one the layer lets go
  // of is not kept alive).
  void cold_loaded(ModeContext& mode) override {
    if (level_ != 1) return;
    for (const NamedTensor& n : mode.live().named_tensors()) {
      if (n.tensor.defined() && n.tensor.has_storage()) {
        loaded_.emplace_back(n.tensor.storage().getWeakStorageImpl());
      }
    }
  }

  bool before_reload(ModeContext& mode, const Reload& reload) override {
    SubjectLayer& live = mode.live();
    bool own_sleep = false;
    if (!mode.layer_step_runs(reload.index, "the subject's sleep and wake before it",
                              [&] { own_sleep = live.sleep_and_wake(level_); })) {
      return false;
    }
    if (own_sleep) return true;
    std::vector<NamedTensor> reached = live.named_tensors();
    std::vector<NamedTensor> caches = mode.subject().cache_tensors();
    reached.insert(reached.end(), caches.begin(), caches.end());
    std::vector<at::Tensor> restored = live.buffers();
    if (level_ == 1) {
      // All the load made comes back: parameters, buffers and any other
      // storage the layer reached right after its cold load (a quant state,
      // a kernel object's table); what a forward made since does not.
      std::set<const c10::StorageImpl*> loaded;
      for (const auto& weak : loaded_) {
        if (auto storage = weak.lock()) loaded.insert(storage.get());
      }
      for (const NamedTensor& n : reached) {
        if (n.tensor.defined() && n.tensor.has_storage() &&
            loaded.count(n.tensor.storage().unsafeGetStorageImpl()) > 0) {
          restored.push_back(n.tensor);
        }
      }
      std::vector<at::Tensor> params = live.parameters();
      restored.insert(restored.end(), params.begin(), params.end());
    }
    sleep_and_wake(reached, restored);
    return true;
  }

  std::string circumstance() const override {
    return "after a level-" + std::to_string(level_) + " sleep";
  }

 private:
  const int level_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> loaded_;
};

}  // namespace

StepSpec sleep_step() {
  return StepSpec{
      "sleep",
      "--sleep",
      StepTakes::kLevel,
      /*max_level=*/2,
      StepKind::kEngine,
      "Before every reload the layer sleeps and wakes, as an engine's sleep mode does between RL "
      "steps: every storage it reaches is discarded, then wake restores the registered buffers "
      "(level 2) or all the cold load made (level 1) from a host copy.",
      "garbage read, through the value checks; named with `compare_state`",
      [](int64_t level) -> std::unique_ptr<Step> {
        return std::make_unique<SleepStep>(static_cast<int>(level));
      },
  };
}

}  // namespace reloadsafe::harness
