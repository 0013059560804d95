// Rows of the bug zoo whose mechanism is a C++ one, each as a pair of
// backends: the layer as it shipped (`_buggy`, a negative control the
// harness must flag under the name the upstream fix used) and as the fix
// left it (`_fixed`, a sample that keeps every address in both modes). The
// Python zoo (python/tests/zoo/) re-creates the same rows as plain-torch
// layers; here the kernel state is held the way C++ holds it (a TorchBind
// instance handed to a custom op, a struct behind a std::shared_ptr, a plain
// C++ kernel object). Some rows' bugs keep every address, so that only a
// step of ReloadSteps (run_options.h) brings them out; both backends of such
// a pair ask for that step through Backend::steps(), so every run takes it.
//
// C++ has no walker to find what a kernel object holds, so each backend
// names it (Backend::held_tensors, held_objects, host_numbers).
//
// Each pair ends with its row (zoo_rows.h): the id, the upstream thread, the
// mechanism, what the harness must flag on the buggy backend and the doc's
// prose. harness_test checks every pair against its row, and
// docs/bug-zoo-cpp.md is generated from the rows (tools/gen_bug_zoo_cpp.sh).
#include "conformance/harness/backend.h"
#include "conformance/harness/backends/zoo_rows.h"

#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cmath>
#include <map>
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

// Z01: the CUTLASS FP8 MoE kernel allocates per-expert strides into the
// flattened weights and copies the per-expert scale when it is built, and
// post-processing built a new one on every load. Here the kernel is a TorchBind
// class that the forward hands to a custom op from C++.

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

const bool kZ01 = register_zoo_pair<CutlassMoeBuggy, CutlassMoeFixed>([] {
  ZooRow row;
  row.id = "Z01";
  row.thread = "vllm-project/vllm#41670";
  row.mechanism_class = "F";
  row.mechanism =
      "a TorchBind kernel (`CutlassMoeKernel`: `ab_strides1`, `c_strides1`, a copy of the scale "
      "`w1_scale`) handed to a custom op from C++; post-processing builds a new instance on every "
      "load";
  // A new TorchBind instance: the object and the tensors it holds, at the
  // custom op and inside it.
  row.flagged = {"kernel",
                 "kernel.ab_strides1",
                 "kernel.c_strides1",
                 "kernel.w1_scale",
                 "reloadsafe_zoo_cpp::cutlass_moe arg 3 (kernel)",
                 "replay"};
  row.reading =
      "Every reload the object at `reloadsafe_zoo_cpp::cutlass_moe arg 3 (kernel)` is `object "
      "replaced`, and the tensors the new instance holds are new too, at the ops that read them "
      "and as the object reports them through `unpack()`; `replay`: the captured op reads the old "
      "instance's scale.";
  row.fix =
      "the kernel is built once and each load refills `w1_scale` in place (`copy_`); it is never "
      "`object replaced`.";
  return row;
}());

// Z05: Machete's act-order permutation bound into a callable
// (functools.partial(ops.permute_cols, perm=perm) upstream) that every
// post-processing made anew. In C++ the callable is a struct the kernel reaches
// through a std::shared_ptr, which the layer does not declare.

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

const bool kZ05 = register_zoo_pair<MacheteActOrderBuggy, MacheteActOrderFixed>([] {
  ZooRow row;
  row.id = "Z05";
  row.thread = "vllm-project/vllm#48539";
  row.mechanism_class = "F";
  row.mechanism =
      "the act-order permutation held by `act_perm`, a callable struct the kernel reaches through "
      "a `std::shared_ptr`, undeclared; post-processing makes a new one on every load";
  // A struct behind a pointer the layer does not declare.
  row.flagged = {"kernel.act_perm.perm (undeclared)", "aten::index.Tensor arg 1[1] (indices)",
                 "replay"};
  row.reading =
      "The permutation is read without being declared (the warning) and moves at every reload; "
      "`replay`: the captured ops permute the input with the old permutation while the weight's "
      "rows are in the new order.";
  row.fix =
      "`act_perm` is made once, each load refills its permutation in place, and the backend "
      "declares it.";
  return row;
}());

