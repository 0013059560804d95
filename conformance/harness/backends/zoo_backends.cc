// Rows of the bug zoo whose mechanism is a C++ one, each as a pair of
// backends: the layer as it shipped (`_buggy`, a negative control the
// harness must flag under the name the upstream fix used) and as the fix
// left it (`_fixed`, a sample that keeps every address in both modes). The
// Python zoo (python/tests/zoo/) re-creates the same rows as plain-torch
// layers; here the kernel state is held the way C++ holds it:
//
//   Z01  a TorchBind instance handed to a custom op from C++
//   Z05  a callable struct behind a std::shared_ptr the layer keeps
//   Z02  a plain C++ kernel object the layer keeps
//
// C++ has no walker to find what a kernel object holds, so each backend
// names it (Backend::held_tensors, held_objects). docs/bug-zoo-cpp.md lists
// the pairs and what the harness reports on each.
#include "conformance/harness/backend.h"

#include "utils/replace_parameter.h"

#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace reloadsafe::harness {
namespace {

// Gathers and permutations go through aten::gather and aten::index (x[:,
// perm]), which have meta kernels in LibTorch, so the device-clean probe
// (harness_test) runs these backends; aten::index_select has none.
using at::indexing::Slice;

void add_params(
    Layer& layer, const c10::Device& device,
    std::initializer_list<std::tuple<const char*, std::vector<int64_t>, at::ScalarType>> params) {
  for (const auto& [name, shape, dtype] : params) {
    layer.register_param(name, make_checkpoint_param(shape, dtype, device));
  }
}

// Z01 -- vLLM #41670: the CUTLASS FP8 MoE kernel allocates per-expert strides
// into the flattened weights and copies the per-expert scale when it is
// built, and post-processing built a new one on every load. Here the kernel
// is a TorchBind class that the forward hands to a custom op from C++.

constexpr int64_t kE = 4, kH = 16, kI = 8;  // experts, hidden, intermediate

struct CutlassMoeKernel : torch::CustomClassHolder {
  explicit CutlassMoeKernel(const at::Tensor& w13_scale)
      : ab_strides1(at::full({kE}, 2 * kI * kH, w13_scale.options().dtype(at::kLong))),
        c_strides1(at::full({kE}, kH * kI, w13_scale.options().dtype(at::kLong))),
        w1_scale(w13_scale.clone()) {}
  at::Tensor ab_strides1, c_strides1, w1_scale;
};

// Expert e's `n` elements of a flattened weight start at e * strides[e].
at::Tensor expert_rows(const at::Tensor& strides, int64_t n) {
  const at::Tensor starts = at::arange(kE, strides.options()) * strides;
  return (starts.unsqueeze(1) + at::arange(n, strides.options())).reshape(-1);
}

// x [T, H] through every expert (no routing), summed: [T, H].
at::Tensor cutlass_moe(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2,
                       const c10::intrusive_ptr<CutlassMoeKernel>& k) {
  const at::Tensor w1 = w13.reshape(-1).gather(0, expert_rows(k->ab_strides1, 2 * kI * kH));
  const at::Tensor w2e = w2.reshape(-1).gather(0, expert_rows(k->c_strides1, kH * kI));
  const at::Tensor h = at::matmul(x.unsqueeze(0), w1.view({kE, 2 * kI, kH}).transpose(1, 2)) *
                       k->w1_scale.view({kE, 1, 1});
  const auto gate_up = h.chunk(2, -1);
  const at::Tensor act = at::silu(gate_up[0]) * gate_up[1];
  return at::matmul(act, w2e.view({kE, kH, kI}).transpose(1, 2)).sum(0);
}

TORCH_LIBRARY(reloadsafe_zoo_cpp, m) {
  m.class_<CutlassMoeKernel>("CutlassMoeKernel")
      .def("unpack", [](const c10::intrusive_ptr<CutlassMoeKernel>& k) {
        return std::make_tuple(k->ab_strides1, k->c_strides1, k->w1_scale);
      });
  m.def(
      "cutlass_moe(Tensor x, Tensor w13, Tensor w2, "
      "__torch__.torch.classes.reloadsafe_zoo_cpp.CutlassMoeKernel kernel) -> Tensor",
      &cutlass_moe);
}

struct CutlassMoeLayer : Layer {
  c10::intrusive_ptr<CutlassMoeKernel> kernel;
};

class CutlassMoe : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<CutlassMoeLayer>();
    add_params(*layer, device,
               {{"w13", {kE, 2 * kI, kH}, at::kFloat},
                {"w2", {kE, kH, kI}, at::kFloat},
                {"w13_scale", {kE}, at::kFloat}});
    return layer;
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("reloadsafe_zoo_cpp::cutlass_moe", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const c10::intrusive_ptr<CutlassMoeKernel>&)>();
    return op.call(x, layer.get("w13"), layer.get("w2"),
                   dynamic_cast<const CutlassMoeLayer&>(layer).kernel);
  }
  std::vector<int64_t> input_shape() const override { return {6, kH}; }
  std::vector<NamedTensor> held_tensors(const Layer& layer) const override {
    const auto& k = dynamic_cast<const CutlassMoeLayer&>(layer).kernel;
    if (!k) return {};
    return {{"kernel.ab_strides1", k->ab_strides1},
            {"kernel.c_strides1", k->c_strides1},
            {"kernel.w1_scale", k->w1_scale}};
  }
  std::vector<NamedObject> held_objects(const Layer& layer) const override {
    const auto& k = dynamic_cast<const CutlassMoeLayer&>(layer).kernel;
    if (!k) return {};
    return {{"kernel", static_cast<const torch::CustomClassHolder*>(k.get())}};
  }
};

