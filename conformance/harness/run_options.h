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
#include <optional>

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

/// The harness steps around each reload, each off by default: what an engine
/// does between reloads (sleep and wake), how it reloads (re-created
/// parameters), and what is checked beyond addresses and values (host
/// numbers, state against a cold load, memory over a whole reload). A run
/// takes the steps its options ask for and those its subject asks for
/// (SubjectInfo::steps), merged by merged_with().
/// The deepest sleep level (ReloadSteps::sleep_level): levels run from 1 to
/// this; 0 is no sleep. The one place the range is written (the flag, the
/// protocol's check and Python's `sleep=` read it).
constexpr int kMaxSleepLevel = 2;

struct ReloadSteps {
  /// 0: no sleep. 1 or 2: before every reload the layer sleeps and wakes,
  /// as an engine's sleep mode does between RL steps (reload_steps.h):
  /// the contents of every storage the subject names are discarded, then
  /// wake restores from a host copy its registered buffers (level 2), or
  /// everything its cold load made (level 1: parameters, buffers and every
  /// other storage it reached before its first forward).
  int sleep_level = 0;
  /// Before every reload's load, every registered parameter's storage is
  /// filled with a sentinel (NaN; -1 for integers), as the memory of a
  /// parameter re-created by a layerwise reload holds garbage.
  bool recreate_parameters = false;
  /// Every host number the subject names keeps the value it had when the
  /// forward was captured (a graph bakes it into a launch).
  bool host_numbers = false;
  /// After every reload, every tensor and host number the subject names
  /// equals a cold load's of the same checkpoint, by name; one that does
  /// not is named "not idempotent" when loading that checkpoint twice
  /// already changes it (layer_state.h).
  bool compare_state = false;
  /// After every reload's forward, every tensor and host number the subject
  /// names equals a cold load's of the same checkpoint after one forward on
  /// the same input: state the first forward makes (a tile schedule, a
  /// workspace) that a sleep or a reload left wrong. For layers whose
  /// forward state does not depend on how many forwards ran.
  bool compare_forward_state = false;
  /// Live bytes after a reload may exceed the cold load's by at most this
  /// (an extra copy kept from the first reload on).
  std::optional<int64_t> cold_footprint_tolerance_bytes;
  /// While a reload loads and post-processes, live bytes may rise at most
  /// this far above what was live just before it.
  std::optional<int64_t> reload_peak_budget_bytes;

  /// Whether any step is asked for.
  bool any() const {
    return sleep_level > 0 || recreate_parameters || host_numbers || compare_state ||
           compare_forward_state || cold_footprint_tolerance_bytes.has_value() ||
           reload_peak_budget_bytes.has_value();
  }

  /// Every step either asks for: the higher sleep level, each check asked
  /// by either, the tighter of two bounds.
  ReloadSteps merged_with(const ReloadSteps& other) const {
    ReloadSteps out = *this;
    out.sleep_level = sleep_level > other.sleep_level ? sleep_level : other.sleep_level;
    out.recreate_parameters = recreate_parameters || other.recreate_parameters;
    out.host_numbers = host_numbers || other.host_numbers;
    out.compare_state = compare_state || other.compare_state;
    out.compare_forward_state = compare_forward_state || other.compare_forward_state;
    out.cold_footprint_tolerance_bytes =
        tighter(cold_footprint_tolerance_bytes, other.cold_footprint_tolerance_bytes);
    out.reload_peak_budget_bytes =
        tighter(reload_peak_budget_bytes, other.reload_peak_budget_bytes);
    return out;
  }

 private:
  static std::optional<int64_t> tighter(std::optional<int64_t> a, std::optional<int64_t> b) {
    if (!a) return b;
    if (!b) return a;
    return *a < *b ? a : b;
  }
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