// Z02: Marlin's kernel object holds the workspace its lock counters live in
// (all zeros when a GEMM starts), and post-processing made a new one on every
// load; the act-order sort indices were rebound as well. Here the kernel object
// is a plain C++ class the layer keeps.

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

const bool kZ02 = register_zoo_pair<MarlinActOrderBuggy, MarlinActOrderFixed>([] {
  ZooRow row;
  row.id = "Z02";
  row.thread = "vllm-project/vllm#48438";
  row.mechanism_class = "F (+A)";
  row.mechanism =
      "a plain C++ kernel object holding Marlin's `workspace`, made anew on every load; the sort "
      "indices `g_idx_sort_indices` rebound on the layer";
  // A plain C++ kernel object, and sort indices rebound on the layer.
  row.flagged = {"kernel.workspace", "g_idx_sort_indices", "aten::add.Tensor arg 1 (other)",
                 "replay"};
  row.reading =
      "The reads move with them: `aten::index.Tensor arg 1[1] (indices)` (the sort indices) and "
      "`aten::add.Tensor arg 1 (other)` (the workspace); `replay`: the captured ops permute the "
      "input with the old sort indices while the weight's rows are in the new order.";
  row.fix =
      "the sort indices are refilled in place (`refill_derived`), the workspace is made once and "
      "zeroed on every later load (`marlin_make_workspace_new(existing=...)` upstream).";
  return row;
}());

// Z37: FP8 attention keeps its K scale twice, as a device tensor the refit
// overwrites and as a host float, `_k_scale_float`, that the FlashInfer
// TRT-LLM-Gen kernel takes as a launch argument. The refit first left the float
// stale; the fix (ModelExpress #711, #783) refreshes it after every weight
// update, which is right in eager mode, while a captured graph keeps launching
// with the number it was captured with (the fix leaves graphs out of scope).
// The buggy backend here is that eager fix: every post-processing refreshes the
// float. No address moves and the live forward is right; the host_numbers step
// names the float.

constexpr int64_t kHeadSize = 16, kModel = 32;  // K projection: [head size, hidden]

struct KvScaleLayer : Layer {
  double k_scale_float = 1.0;  // `_k_scale_float`
};

class HostKScale : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<KvScaleLayer>();
    add_params(*layer, device,
               {{"k_proj", {kHeadSize, kModel}, at::kFloat}, {"k_scale", {1}, at::kFloat}});
    return layer;
  }
  std::vector<int64_t> input_shape() const override { return {6, kModel}; }
  std::vector<NamedNumber> host_numbers(const Layer& /*layer*/) const override {
    return {{"scale", softmax_scale()}};
  }
  ReloadSteps steps() const override { return ReloadSteps().set("host_numbers"); }

 protected:
  // The attention's softmax scale, head_size ** -0.5: a host float the
  // kernel takes too, fixed by the shapes, so a graph may bake it in.
  static double softmax_scale() { return 1.0 / std::sqrt(static_cast<double>(kHeadSize)); }
};

class HostKScaleBuggy : public HostKScale {
 public:
  std::string name() const override { return "zoo_Z37_host_k_scale_buggy"; }
  std::string description() const override {
    return "ModelExpress #782: _k_scale_float, a host float refreshed by every load, "
           "baked into a captured launch";
  }
  void process_weights_after_loading(Layer& layer) const override {
    dynamic_cast<KvScaleLayer&>(layer).k_scale_float = layer.get("k_scale").item<double>();
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    const at::Tensor k = at::mul(at::mm(x, layer.get("k_proj").t()), softmax_scale());
    return at::mul(k, dynamic_cast<const KvScaleLayer&>(layer).k_scale_float);
  }
  std::vector<NamedNumber> host_numbers(const Layer& layer) const override {
    std::vector<NamedNumber> numbers = HostKScale::host_numbers(layer);
    numbers.push_back({"_k_scale_float", dynamic_cast<const KvScaleLayer&>(layer).k_scale_float});
    return numbers;
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "_k_scale_float"; }
};

