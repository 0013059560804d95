// backend.h: how a backend author describes a backend to the reload harness,
// and the registry the harness finds backends in.
//
// A backend is three things the harness cannot guess: how a layer's weights
// are created in checkpoint layout (with their weight loaders), what
// post-processing does after loading (through the reloadsafe utilities), and
// the forward that kernels (and captured CUDA graphs) run. The harness loads,
// post-processes and reloads through exactly these, and checks that every
// tensor the forward reads keeps its address (see harness.h).
//
// Registering a backend is one line in its source file:
//   RELOADSAFE_REGISTER_BACKEND(MyBackend);
// and its target must be linked with alwayslink = True (see BUILD.bazel).
#pragma once

#include "conformance/harness/module_cache.h"
#include "conformance/harness/subject.h"
#include "utils/layer.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace reloadsafe::harness {

class Backend {
 public:
  virtual ~Backend() = default;

  /// A short unique name (used on the command line and in reports).
  virtual std::string name() const = 0;

  /// What the backend mirrors, in one line, for reports.
  virtual std::string description() const = 0;

  /// A layer with every checkpoint parameter registered in checkpoint layout
  /// on `device`, each with its `weight_loader` (use make_checkpoint_param()
  /// for the default loader).
  virtual std::shared_ptr<Layer> create_layer(const c10::Device& device) const = 0;

  /// Post-processing after (re)loading: turns checkpoint-layout parameters
  /// into what the forward reads, through the reloadsafe utilities.
  virtual void process_weights_after_loading(Layer& layer) const = 0;

  /// The forward that kernels run. The harness traces it (read_trace.h):
  /// every tensor it hands to an op is checked, declared or not.
  virtual at::Tensor forward(const Layer& layer, const at::Tensor& x) const = 0;

  /// The forward's input: a fixed shape; the harness fills it.
  virtual std::vector<int64_t> input_shape() const = 0;

  /// Plain attributes of the layer that the forward reads (derived tensors).
  virtual std::vector<std::string> derived_names() const { return {}; }

  /// Tensors the forward's kernels read that the layer's tables do not hold
  /// (a C++ kernel object's, a TorchBind instance's, a struct's behind a
  /// pointer), under the names the engine gives them ("kernel.w1_scale").
  /// C++ has no walker to find them, as the Python check's walker does, so
  /// the backend lists them, as they are now. `declared`: the backend
  /// promises their addresses, as for derived_names(); an undeclared one
  /// only gives its reads a name. A registered submodule's buffer the
  /// forward reads ("drafter.cos_sin_cache") is declared here too, since
  /// derived_names() takes the layer's own attributes only.
  virtual std::vector<NamedTensor> held_tensors(const Layer& /*layer*/) const { return {}; }

  /// TorchBind objects the forward hands to ops, by name ("kernel"). One
  /// handed from C++ (an intrusive_ptr) is named by its instance: identity
  /// is the instance as a `torch::CustomClassHolder*`. Name the tensors it
  /// holds in held_tensors() as well.
  virtual std::vector<NamedObject> held_objects(const Layer& /*layer*/) const { return {}; }

  /// Host numbers (int, float) the forward reads from the layer or from a
  /// kernel object, by the names the engine gives them ("_k_scale_float"):
  /// the host_numbers and compare_state steps check them (step_table.h).
  /// C++ has no walker to find them, so the backend lists them.
  virtual std::vector<NamedNumber> host_numbers(const Layer& /*layer*/) const { return {}; }

  /// Module-level caches post-processing reads (module_cache.h), which the
  /// author opts in to have walked like the layer's own tensors: slept with
  /// it, compared under compare_state, emptied for every cold load made
  /// aside. The caches are the backend's (statics of its file), not owned
  /// here.
  virtual std::vector<ModuleCache*> module_caches() const { return {}; }

  /// The engine's own sleep and wake for this layer, if the backend has one
  /// (a memory saver that keeps host copies): does it and returns true.
  /// False, the default, has the protocol emulate the sleep step.
  virtual bool sleep_and_wake(Layer& /*layer*/, int /*level*/) const { return false; }

  /// Steps every run of this backend takes besides the run's own (a
  /// backend whose bug shows only after a sleep asks for one).
  virtual ReloadSteps steps() const { return {}; }

  /// True for a backend whose forward's output does not depend on its
  /// weights for the drawn input: the protocol then runs it although two
  /// checkpoints give one output (Note [A check that tests nothing] in
  /// cold_start.cc, which refuses such a forward by default).
  virtual bool output_ignores_weights() const { return false; }

  /// The modes in which the backend is expected to keep every address.
  virtual std::vector<ReloadMode> modes() const {
    return {ReloadMode::kNormal, ReloadMode::kDirect};
  }

  /// True for a negative control: a backend that is known to lose addresses,
  /// which the harness must flag. `expected_violation` names the tensor.
  virtual bool negative_control() const { return false; }
  /// The tensor name ("weight"), the start of a traced read ("aten::div"),
  /// "memory" or "op sequence": what the harness must flag.
  virtual std::string expected_violation() const { return ""; }

  /// True for a backend whose kernel runs on the CPU only (a negative control
  /// that reads through a host pointer, say); runs on other devices skip it.
  virtual bool cpu_only() const { return false; }

  /// Bytes that live tensor storages may grow by between the first and the
  /// last reload (a cache that fills once, say). Zero by default.
  virtual int64_t memory_tolerance_bytes() const { return 0; }
};

/// Creates a checkpoint parameter on `device` with the given layout, its
/// `_ckpt` record (a meta tensor with the checkpoint layout) and the default
/// weight loader (default_weight_loader()).
at::Tensor make_checkpoint_param(std::vector<int64_t> shape, at::ScalarType dtype,
                                 const c10::Device& device);

/// The default weight loader: puts the parameter back into its checkpoint
/// layout (`_ckpt`) on the storage it has, when that storage holds it, else
/// on a new storage; then copy_weight_(param, loaded).
void default_weight_loader(at::Tensor& param, const at::Tensor& loaded);

/// The registry: every backend registered with RELOADSAFE_REGISTER_BACKEND.
class BackendRegistry {
 public:
  using Factory = std::function<std::unique_ptr<Backend>()>;
  static BackendRegistry& instance();
  bool add(Factory factory);
  /// All backends, sorted by name (negative controls included).
  std::vector<std::unique_ptr<Backend>> create_all() const;

 private:
  std::vector<Factory> factories_;
};

}  // namespace reloadsafe::harness

#define RELOADSAFE_REGISTER_BACKEND(Type)                     \
  static const bool reloadsafe_registered_##Type =            \
      ::reloadsafe::harness::BackendRegistry::instance().add( \
          [] { return std::unique_ptr<::reloadsafe::harness::Backend>(new Type()); })
