// Negative controls for what only the read trace and the memory census can
// see: each keeps every declared tensor at its address, passes a same-weights
// reload, and would still make a captured CUDA graph read stale or freed
// memory. The harness must flag each with the right tensor or op. (The two
// controls that move a declared tensor live beside the samples they derive
// from, in sample_backends.cc.)
#include "conformance/harness/backend.h"

#include "utils/replace_parameter.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace reloadsafe::harness {
namespace {

std::shared_ptr<Layer> linear_layer(const c10::Device& device) {
  auto layer = std::make_shared<Layer>();
  layer->register_param("weight", make_checkpoint_param({16, 64}, at::kFloat, device));
  return layer;
}

class LinearControl : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return linear_layer(device);
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
  bool negative_control() const override { return true; }
};

// A per-column scale rebuilt as a fresh plain attribute by every
// post-processing and read by the forward, but not declared.
class UndeclaredScaleControl : public LinearControl {
 public:
  std::string name() const override { return "neg_undeclared_scale"; }
  std::string description() const override {
    return "negative control: col_scale rebuilt (new tensor) each load, read but not declared";
  }
  void process_weights_after_loading(Layer& layer) const override {
    layer.set_attribute("col_scale", layer.get("weight").abs().amax(0).clamp_min(1e-6));
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, at::div(layer.get("weight"), layer.get("col_scale")).t());
  }
  std::string expected_violation() const override { return "col_scale"; }
};

// A kernel object outside the layer holds a permuted copy of the weight,
// made anew by every post-processing. Entries of dead layers are dropped.
struct PermutedKernel {
  std::weak_ptr<torch::nn::Module> layer;
  at::Tensor permuted;
};
std::vector<PermutedKernel>& kernel_objects() {
  static auto* objects = new std::vector<PermutedKernel>();
  return *objects;
}

class HeldOutsideControl : public LinearControl {
 public:
  std::string name() const override { return "neg_held_outside"; }
  std::string description() const override {
    return "negative control: a kernel object outside the layer holds a new permuted weight";
  }
  void process_weights_after_loading(Layer& layer) const override {
    auto& objects = kernel_objects();
    objects.erase(std::remove_if(objects.begin(), objects.end(),
                                 [&](const PermutedKernel& k) {
                                   return k.layer.expired() || k.layer.lock().get() == &layer;
                                 }),
                  objects.end());
    objects.push_back({layer.shared_from_this(), layer.get("weight").t().contiguous()});
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    for (const auto& k : kernel_objects()) {
      if (k.layer.lock().get() == &layer) return at::mm(x, k.permuted);
    }
    TORCH_CHECK(false, "no kernel object for this layer");
  }
  std::string expected_violation() const override { return "undeclared tensor"; }
};

// Keeps every checkpoint it ever loaded alive (a history nobody reads).
class LeakControl : public LinearControl {
 public:
  std::string name() const override { return "neg_leak"; }
  std::string description() const override {
    return "negative control: every loaded weight is kept alive in a history";
  }
  void process_weights_after_loading(Layer& layer) const override {
    static auto* history = new std::vector<at::Tensor>();
    history->push_back(layer.get("weight").clone());
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("weight").t());
  }
  std::string expected_violation() const override { return "memory"; }
};

// Marlin-style sort indices computed eagerly at the cold load, dropped by a
// reload "to be rebuilt lazily": the forward after a reload issues an op the
// captured graph never had.
class LazySortControl : public LinearControl {
 public:
  std::string name() const override { return "neg_lazy_sort"; }
  std::string description() const override {
    return "negative control: sort indices dropped on reload, rebuilt lazily by the forward";
  }
  void process_weights_after_loading(Layer& layer) const override {
    if (layer.has("sort_idx")) {
      layer.set("sort_idx", at::Tensor());
    } else {
      refill_derived(layer, "sort_idx", sort_indices(layer.get("weight")));
    }
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    at::Tensor w = layer.get("weight");
    at::Tensor idx = layer.get("sort_idx");
    if (!idx.defined()) idx = sort_indices(w);
    // Permute the weight's columns and the input's features alike.
    return at::mm(x.index_select(1, idx), w.index_select(1, idx).t());
  }
  std::string expected_violation() const override { return "op sequence"; }

