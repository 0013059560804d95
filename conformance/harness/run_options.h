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

struct RunOptions {
  int reloads = kDefaultReloads;
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 1;
  /// Stop listing violations after this many per mode (all are counted).
  int max_listed = 20;
  /// Trace the forward (capture emulation, CPU replay). Off: only declared
  /// tensors, values and memory are checked.
  bool trace = true;
};

}  // namespace reloadsafe::harness
