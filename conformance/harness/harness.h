// harness.h: the reload protocol, run against a Backend.
//
// What a captured CUDA graph needs from a reload: every tensor the forward
// reads (kernel parameters under their runtime names, and derived tensors)
// is at the address, on the storage and in the layout it had when the graph
// was captured, and holds the new weights. The harness checks exactly that:
//
//   1. cold load: create the layer, load a random checkpoint through each
//      parameter's weight_loader, post-process; record every kernel-visible
//      tensor (name, data pointer, storage, byte size, layout);
//   2. reload many times, in the normal or the direct-reload mode (the
//      latter inside a DirectReloadScope): load another random checkpoint
//      through the same loaders, post-process again;
//   3. after each reload: every recorded tensor kept its name, address,
//      storage, storage size and layout; no tensor appeared or vanished; the
//      checkpoint tensors, the input and a canary tensor the harness owns are
//      byte-for-byte unchanged; and the forward on a fixed input equals the
//      forward of a fresh cold load of the same checkpoint.
//
// Every difference is a Violation naming the tensor, with before and after.
#pragma once

#include "conformance/harness/backend.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// One broken promise after one reload.
struct Violation {
  int reload = 0;  // 1-based reload number
  std::string
      tensor;  // runtime name, derived name, "checkpoint:<name>", "input", "canary", "forward"
  std::string what;  // "address", "storage", "storage size", "layout", "missing", ...
  std::string before;
  std::string after;
};

struct RunOptions {
  int reloads = 20;
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 1;
  /// Stop listing violations after this many per mode (they are still counted).
  int max_listed = 20;
};

struct ModeReport {
  ReloadMode mode = ReloadMode::kNormal;
  bool expected_to_pass = true;  // the backend declares this mode
  int reloads_done = 0;
  int64_t violation_count = 0;
  std::vector<Violation> violations;
  std::string error;  // an exception from the backend or the protocol
  bool clean() const { return error.empty() && violation_count == 0; }
};

struct BackendReport {
  std::string name;
  std::string description;
  bool negative_control = false;
  std::string expected_violation;
  std::vector<ModeReport> modes;

  /// A sample backend passes when every mode it declares is clean; a
  /// negative control passes (is detected) when some mode flags the tensor it
  /// names.
  bool ok() const;
};

/// One layer taken through the reload protocol step by step; run_backend
/// drives it, and so do the CUDA-graph tests, between capture and replays.
class ReloadSession {
 public:
  /// The cold load: creates the layer on `device`, loads a random checkpoint
  /// (drawn from `seed`) through each parameter's weight_loader, and
  /// post-processes it.
  ReloadSession(const Backend& backend, const c10::Device& device, uint64_t seed);

  Layer& layer() { return *layer_; }

  /// A random checkpoint for this layer, drawn from `seed`, on the CPU (where
  /// an mmap'd checkpoint lives).
  Checkpoint random_checkpoint(uint64_t seed) const;

  /// A reload: `ckpt` through the same loaders, then post-processing, inside
  /// a DirectReloadScope in the direct mode.
  void reload(ReloadMode mode, const Checkpoint& ckpt);

  /// Every tensor the forward reads: live parameters under their runtime
  /// names, then the backend's derived tensors.
  std::vector<std::pair<std::string, at::Tensor>> kernel_visible() const;

  /// The forward on `x` of a fresh cold load of `ckpt` on the same device:
  /// what a reload of `ckpt` must reproduce.
  at::Tensor cold_forward(const Checkpoint& ckpt, const at::Tensor& x) const;

 private:
  const Backend& backend_;
  c10::Device device_;
  Checkpoint layouts_;
  std::shared_ptr<Layer> layer_;
};

/// Runs the protocol for `backend` in both modes.
BackendReport run_backend(const Backend& backend, const RunOptions& options);

/// The reports as JSON (for machines).
std::string to_json(const std::vector<BackendReport>& reports, const RunOptions& options);

/// The reports as a table with a verdict per backend (for people).
std::string to_table(const std::vector<BackendReport>& reports);

}  // namespace reloadsafe::harness