class HostKScaleFixed : public HostKScale {
 public:
  std::string name() const override { return "zoo_Z37_host_k_scale_fixed"; }
  std::string description() const override {
    return "ModelExpress #782 fixed for graphs: the kernel reads the K scale tensor, refilled in "
           "place by its loader; no host copy";
  }
  void process_weights_after_loading(Layer& /*layer*/) const override {}
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    const at::Tensor k = at::mul(at::mm(x, layer.get("k_proj").t()), softmax_scale());
    return at::mul(k, layer.get("k_scale"));
  }
};

const bool kZ37 = register_zoo_pair<HostKScaleBuggy, HostKScaleFixed>([] {
  ZooRow row;
  row.id = "Z37";
  row.thread = "ai-dynamo/modelexpress#782";
  row.mechanism_class = "D";
  row.mechanism =
      "the K scale kept as a host float `_k_scale_float` on the layer, refreshed by every "
      "post-processing and handed to the op as a number";
  // A host float the forward hands to an op: the captured ops replay the
  // old number, and without the host_numbers step only that shows.
  row.flagged = {"_k_scale_float", "replay"};
  row.flagged_without_steps = std::vector<std::string>{"replay"};
  row.construction =
      "The buggy backend is the eager fix (ModelExpress #711, #783): every post-processing "
      "refreshes `_k_scale_float` from the loaded `k_scale`, and the forward multiplies by it as "
      "a number (`aten::mul.Scalar`). The live forward is right; a captured graph launches with "
      "the number it was captured with. Both backends name their host numbers (`host_numbers()`): "
      "the attention's softmax `scale` (head_size ** -0.5, fixed by the shapes) and, in the buggy "
      "one, `_k_scale_float`. The buggy backend reads its scale with `.item()`, which the meta "
      "device cannot answer, so the device-clean probe says nothing about it.";
  row.reading =
      "`replay` at every reload: the captured ops hold the old number. The `host_numbers` step "
      "names the number.";
  row.fix =
      "the forward multiplies by the `k_scale` tensor, which its loader refills in place, and no "
      "host copy is kept.";
  return row;
}());

// Z34: after the first load, the FP8 layer's kernels read a tensor its method's
// metadata keeps (#11267). Every refit then made a new staging parameter in
// checkpoint layout (torch.empty_like of the saved meta tensor), loaded into it
// and copied the result over the kept tensor, and the staging stayed until the
// next refit made another: one weight's bytes more than the cold load from the
// first reload on, and two stagings at once while each later reload ran; with
// many layers, an OOM. No address moves and every value is right. Here the
// staging is kept in the layer's refit metadata, which the weight loader
// reaches; the weight is a float standing in for FP8, and the transform is a
// plain copy. The fix loads into the weight's own storage.

constexpr int64_t kRefitOut = 32, kRefitIn = 64;
constexpr int64_t kRefitWeightBytes = kRefitOut * kRefitIn * 4;  // float

struct RefitMetadata {
  bool loaded = false;        // post-processing has run: every later load is a reload
  at::Tensor reload_staging;  // the buggy refit's staging, kept until the next one
};

struct Fp8RefitLayer : Layer {
  std::shared_ptr<RefitMetadata> metadata = std::make_shared<RefitMetadata>();
};

class Fp8RefitStaging : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<Fp8RefitLayer>();
    add_params(*layer, device, {{"weight", {kRefitOut, kRefitIn}, at::kFloat}});
    return layer;
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("weight").t());
  }
  std::vector<int64_t> input_shape() const override { return {6, kRefitIn}; }
  ReloadSteps steps() const override {
    // A staging copy is over the peak budget.
    return ReloadSteps()
        .set("cold_footprint_tolerance_bytes", 0)
        .set("reload_peak_budget_bytes", kRefitWeightBytes / 2);
  }
};