class CutlassMoeBuggy : public CutlassMoe {
 public:
  std::string name() const override { return "zoo_Z01_cutlass_moe_buggy"; }
  std::string description() const override {
    return "vLLM #41670: a new TorchBind kernel (strides, scale copy) on every load";
  }
  void process_weights_after_loading(Layer& layer) const override {
    dynamic_cast<CutlassMoeLayer&>(layer).kernel =
        c10::make_intrusive<CutlassMoeKernel>(layer.get("w13_scale"));
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "kernel.ab_strides1"; }
};

class CutlassMoeFixed : public CutlassMoe {
 public:
  std::string name() const override { return "zoo_Z01_cutlass_moe_fixed"; }
  std::string description() const override {
    return "vLLM #41670 fixed: the TorchBind kernel built once, its scale refilled in place";
  }
  void process_weights_after_loading(Layer& layer) const override {
    auto& kernel = dynamic_cast<CutlassMoeLayer&>(layer).kernel;
    if (!kernel) {
      kernel = c10::make_intrusive<CutlassMoeKernel>(layer.get("w13_scale"));
    } else {
      kernel->w1_scale.copy_(layer.get("w13_scale"));
    }
  }
};

// Z05 -- vLLM #48539: Machete's act-order permutation bound into a callable
// (functools.partial(ops.permute_cols, perm=perm) upstream) that every
// post-processing made anew. In C++ the callable is a struct the kernel
// reaches through a std::shared_ptr, which the layer does not declare.

constexpr int64_t kK = 32, kN = 16, kGroup = 8;  // in, out, group size

struct PermuteCols {
  at::Tensor perm;
  at::Tensor operator()(const at::Tensor& x) const { return x.index({Slice(), perm}); }
};

struct MacheteLayer : Layer {
  struct {
    std::shared_ptr<PermuteCols> act_perm;
  } kernel;
};

// The act-order permutation: the input features sorted by group, stably.
at::Tensor act_order(const Layer& layer) {
  return at::argsort(layer.get("g_idx"), /*stable=*/true);
}

class MacheteActOrder : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<MacheteLayer>();
    add_params(*layer, device, {{"weight", {kK, kN}, at::kFloat}, {"g_idx", {kK}, at::kInt}});
    return layer;
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm((*dynamic_cast<const MacheteLayer&>(layer).kernel.act_perm)(x),
                  layer.get("weight"));
  }
  std::vector<int64_t> input_shape() const override { return {6, kK}; }
  std::vector<NamedTensor> held_tensors(const Layer& layer) const override {
    const auto& act_perm = dynamic_cast<const MacheteLayer&>(layer).kernel.act_perm;
    if (!act_perm) return {};
    return {{"kernel.act_perm.perm", act_perm->perm, /*declared=*/!negative_control()}};
  }

 protected:
  // The weight's rows in act order; returns the permutation.
  static at::Tensor permute_weight(Layer& layer) {
    const at::Tensor perm = act_order(layer);
    replace_parameter(layer, "weight", layer.get("weight").index({perm}));
    return perm;
  }
};

class MacheteActOrderBuggy : public MacheteActOrder {
 public:
  std::string name() const override { return "zoo_Z05_machete_act_perm_buggy"; }
  std::string description() const override {
    return "vLLM #48539: act_perm, a struct holding the permutation, made anew on every load";
  }
  void process_weights_after_loading(Layer& layer) const override {
    const at::Tensor perm = permute_weight(layer);
    dynamic_cast<MacheteLayer&>(layer).kernel.act_perm =
        std::make_shared<PermuteCols>(PermuteCols{perm});
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "kernel.act_perm"; }
};

