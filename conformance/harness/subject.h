// subject.h: what the reload protocol needs from a layer under test,
// whatever it is written in.
//
// A subject is a layer factory. It knows what only it can know: what it is
// (SubjectInfo, data), how to draw a checkpoint and an input, how to build a
// new layer (new_layer, and copy_of_new_layer where copying one is
// cheaper), and the module caches its layers share. A layer it
// builds (SubjectLayer) loads a checkpoint, post-processes, runs its
// forward and names what it holds. Everything else is the protocol's
// (protocol.h, layer_life.h): which layers are built and when, the loads
// made aside, the module caches around each mode, what a layer's state is.
// A C++ Backend is a subject through BackendSubject (harness.h); a Python
// layer through reloadsafe's LayerSubject (python/reloadsafe/layer_subject.py).
//
// Invariant: the protocol loads a layer again only after its first load and
// post-processing, and inside a DirectReloadScope for ReloadMode::kDirect
// (the protocol is the one place that enters it); neither a subject nor its
// layers ever enter one themselves.
#pragma once

#include "conformance/harness/layer_state.h"
#include "conformance/harness/run_options.h"
#include "conformance/trace/named_tensor.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
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
  /// Names whose values the subject says may change freely (a workspace, a
  /// counter; Python's `undeclared`): left out of every comparison of
  /// values (layer states, host numbers). A run adds the host numbers that
  /// no load decides (Note [Numbers that no load decides] in protocol.cc).
  std::vector<std::string> free_names;
  /// The forward's output may ignore the weights for the drawn input: the
  /// protocol then does not refuse a forward that gives one output for two
  /// different checkpoints (Note [A check that tests nothing]).
  bool constant_output_allowed = false;
  /// What usually makes a forward ignore what the load wrote, in the
  /// subject's language, and how to allow it where it is meant (for the
  /// refusal's message); empty: the C++ advice.
  std::string constant_output_hint;
};

/// One layer a subject built: load, post-process, forward, and what it holds
/// by name. Which layer is built when, and what is compared with what, is
/// the protocol's.
class SubjectLayer {
 public:
  virtual ~SubjectLayer() = default;

  /// Loads `ckpt` through the layer's loaders (no post-processing).
  virtual void load(const Checkpoint& ckpt) = 0;

  /// Post-processes what the last load() wrote, as an engine's loader does
  /// after every load.
  virtual void process() = 0;

  /// The layer's forward.
  virtual at::Tensor forward(const at::Tensor& x) = 0;

  /// Every tensor of the layer the subject can name; `declared` for those a
  /// kernel is promised to find where the capture saw them.
  virtual std::vector<NamedTensor> named_tensors() = 0;

  /// Every opaque object of the layer the subject can name.
  virtual std::vector<NamedObject> named_objects() { return {}; }

  /// Every host number (int, float) the layer reaches, by name.
  virtual std::vector<NamedNumber> named_numbers() { return {}; }

  /// The registered parameters (a tensor subclass as the tensors that hold
  /// its bytes): what a layerwise reload re-creates and every sleep at level
  /// 1 restores. Empty where the subject cannot name them.
  virtual std::vector<at::Tensor> parameters() { return {}; }

  /// The registered buffers, as parameters(): what every wake restores.
  virtual std::vector<at::Tensor> buffers() { return {}; }

  /// The layer's own sleep and wake (an engine's, with whatever it keeps on
  /// the host while asleep), if it has one: does it and returns true. False,
  /// the default, has the protocol emulate sleep at `level`
  /// (reload_steps.h).
  virtual bool sleep_and_wake(int /*level*/) { return false; }
};

class ReloadSubject {
 public:
  virtual ~ReloadSubject() = default;

  /// What the subject is; asked once per run.
  virtual SubjectInfo info() const = 0;

  /// The checkpoint of `seed`: the same names and layouts for every seed,
  /// different values (on the CPU, where an mmap'd checkpoint lives).
  /// Subjects that draw from layouts use CheckpointPools
  /// (checkpoint_pools.h), the one generator of both languages.
  virtual Checkpoint draw_checkpoint(uint64_t seed) = 0;

  /// The forward's input of `seed`.
  virtual at::Tensor draw_input(uint64_t seed) = 0;

  /// A new layer on the run's device, built and not loaded.
  virtual std::shared_ptr<SubjectLayer> new_layer() = 0;

  /// A layer as new_layer() builds it, made more cheaply by copying one
  /// (a copy of a layer as built, with new memory for what every load
  /// writes), or null (the default) where the subject has no cheaper way.
  /// Where `on` is given, each parameter `on` holds under the parameter's
  /// name in its very layout (dtype, sizes, strides, device) is that tensor
  /// (Note [A copy on its checkpoint] in layer_life.h). The protocol makes
  /// such copies only once a copy has proven to load as a built layer does
  /// (Note [Layers made aside by copying]).
  virtual std::shared_ptr<SubjectLayer> copy_of_new_layer(const Checkpoint* /*on*/) {
    return nullptr;
  }

  // The module caches: state kept outside the layers (a module-level dict)
  // that post-processing fills and every layer of the subject shares. The
  // protocol empties them for each mode and for each layer it builds aside
  // (CachesEmptied, layer_life.h). A subject without any keeps the defaults.

  /// The tensors the caches hold now, by name; slept with the live layer
  /// and compared by name, not held to their addresses.
  virtual std::vector<NamedTensor> cache_tensors() { return {}; }

  /// Empties the caches, keeping what they held for restore_caches(); calls
  /// nest.
  virtual void empty_caches() {}

  /// Puts back what the matching empty_caches() kept.
  virtual void restore_caches() {}
};

}  // namespace reloadsafe::harness