class Fp8RefitStagingBuggy : public Fp8RefitStaging {
 public:
  std::string name() const override { return "zoo_Z34_fp8_refit_staging_buggy"; }
  std::string description() const override {
    return "TensorRT-LLM #14330: a fresh staging copy of the weight on every reload, kept until "
           "the next";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::dynamic_pointer_cast<Fp8RefitLayer>(Fp8RefitStaging::create_layer(device));
    const std::shared_ptr<RefitMetadata> metadata = layer->metadata;
    // pre_reload_weights: the first load goes into the parameter, every
    // reload into a staging tensor made for it.
    set_attr(
        layer->get("weight"), "weight_loader",
        WeightLoader{"pre_reload_staging", [metadata](at::Tensor& param, const at::Tensor& loaded) {
                       if (!metadata->loaded) {
                         default_weight_loader(param, loaded);
                         return;
                       }
                       at::Tensor staging = at::empty_like(param);
                       staging.copy_(loaded);
                       metadata->reload_staging = staging;  // frees the previous one only now
                     }});
    return layer;
  }
  void process_weights_after_loading(Layer& layer) const override {
    RefitMetadata& metadata = *dynamic_cast<Fp8RefitLayer&>(layer).metadata;
    if (metadata.reload_staging.defined()) layer.get("weight").copy_(metadata.reload_staging);
    metadata.loaded = true;
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "memory"; }
};

class Fp8RefitStagingFixed : public Fp8RefitStaging {
 public:
  std::string name() const override { return "zoo_Z34_fp8_refit_staging_fixed"; }
  std::string description() const override {
    return "TensorRT-LLM #14330 fixed: every reload loads into the weight's own storage";
  }
  void process_weights_after_loading(Layer& layer) const override {
    dynamic_cast<Fp8RefitLayer&>(layer).metadata->loaded = true;
  }
};

const bool kZ34 = register_zoo_pair<Fp8RefitStagingBuggy, Fp8RefitStagingFixed>([] {
  ZooRow row;
  row.id = "Z34";
  row.thread = "NVIDIA/TensorRT-LLM#14330";
  row.mechanism_class = "G";
  row.mechanism =
      "the weight loader stages every reload in a fresh tensor kept in the layer's refit metadata "
      "until the next reload";
  // Over the cold load's footprint and over the reload's peak budget, both
  // named "memory".
  row.flagged = {"memory"};
  row.flagged_without_steps = std::vector<std::string>{};
  row.construction =
      "After the first load (which goes into the parameter), the buggy weight loader makes a "
      "staging tensor in checkpoint layout on every reload, loads into it and keeps it in the "
      "layer's refit metadata, where post-processing copies it over the weight the forward reads; "
      "the previous reload's staging is let go only once the new one exists. The weight is a float "
      "[32, 64] standing in for FP8 (8192 bytes); the transform upstream is left out.";
  row.reading =
      "Each reload's peak is one staging above what was live before it, and the footprint after "
      "it one weight above the cold load's. No address moves, every value is right, and memory "
      "does not grow after the first reload (one staging replaces the other).";
  row.fix =
      "every reload loads into the weight's own storage (the default loader). The upstream fix "
      "caches one staging buffer made at the first reload instead; against these bounds that "
      "buffer would be one weight over the cold load's footprint and over the first reload's "
      "budget, as the bug is.";
  return row;
}());

// Z19: with speculative decoding the draft model sits beside the target, and
// level-2 sleep saved and restored the target's buffers only. The drafter's
// non-persistent buffers (the rotary `cos_sin_cache`, built once at
// construction and never written by a load) came back as garbage: the target's
// outputs looked right while draft acceptance collapsed. Here the drafter is a
// torch::nn::Module the layer keeps through a std::shared_ptr without
// register_module(), so the layer's buffers() do not reach it; the fix
// registers it. Without a sleep nothing ever writes the table, so only the
// sleep step (level 2, or 1) shows the bug.

