// subject.h: what the reload protocol needs from a layer under test,
// whatever it is written in.
//
// A subject holds one live layer at a time and offers the protocol's steps as
// behaviour: draw a checkpoint, cold-load it, reload it, run the forward, run
// the forward of a cold load made aside, name the layer's tensors. What the
// subject is (its name, the modes it claims, whether it is a negative
// control) is data, in one SubjectInfo. A C++ Backend is a subject through
// BackendSubject (harness.h); a Python layer through the Python module's
// subject class (python/reloadsafe/layer_subject.py).
//
// Invariant: the protocol calls reload() only after cold_load(), and inside a
// DirectReloadScope for ReloadMode::kDirect (the protocol is the one place
// that enters it); a subject never enters one itself.
#pragma once

#include "conformance/harness/layer_state.h"
#include "conformance/harness/run_options.h"
#include "conformance/trace/named_tensor.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// A checkpoint: checkpoint parameter name -> tensor in checkpoint layout.
using Checkpoint = std::map<std::string, at::Tensor>;

/// The reload modes the harness runs: post-processing as after a first load
/// (kNormal), and inside a DirectReloadScope (kDirect, where a weight may use
/// all of its old storage).
enum class ReloadMode { kNormal, kDirect };

/// "normal" or "direct", as reports and the Python API name the modes.
inline const char* to_string(ReloadMode mode) {
  return mode == ReloadMode::kNormal ? "normal" : "direct";
}

using trace::NamedObject;
using trace::NamedTensor;

/// What a subject is, as reports and verdicts need it.
struct SubjectInfo {
  std::string name;
  std::string description;
  /// The modes in which the subject claims to keep every address.
  std::vector<ReloadMode> modes = {ReloadMode::kNormal, ReloadMode::kDirect};
  /// A negative control: a subject known to lose an address, which the
  /// protocol must flag.
  bool negative_control = false;
  /// For a negative control: the tensor name, or the start of the read
  /// ("aten::div"), that must be flagged.
  std::string expected_violation;
  /// Bytes live storages may grow by after the first reload.
  int64_t memory_tolerance_bytes = 0;
  /// Steps every run of this subject takes, merged with the run's own
  /// (RunOptions::steps): a subject whose bug only shows after a sleep asks
  /// for one.
  ReloadSteps steps;
  /// The forward may run code compiled for the thread's dispatch keys
  /// (torch.compile guards on them): the protocol warms it up under the
  /// trace's key too before the capture (Note [A warm-up under the trace's
  /// key] in protocol.cc). Off for C++ backends, whose code has no such
  /// variants; the Python subject sets it where torch.compile can run.
  bool warm_up_under_trace = false;
};

class ReloadSubject {
 public:
  virtual ~ReloadSubject() = default;

  /// What the subject is; asked once per run.
  virtual SubjectInfo info() const = 0;

  /// The checkpoint of `seed`: the same names and layouts for every seed,
  /// different values (on the CPU, where an mmap'd checkpoint lives).
  virtual Checkpoint draw_checkpoint(uint64_t seed) = 0;

  /// The forward's input of `seed`.
  virtual at::Tensor draw_input(uint64_t seed) = 0;

  /// Creates the live layer, loads `ckpt` through its loaders and
  /// post-processes it.
  virtual void cold_load(const Checkpoint& ckpt) = 0;

  /// Loads `ckpt` into the live layer through the same loaders and
  /// post-processes again (see the invariant at the top of this file).
  virtual void reload(ReloadMode mode, const Checkpoint& ckpt) = 0;

  /// The live layer's forward.
  virtual at::Tensor forward(const at::Tensor& x) = 0;

  /// The forward on `x` of a cold load of `ckpt` into a second layer: what a
  /// reload of `ckpt` must reproduce.
  virtual at::Tensor cold_forward(const Checkpoint& ckpt, const at::Tensor& x) = 0;

  /// Every tensor of the live layer the subject can name.
  virtual std::vector<NamedTensor> named_tensors() = 0;

  /// Every opaque object of the live layer the subject can name.
  virtual std::vector<NamedObject> named_objects() { return {}; }

  // What the steps of ReloadSteps need (run_options.h). A subject that
  // cannot answer one keeps the default: a run whose step needs a cold
  // state or parameters and gets none is refused with the step's name; the
  // other defaults say there is nothing of the kind (no buffers, caches or
  // host numbers).

  /// The subject's own sleep and wake (an engine's, with whatever it keeps
  /// on the host while asleep), if it has one: does it on the live layer
  /// and returns true. False, the default, has the protocol emulate sleep
  /// at `level` (reload_steps.h).
  virtual bool sleep_and_wake(int /*level*/) { return false; }

  /// The live layer's registered parameters (a tensor subclass as the
  /// tensors that hold its bytes): what a layerwise reload re-creates and
  /// every sleep at level 1 restores.
  virtual std::vector<at::Tensor> parameters() { return {}; }

  /// The live layer's registered buffers, as parameters(): what every wake
  /// restores.
  virtual std::vector<at::Tensor> buffers() { return {}; }

  /// Tensors of caches kept outside the layer (a module-level dict) that
  /// post-processing reads, when the author names them: slept with the
  /// layer and compared by name; not held to their addresses.
  virtual std::vector<NamedTensor> cache_tensors() { return {}; }

  /// Every host number (int, float) the live layer reaches, by name; names
  /// the author marked as free to change are left out.
  virtual std::vector<NamedNumber> named_numbers() { return {}; }

  /// Whether the subject answers cold_state.
  virtual bool has_cold_state() const { return false; }

  /// A cold load of `ckpt` made aside, in a second layer that loads and
  /// post-processes it `loads` times (1, or 2 to tell a non-idempotent
  /// post-processing) and then, when `forward_input` is defined, runs its
  /// forward on it once; as what it holds: its tensors (its caches'
  /// included) and host numbers, by the names the live layer's have. Names
  /// the subject does not want compared are left out.
  virtual LayerState cold_state(const Checkpoint& /*ckpt*/, int /*loads*/,
                                const at::Tensor& /*forward_input*/) {
    return {};
  }

  /// Drops the live layer (between modes).
  virtual void release() {}
};

}  // namespace reloadsafe::harness