class MacheteActOrderFixed : public MacheteActOrder {
 public:
  std::string name() const override { return "zoo_Z05_machete_act_perm_fixed"; }
  std::string description() const override {
    return "vLLM #48539 fixed: act_perm kept, its permutation refilled in place and declared";
  }
  void process_weights_after_loading(Layer& layer) const override {
    const at::Tensor perm = permute_weight(layer);
    auto& act_perm = dynamic_cast<MacheteLayer&>(layer).kernel.act_perm;
    if (!act_perm) {
      act_perm = std::make_shared<PermuteCols>(PermuteCols{perm});
    } else {
      act_perm->perm.copy_(perm);
    }
  }
};

// Z02 -- vLLM #48438: Marlin's kernel object holds the workspace its lock
// counters live in (all zeros when a GEMM starts), and post-processing made a
// new one on every load; the act-order sort indices were rebound as well.
// Here the kernel object is a plain C++ class the layer keeps.

struct MarlinKernel {
  at::Tensor workspace;
};

struct MarlinLayer : Layer {
  std::shared_ptr<MarlinKernel> kernel;
};

class MarlinActOrder : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<MarlinLayer>();
    add_params(*layer, device,
               {{"qweight", {kK, kN}, at::kChar},
                {"scales", {kK / kGroup, kN}, at::kFloat},
                {"g_idx", {kK}, at::kInt}});
    return layer;
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    const at::Tensor scales =
        layer.get("scales").unsqueeze(1).expand({kK / kGroup, kGroup, kN}).reshape({kK, kN});
    const at::Tensor w = layer.get("qweight").to(at::kFloat) * scales;
    return at::mm(x.index({Slice(), layer.get("g_idx_sort_indices")}), w) +
           dynamic_cast<const MarlinLayer&>(layer).kernel->workspace;
  }
  std::vector<int64_t> input_shape() const override { return {6, kK}; }
  std::vector<std::string> derived_names() const override { return {"g_idx_sort_indices"}; }
  std::vector<NamedTensor> held_tensors(const Layer& layer) const override {
    const auto& kernel = dynamic_cast<const MarlinLayer&>(layer).kernel;
    if (!kernel) return {};
    return {{"kernel.workspace", kernel->workspace}};
  }

 protected:
  static at::Tensor permute_qweight(Layer& layer) {
    const at::Tensor perm = act_order(layer);
    replace_parameter(layer, "qweight", layer.get("qweight").index({perm}));
    return perm;
  }
  static at::Tensor new_workspace(const Layer& layer) {
    return at::zeros({kN}, layer.get("scales").options());
  }
};

class MarlinActOrderBuggy : public MarlinActOrder {
 public:
  std::string name() const override { return "zoo_Z02_marlin_workspace_buggy"; }
  std::string description() const override {
    return "vLLM #48438: a new kernel object (workspace) and sort indices on every load";
  }
  void process_weights_after_loading(Layer& layer) const override {
    layer.set_attribute("g_idx_sort_indices", permute_qweight(layer));
    dynamic_cast<MarlinLayer&>(layer).kernel =
        std::make_shared<MarlinKernel>(MarlinKernel{new_workspace(layer)});
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "kernel.workspace"; }
};

class MarlinActOrderFixed : public MarlinActOrder {
 public:
  std::string name() const override { return "zoo_Z02_marlin_workspace_fixed"; }
  std::string description() const override {
    return "vLLM #48438 fixed: the kernel's workspace reused and zeroed, sort indices refilled";
  }
  void process_weights_after_loading(Layer& layer) const override {
    refill_derived(layer, "g_idx_sort_indices", permute_qweight(layer));
    auto& kernel = dynamic_cast<MarlinLayer&>(layer).kernel;
    if (!kernel) {
      kernel = std::make_shared<MarlinKernel>(MarlinKernel{new_workspace(layer)});
    } else {
      kernel->workspace.zero_();
    }
  }
};

}  // namespace

RELOADSAFE_REGISTER_BACKEND(CutlassMoeBuggy);
RELOADSAFE_REGISTER_BACKEND(CutlassMoeFixed);
RELOADSAFE_REGISTER_BACKEND(MacheteActOrderBuggy);
RELOADSAFE_REGISTER_BACKEND(MacheteActOrderFixed);
RELOADSAFE_REGISTER_BACKEND(MarlinActOrderBuggy);
RELOADSAFE_REGISTER_BACKEND(MarlinActOrderFixed);

}  // namespace reloadsafe::harness