constexpr int64_t kRotary = 32, kDraftOut = 16;

struct Drafter : torch::nn::Module {
  explicit Drafter(const c10::Device& device) {
    const at::Tensor pos =
        at::arange(kRotary, at::TensorOptions().dtype(at::kFloat).device(device));
    cos_sin_cache = register_buffer("cos_sin_cache", at::cat({pos.cos(), pos.sin()}));
  }
  at::Tensor cos_sin_cache;
};

struct SpecDecodeLayer : Layer {
  std::shared_ptr<Drafter> drafter;
};

class DraftRopeCache : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<SpecDecodeLayer>();
    add_params(*layer, device, {{"proj", {kDraftOut, kRotary}, at::kFloat}});
    layer->drafter = std::make_shared<Drafter>(device);
    return layer;
  }
  void process_weights_after_loading(Layer& /*layer*/) const override {}
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    const at::Tensor& cache = dynamic_cast<const SpecDecodeLayer&>(layer).drafter->cos_sin_cache;
    return at::mm(x * cache.narrow(0, 0, kRotary), layer.get("proj").t());
  }
  std::vector<int64_t> input_shape() const override { return {6, kRotary}; }
  // The table, by the name a registered drafter's buffer has, declared: the
  // forward reads it, and Layer::get does not reach into a submodule.
  std::vector<NamedTensor> held_tensors(const Layer& layer) const override {
    const auto& drafter = dynamic_cast<const SpecDecodeLayer&>(layer).drafter;
    if (!drafter) return {};
    return {{"drafter.cos_sin_cache", drafter->cos_sin_cache}};
  }
  ReloadSteps steps() const override {
    // compare_state names the table, not only the forward.
    return ReloadSteps().set("sleep", 2).set("compare_state");
  }
};

class DraftRopeCacheBuggy : public DraftRopeCache {
 public:
  std::string name() const override { return "zoo_Z19_draft_rope_cache_buggy"; }
  std::string description() const override {
    return "vLLM #49774: the drafter kept beside the layer, unregistered; level-2 wake does not "
           "restore its cos_sin_cache";
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "drafter.cos_sin_cache"; }
};

class DraftRopeCacheFixed : public DraftRopeCache {
 public:
  std::string name() const override { return "zoo_Z19_draft_rope_cache_fixed"; }
  std::string description() const override {
    return "vLLM #49774 fixed: the drafter registered as a submodule, its buffers restored on wake";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::dynamic_pointer_cast<SpecDecodeLayer>(DraftRopeCache::create_layer(device));
    layer->register_module("drafter", layer->drafter);
    return layer;
  }
};

const bool kZ19 = register_zoo_pair<DraftRopeCacheBuggy, DraftRopeCacheFixed>([] {
  ZooRow row;
  row.id = "Z19";
  row.thread = "vllm-project/vllm#49774";
  row.mechanism_class = "O2";
  row.mechanism =
      "a drafter `torch::nn::Module` kept through a `std::shared_ptr` without "
      "`register_module()`, its constant `cos_sin_cache` buffer out of what wake restores";
  // A drafter's table that no wake restores.
  row.flagged = {"drafter.cos_sin_cache", "forward", "replay"};
  row.computes_wrong_values = true;
  row.flagged_without_steps = std::vector<std::string>{};
  row.construction =
      "The drafter is a `torch::nn::Module` whose rotary `cos_sin_cache` is a buffer built at "
      "construction and never written by a load. The buggy layer keeps it through a "
      "`std::shared_ptr` member without `register_module()`, so the layer's `buffers()` (what "
      "wake restores at level 2) miss it. Both backends declare the table as "
      "`drafter.cos_sin_cache` (`held_tensors()`: `Layer::get` does not reach into a submodule).";
  row.reading =
      "The table comes back from every sleep as NaN, and `forward` and `replay` read it at every "
      "reload. Nothing but a sleep writes the table.";
  row.fix = "the drafter registered as the submodule `drafter`, so its buffer is restored on wake.";
  return row;
}());