 private:
  static at::Tensor sort_indices(const at::Tensor& w) { return at::argsort(w.sum(0)); }
};

// A kernel object that kept a raw pointer to the packed weight of the first
// post-processing (as a handle made once and never refreshed would). Every
// reload re-packs into a new tensor and frees the old one; the kernel reads
// through its pointer, without any op argument, so neither the trace nor the
// declared tensors see it. Only the poison quarantine (memory_census.h) makes
// the stale read visible deterministically: without it the allocator tends
// to hand the freed block to the new pack, and the stale pointer reads the
// right values by luck.
struct RawPointerKernel {
  std::weak_ptr<torch::nn::Module> layer;
  const float* packed = nullptr;  // never owns: a raw handle
};
std::vector<RawPointerKernel>& raw_kernels() {
  static auto* kernels = new std::vector<RawPointerKernel>();
  return *kernels;
}

class RawPointerControl : public Backend {
 public:
  std::string name() const override { return "neg_raw_pointer"; }
  std::string description() const override {
    return "negative control: a kernel object reads a re-packed weight through a stale raw pointer";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<Layer>();
    layer->register_param("weight", make_checkpoint_param({16, 64}, at::kFloat, device));
    layer->register_param("bias", make_checkpoint_param({16}, at::kFloat, device));
    return layer;
  }
  void process_weights_after_loading(Layer& layer) const override {
    layer.set_attribute("packed", layer.get("weight").t().contiguous());
    auto& kernels = raw_kernels();
    kernels.erase(std::remove_if(kernels.begin(), kernels.end(),
                                 [](const RawPointerKernel& k) { return k.layer.expired(); }),
                  kernels.end());
    for (const auto& k : kernels) {
      if (k.layer.lock().get() == &layer) return;  // the handle is made once
    }
    kernels.push_back({layer.shared_from_this(), layer.get("packed").data_ptr<float>()});
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    const float* packed = nullptr;
    for (const auto& k : raw_kernels()) {
      if (k.layer.lock().get() == &layer) packed = k.packed;
    }
    TORCH_CHECK(packed != nullptr, "no kernel object for this layer");
    TORCH_CHECK(x.device().is_cpu(), "neg_raw_pointer runs on the CPU only");
    const at::Tensor xc = x.contiguous();
    at::Tensor out = at::empty({x.size(0), 16}, x.options());
    const float* xs = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.size(0); ++i) {
      for (int64_t j = 0; j < 16; ++j) {
        float acc = 0;
        for (int64_t k = 0; k < 64; ++k) acc += xs[i * 64 + k] * packed[k * 16 + j];
        o[i * 16 + j] = acc;
      }
    }
    return at::add(out, layer.get("bias"));
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
  bool cpu_only() const override { return true; }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "forward"; }
};

// A workspace made by the first forward, as first_forward_workspace makes
// it, but dropped by every post-processing "to be re-made lazily": the graph
// captured after warm-up keeps reading the dropped one.
class WorkspacePerReloadControl : public LinearControl {
 public:
  std::string name() const override { return "neg_workspace_per_reload"; }
  std::string description() const override {
    return "negative control: the first forward's workspace is dropped by every reload";
  }
  void process_weights_after_loading(Layer& layer) const override {
    if (layer.has("workspace")) layer.set("workspace", at::Tensor());
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    auto& self = const_cast<Layer&>(layer);  // a kernel's lazily made state
    if (!self.has("workspace") || !self.get("workspace").defined()) {
      self.set_attribute("workspace", at::zeros({8, 16}, x.options()));
    }
    at::Tensor ws = self.get("workspace");
    at::mm_out(ws, x, layer.get("weight").t());
    return ws.clone();
  }
  std::vector<std::string> derived_names() const override { return {"workspace"}; }
  std::string expected_violation() const override { return "workspace"; }
};

}  // namespace

RELOADSAFE_REGISTER_BACKEND(RawPointerControl);
RELOADSAFE_REGISTER_BACKEND(WorkspacePerReloadControl);
RELOADSAFE_REGISTER_BACKEND(UndeclaredScaleControl);
RELOADSAFE_REGISTER_BACKEND(HeldOutsideControl);
RELOADSAFE_REGISTER_BACKEND(LeakControl);
RELOADSAFE_REGISTER_BACKEND(LazySortControl);

}  // namespace reloadsafe::harness
