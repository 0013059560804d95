#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/mode_memory.h"

#include <string>

namespace reloadsafe::harness {

ModeMemory::ModeMemory(const RunOptions& options, const SubjectInfo& info,
                       const ColdLoadOutputs& cold_loads, ModeReport& report)
    : options_(options), info_(info), cold_loads_(cold_loads), report_(report) {
  // The census counts live CPU bytes while the mode runs; storages a reload
  // frees are poisoned and held (Note [Poison quarantine]).
  if (options.device.is_cpu()) {
    census_.emplace();
    quarantine_.emplace();
  }
}

void ModeMemory::start() {
  kept_before_ = cold_loads_.kept_bytes();
  record();
}

int64_t ModeMemory::live_bytes() const {
  return trace::live_tensor_bytes(options_.device).value_or(0);
}

int64_t ModeMemory::aside_live_bytes() const {
  if (aside_epochs_.empty()) return 0;
  return trace::live_cpu_bytes_allocated_in(aside_epochs_, cold_loads_.kept_data()).value_or(0);
}

void ModeMemory::record(int64_t checks_own) {
  if (auto bytes = trace::live_tensor_bytes(options_.device)) {
    const int64_t made_aside = aside_live_bytes();
    aside_bytes_.push_back(made_aside);
    report_.memory_bytes.push_back(*bytes - (cold_loads_.kept_bytes() - kept_before_) - made_aside -
                                   checks_own);
  }
}

// Growth after the first reload: the cold load and the first reload may
// legitimately allocate (a storage released by the first post-processing is
// re-made by the first load).
void ModeMemory::check(ViolationSink& sink) {
  const std::vector<int64_t>& bytes = report_.memory_bytes;
  if (bytes.size() < 3) return;
  const std::string reloads = std::to_string(options_.reloads);
  const std::string over = std::to_string(options_.reloads - 1) + " reloads";
  const int64_t kept = aside_bytes_.back() - aside_bytes_[1];
  if (kept > info_.memory_tolerance_bytes) {
    report_.warnings.push_back(Warning{
        "memory", "",
        "layers built aside (the check's cold loads) keep " + std::to_string(kept) +
            " bytes alive over " + over + " (" + std::to_string(aside_bytes_[1]) +
            " B after reload 1 -> " + std::to_string(aside_bytes_.back()) + " B after reload " +
            reloads +
            ") after the check let go of them: the layer factory or a library keeps each layer "
            "it builds (a registry, a cache keyed by layer). Not counted as the reloads' growth; "
            "an engine that builds one layer does not grow with it"});
  }
  const int64_t first = bytes[1];
  const int64_t last = bytes.back();
  if (last - first <= info_.memory_tolerance_bytes) return;
  sink.add(options_.reloads, "memory",
           "grew by " + std::to_string(last - first) + " bytes over " + over,
           std::to_string(first) + " B after reload 1",
           std::to_string(last) + " B after reload " + reloads);
}

}  // namespace reloadsafe::harness