// Z09: the mxfp4 MoE pads its dims for alignment (gpt-oss's 2880 to 2944);
// construction zeroes the padded weights and the loaders write only the
// checkpoint's slice. Layerwise reload re-creates every parameter uninitialised
// before loading into it, so the pad holds what the memory held, and through
// the padded channels it reaches every real output: a reload of the same
// weights diverged from the first token with every address kept. A reload into
// the tensors construction made never shows it (the pad keeps its zeros); the
// fix zeroes the pad on every load.

constexpr int64_t kMoeReal = 30, kMoeRealIn = 45, kMoePad = 32, kMoePadIn = 48;

// A padded parameter: `padded` zeros whose checkpoint layout is `real`,
// loaded into its leading slice.
at::Tensor padded_param(std::vector<int64_t> padded, std::vector<int64_t> real,
                        const c10::Device& device) {
  at::Tensor param =
      make_parameter(at::zeros(padded, at::TensorOptions().dtype(at::kFloat).device(device)));
  set_attr(param, "_ckpt",
           at::empty(real, at::TensorOptions().dtype(at::kFloat).device(at::kMeta)));
  set_attr(param, "weight_loader",
           WeightLoader{"padded_slice", [](at::Tensor& p, const at::Tensor& loaded) {
                          p.narrow(0, 0, loaded.size(0)).narrow(1, 0, loaded.size(1)).copy_(loaded);
                        }});
  return param;
}

class PaddedMoe : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<Layer>();
    layer->register_param("w13_weight",
                          padded_param({kMoePad, kMoePadIn}, {kMoeReal, kMoeRealIn}, device));
    layer->register_param("w2_weight",
                          padded_param({kMoePadIn, kMoePad}, {kMoeRealIn, kMoeReal}, device));
    return layer;
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    const at::Tensor x_pad = at::constant_pad_nd(x, {0, kMoePadIn - kMoeRealIn});
    const at::Tensor h = at::silu(at::mm(x_pad, layer.get("w13_weight").t()));
    return at::mm(h, layer.get("w2_weight").t()).narrow(1, 0, kMoeRealIn);
  }
  std::vector<int64_t> input_shape() const override { return {6, kMoeRealIn}; }
  ReloadSteps steps() const override {
    // compare_state names the padded weights, not only the forward.
    return ReloadSteps().set("recreate_parameters").set("compare_state");
  }
};

class PaddedMoeBuggy : public PaddedMoe {
 public:
  std::string name() const override { return "zoo_Z09_mxfp4_padding_buggy"; }
  std::string description() const override {
    return "vLLM #50523: padding zeroed at construction only; a re-created parameter keeps "
           "garbage in its pad";
  }
  void process_weights_after_loading(Layer& /*layer*/) const override {}
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "w13_weight"; }
};

class PaddedMoeFixed : public PaddedMoe {
 public:
  std::string name() const override { return "zoo_Z09_mxfp4_padding_fixed"; }
  std::string description() const override {
    return "vLLM #50523 fixed: the pad rows and columns zeroed on every load";
  }
  void process_weights_after_loading(Layer& layer) const override {
    for (const char* name : {"w13_weight", "w2_weight"}) {
      const at::Tensor w = layer.get(name);
      const at::Tensor real = std::get<at::Tensor>(*find_attr(w, "_ckpt"));
      w.narrow(0, real.size(0), w.size(0) - real.size(0)).zero_();
      w.narrow(1, real.size(1), w.size(1) - real.size(1)).zero_();
    }
  }
};

