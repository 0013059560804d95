// run_options.h: what one protocol run is asked to do (RunOptions), and the
// rule that turns its seed into the seed of every checkpoint and input it
// draws.
//
// Invariant: the protocol draws nothing but through the seeds below, for a
// C++ subject and a Python one alike: the cold load's checkpoint from
// RunOptions::seed, the input from input_seed(seed) (once per run), reload
// r's checkpoint from reload_seed(seed, r), in both modes. A test that hands
// the protocol its own checkpoints (a make_checkpoint that tells reloads
// apart) computes their seeds with these functions, never with the numbers
// they use, so the rule has one place to change. The Python module exposes
// reload_seed and kDefaultReloads (reloadsafe._C), and check_reload takes its
// default from it.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace reloadsafe::harness {

/// Reloads per mode when a run is not told how many: RunOptions, the
/// harness binaries' --reloads, reload_harness_test (defs.bzl) and the
/// Python check_reload's `reloads`.
constexpr int kDefaultReloads = 10;

/// The seed of the input a run draws (once, for every mode).
constexpr uint64_t input_seed(uint64_t seed) {
  return seed + 7919;
}

/// The seed of reload `r`'s checkpoint (r >= 1) in a run of `seed`; the cold
/// load's is `seed` itself. Seeds of one run are far apart, so runs whose
/// seeds differ by a few draw different checkpoints at every reload.
constexpr uint64_t reload_seed(uint64_t seed, int r) {
  return seed + 1000003 * static_cast<uint64_t>(r);
}

/// The harness steps a run takes around each reload, by name: what an engine
/// does between reloads (a sleep and wake, re-created parameters), and what
/// is checked beyond addresses and values (host numbers, state against a cold
/// load, memory bounds). Every step is off until set. The steps there are,
/// what each takes and does, are the step table's (step_table.h), the one
/// place a step is written; this is only the run's choice of them, so that
/// a run's options need nothing but this header. A run takes the steps its
/// options ask for and those its subject asks for (SubjectInfo::steps),
/// merged (merge_steps in step_table.h). A name or value the table refuses is
/// refused before anything runs (check_steps).
class ReloadSteps {
 public:
  /// Takes step `name` with `value`: 1 for a switch ("compare_state"), the
  /// level for a level ("sleep"), the bytes for a bound
  /// ("reload_peak_budget_bytes").
  ReloadSteps& set(const std::string& name, int64_t value = 1) {
    values_[name] = value;
    return *this;
  }
  /// The value step `name` is taken with; empty when it is not taken.
  std::optional<int64_t> get(const std::string& name) const {
    const auto it = values_.find(name);
    return it == values_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  /// Whether step `name` is taken.
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  /// Whether any step is taken.
  bool any() const { return !values_.empty(); }
  /// Every step taken, by name.
  const std::map<std::string, int64_t>& values() const { return values_; }

  bool operator==(const ReloadSteps& other) const { return values_ == other.values_; }

 private:
  std::map<std::string, int64_t> values_;
};

struct RunOptions {
  int reloads = kDefaultReloads;
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 1;
  /// Stop listing violations after this many per mode (all are counted).
  int max_listed = 20;
  /// Trace the forward (capture emulation, CPU replay). Off: only declared
  /// tensors, values and memory are checked.
  bool trace = true;
  /// The steps around each reload (off by default).
  ReloadSteps steps;
};

}  // namespace reloadsafe::harness