const bool kZ09 = register_zoo_pair<PaddedMoeBuggy, PaddedMoeFixed>([] {
  ZooRow row;
  row.id = "Z09";
  row.thread = "vllm-project/vllm#50523";
  row.mechanism_class = "C";
  row.mechanism =
      "padded `w13_weight` and `w2_weight` zeroed at construction only, the loader writing the "
      "checkpoint's slice";
  // Pads a re-created parameter leaves as garbage.
  row.flagged = {"w13_weight", "w2_weight", "forward", "replay"};
  row.computes_wrong_values = true;
  row.flagged_without_steps = std::vector<std::string>{};
  row.construction =
      "`w13_weight` is [32, 48] and `w2_weight` [48, 32], zeros at construction, with checkpoint "
      "layouts [30, 45] and [45, 30] (`_ckpt`) and a loader that writes the leading slice. The "
      "forward pads the input with zeros and reads the whole padded weights, so a NaN in a pad "
      "reaches every output.";
  row.reading =
      "Re-created before every load, the pads hold the sentinel, and `forward` and `replay` read "
      "it at every reload. Reloaded into the tensors construction made, the pads keep their zeros.";
  row.fix =
      "post-processing zeroes the pad rows and columns on every load (upstream zero-fills at "
      "re-creation).";
  return row;
}());

// Z20: the FlashInfer MoE path kept the row permutation of its gate/up shuffle
// in a module-level cache keyed by shape and device, read by post-processing.
// The cache is nothing the layer holds, so a level-2 sleep discarded its
// contents (it lived in the same device memory) and no wake restored them: the
// next reload shuffled the new weights with garbage indices. The fix keeps the
// indices in a registered buffer, which every wake restores. The backend names
// the cache for the steps (Backend::module_caches): slept with the layer,
// compared under compare_state, and emptied for the cold loads made aside.

constexpr int64_t kPermRows = 16, kPermCols = 8;

std::map<std::string, at::Tensor>& permute_indices_cache() {
  static auto* cache = new std::map<std::string, at::Tensor>();
  return *cache;
}

ModuleCache* permute_cache() {
  static auto* cache = new TensorMapCache("_cache_permute_indices", permute_indices_cache());
  return cache;
}

// The rows of the gate and up halves interleaved.
at::Tensor interleaved_rows(const c10::Device& device) {
  return at::arange(kPermRows, at::TensorOptions().dtype(at::kLong).device(device))
      .view({2, kPermRows / 2})
      .t()
      .reshape({kPermRows});
}

struct ShuffledMoeLayer : Layer {
  bool have_permutation = false;
};

class GlobalPermCache : public Backend {
 public:
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<ShuffledMoeLayer>();
    add_params(*layer, device, {{"w13", {kPermRows, kPermCols}, at::kFloat}});
    layer->register_buffer("w13_shuffled", at::zeros({kPermRows, kPermCols}, device));
    return layer;
  }
  void process_weights_after_loading(Layer& layer) const override {
    layer.get("w13_shuffled").copy_(layer.get("w13").index({permutation(layer)}));
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("w13_shuffled").t());
  }
  std::vector<int64_t> input_shape() const override { return {6, kPermCols}; }
  std::vector<std::string> derived_names() const override { return {"w13_shuffled"}; }
  std::vector<ModuleCache*> module_caches() const override { return {permute_cache()}; }
  ReloadSteps steps() const override {
    // compare_state names the cache entry, not only the forward.
    return ReloadSteps().set("sleep", 2).set("compare_state");
  }

 protected:
  virtual at::Tensor permutation(Layer& layer) const {
    const c10::Device device = layer.get("w13").device();
    const std::string key = "(" + std::to_string(kPermRows) + ", " + device.str() + ")";
    auto& cache = permute_indices_cache();
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, interleaved_rows(device)).first;
    return it->second;
  }
};

class GlobalPermCacheBuggy : public GlobalPermCache {
 public:
  std::string name() const override { return "zoo_Z20_global_perm_cache_buggy"; }
  std::string description() const override {
    return "vLLM #49695: the shuffle's row permutation in a module-level cache, garbage after a "
           "level-2 sleep";
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "_cache_permute_indices"; }
};

class GlobalPermCacheFixed : public GlobalPermCache {
 public:
  std::string name() const override { return "zoo_Z20_global_perm_cache_fixed"; }
  std::string description() const override {
    return "vLLM #49695 fixed: the row permutation in a registered buffer, restored on wake";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = GlobalPermCache::create_layer(device);
    layer->register_buffer(
        "permute_indices",
        at::zeros({kPermRows}, at::TensorOptions().dtype(at::kLong).device(device)));
    return layer;
  }

 protected:
  at::Tensor permutation(Layer& layer) const override {
    auto& shuffled = dynamic_cast<ShuffledMoeLayer&>(layer);
    const at::Tensor indices = layer.get("permute_indices");
    if (!shuffled.have_permutation) {
      indices.copy_(interleaved_rows(indices.device()));
      shuffled.have_permutation = true;
    }
    return indices;
  }
};

const bool kZ20 = register_zoo_pair<GlobalPermCacheBuggy, GlobalPermCacheFixed>([] {
  ZooRow row;
  row.id = "Z20";
  row.thread = "vllm-project/vllm#49695";
  row.mechanism_class = "O4";
  row.mechanism =
      "the shuffle's row permutation in a module-level cache (`_cache_permute_indices`, a static "
      "map keyed by shape and device) that post-processing reads, named through "
      "`Backend::module_caches`";
  // A module-level cache's entry no wake restores, read by the next
  // reload's post-processing.
  row.flagged = {"_cache_permute_indices[(16, cpu)]", "forward", "replay"};
  row.computes_wrong_values = true;
  row.flagged_without_steps = std::vector<std::string>{};
  row.construction =
      "Post-processing shuffles `w13` [16, 8] into the buffer `w13_shuffled` with a row "
      "permutation it takes from `_cache_permute_indices`, a static map in the backend's file, "
      "filled on first use. The backend names the cache (`Backend::module_caches`, a "
      "`TensorMapCache` in `module_cache.h`), so the sleep step discards its entry with the "
      "layer's tensors, `compare_state` compares it by name, and every cold load the harness "
      "makes aside, and each mode, starts from an empty cache.";
  row.reading =
      "After each sleep the next reload's post-processing shuffles with garbage indices: "
      "`w13_shuffled`, the cache's entry, the forward and the replay differ from a cold load. "
      "Nothing but the sleep step writes the cache.";
  row.fix =
      "the permutation lives in a registered buffer, `permute_indices`, which every wake "
      "restores.";
  return row;
}());

}  // namespace

RELOADSAFE_REGISTER_BACKEND(CutlassMoeBuggy);
RELOADSAFE_REGISTER_BACKEND(CutlassMoeFixed);
RELOADSAFE_REGISTER_BACKEND(MacheteActOrderBuggy);
RELOADSAFE_REGISTER_BACKEND(MacheteActOrderFixed);
RELOADSAFE_REGISTER_BACKEND(MarlinActOrderBuggy);
RELOADSAFE_REGISTER_BACKEND(MarlinActOrderFixed);
RELOADSAFE_REGISTER_BACKEND(HostKScaleBuggy);
RELOADSAFE_REGISTER_BACKEND(HostKScaleFixed);
RELOADSAFE_REGISTER_BACKEND(Fp8RefitStagingBuggy);
RELOADSAFE_REGISTER_BACKEND(Fp8RefitStagingFixed);
RELOADSAFE_REGISTER_BACKEND(DraftRopeCacheBuggy);
RELOADSAFE_REGISTER_BACKEND(DraftRopeCacheFixed);
RELOADSAFE_REGISTER_BACKEND(PaddedMoeBuggy);
RELOADSAFE_REGISTER_BACKEND(PaddedMoeFixed);
RELOADSAFE_REGISTER_BACKEND(GlobalPermCacheBuggy);
RELOADSAFE_REGISTER_BACKEND(GlobalPermCacheFixed);

}  // namespace reloadsafe::harness
