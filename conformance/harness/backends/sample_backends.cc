// Sample backends for the reload harness, each mirroring a real kind of
// weight post-processing in a few dozen lines, and two negative controls
// that lose an address on every reload (the harness must flag them).
#include "conformance/harness/backend.h"

#include "utils/parameter_names.h"
#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>

namespace reloadsafe::harness {
namespace {

at::TensorOptions on(const c10::Device& device, at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().dtype(dtype).device(device);
}

std::shared_ptr<Layer> layer_with(
    const c10::Device& device,
    std::initializer_list<std::tuple<const char*, std::vector<int64_t>, at::ScalarType>> params) {
  auto layer = std::make_shared<Layer>();
  for (const auto& [name, shape, dtype] : params) {
    layer->register_param(name, make_checkpoint_param(shape, dtype, device));
  }
  return layer;
}

// Marlin-style: a uint8 [16, 64] weight (FP8 bytes) interleaved by row
// groups and viewed as int32 [4, 64]: the same byte count, so the repack
// lands in the loaded storage.
at::Tensor marlin_pack(const at::Tensor& w) {
  return w.reshape({4, 4, 64}).transpose(0, 1).contiguous().view(at::kInt).reshape({4, 64});
}
at::Tensor marlin_unpack(const at::Tensor& packed) {
  return packed.contiguous().view(at::kByte).reshape({4, 4, 64}).transpose(0, 1).reshape({16, 64});
}

class MarlinRepack : public Backend {
 public:
  std::string name() const override { return "marlin_repack"; }
  std::string description() const override {
    return "uint8 [16,64] weight repacked to int32 [4,64] of the same byte size";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {16, 64}, at::kByte}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor packed = marlin_pack(layer.get("weight"));
    set_attr(packed, "is_shuffled", true);
    replace_parameter(layer, "weight", packed);
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, marlin_unpack(layer.get("weight")).to(at::kFloat).t());
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
};

// ROCm FP8-style row padding: rows padded from 60 to 64 elements, the weight
// a view with gaps on a larger storage. Only a direct reload, which may use
// the whole storage, can keep its address.
class RocmRowPadding : public Backend {
 public:
  std::string name() const override { return "rocm_row_padding"; }
  std::string description() const override {
    return "[16,60] weight padded to row stride 64 (a larger view with gaps)";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {16, 60}, at::kFloat}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor w = layer.get("weight");
    at::Tensor padded = at::zeros({16, 64}, w.options()).narrow(1, 0, 60);
    padded.copy_(w);
    replace_parameter(layer, "weight", padded);
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("weight").t());
  }
  std::vector<int64_t> input_shape() const override { return {8, 60}; }
  std::vector<ReloadMode> modes() const override { return {ReloadMode::kDirect}; }
};

// A weight stored transposed for the kernel (K-major), same bytes.
class TransposedWeight : public Backend {
 public:
  std::string name() const override { return "transposed"; }
  std::string description() const override { return "[32,16] weight stored transposed as [16,32]"; }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {32, 16}, at::kFloat}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    replace_parameter(layer, "weight", layer.get("weight").t().contiguous());
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("weight").t());
  }
  std::vector<int64_t> input_shape() const override { return {8, 32}; }
};

// MLA-style: W_UK and W_UV derived from kv_b_proj, kept as plain attributes
// and refilled in place on every reload.
class MlaDerived : public Backend {
 public:
  std::string name() const override { return "mla_derived"; }
  std::string description() const override {
    return "W_UK / W_UV derived from kv_b_proj, refilled in place";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"kv_b_proj", {64, 32}, at::kFloat}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor w = layer.get("kv_b_proj");
    refill_derived(layer, "W_UK", w.narrow(0, 0, 32).t().contiguous());
    refill_derived(layer, "W_UV", w.narrow(0, 32, 32).clone());
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(at::mm(x, layer.get("W_UK")), layer.get("W_UV").t());
  }
  std::vector<int64_t> input_shape() const override { return {8, 32}; }
  std::vector<std::string> derived_names() const override { return {"W_UK", "W_UV"}; }
};

// A checkpoint weight renamed for kernels (qweight) with move_parameter, and
// a checkpoint scale folded into a derived tensor and retired.
class RetiredRenamed : public Backend {
 public:
  std::string name() const override { return "retired_renamed"; }
  std::string description() const override {
    return "weight moved to runtime name qweight; input_scale folded and retired";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {16, 64}, at::kByte}, {"input_scale", {1}, at::kFloat}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    if (layer.kind("qweight") == SlotKind::kAbsent) move_parameter(layer, "weight", "qweight");
    set_kernel_parameter(layer, "qweight", marlin_pack(layer.get("qweight")));
    refill_derived(layer, "alpha", layer.get("input_scale") * 0.5);
    retire_parameter(layer, "input_scale");
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    at::Tensor w = marlin_unpack(layer.get("qweight")).to(at::kFloat);
    return at::mm(x, w.t()) * layer.get("alpha");
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
  std::vector<std::string> derived_names() const override { return {"alpha"}; }
};

// Online quantization (the quant method uses the meta device): a float
// source is quantized to int8 into the kernel parameter, then released. The
// source is a requantization source, so replace_parameter gives it a new
// object; its loader re-materialises it on every load.
class OnlineRequant : public Backend {
 public:
  std::string name() const override { return "online_requant"; }
  std::string description() const override {
    return "float source quantized to int8 qweight, source released (uses_meta_device)";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<Layer>();
    layer->quant_method = QuantMethod{/*uses_meta_device=*/true};
    // LibTorch cannot rebind a meta tensor to real data, so the not yet
    // materialised source is an empty tensor on the device.
    at::Tensor source = make_parameter(at::empty({0}, on(device)));
    set_attr(source, "_ckpt", at::empty({16, 64}, on(at::kMeta)));
    set_attr(source, "requantization_source", true);
    set_attr(source, "weight_loader", WeightLoader{"materialise", &materialise});
    layer->register_param("weight", source);
    layer->register_param("qweight", make_parameter(at::empty({0}, on(device, at::kChar))));
    return layer;
  }
  static void materialise(at::Tensor& param, const at::Tensor& loaded) {
    if (param.sizes() != loaded.sizes()) param.set_data(at::empty(loaded.sizes(), param.options()));
    set_attr(param, "requantization_source", true);
    param.detach().copy_(loaded);
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor w = layer.get("weight");
    at::Tensor scale = w.abs().max().clamp_min(1e-8) / 127.0;
    replace_parameter(layer, "qweight", (w / scale).round().clamp(-127, 127).to(at::kChar));
    refill_derived(layer, "w_scale", scale.reshape({1}));
    replace_parameter(layer, "weight", at::empty({0}, w.options()));  // release the source
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("qweight").to(at::kFloat).t()) * layer.get("w_scale");
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
  std::vector<std::string> derived_names() const override { return {"w_scale"}; }
};

// A zero point folded into the weight, then emptied: the emptied parameter
// is not kernel-visible, and on a direct reload it keeps its storage for the
// next load.
class EmptiedWeight : public Backend {
 public:
  std::string name() const override { return "emptied_weight"; }
  std::string description() const override { return "zero_point folded into weight, then emptied"; }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {16, 64}, at::kFloat}, {"zero_point", {64}, at::kFloat}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor zp = layer.get("zero_point");
    replace_parameter(layer, "weight", layer.get("weight") - zp);
    replace_parameter(layer, "zero_point", at::empty({0}, zp.options()));
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("weight").t());
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
};

// Negative control: rebinds the weight to a fresh contiguous copy on every
// post-processing instead of using replace_parameter.
class FreshCopyControl : public Backend {
 public:
  std::string name() const override { return "neg_fresh_copy"; }
  std::string description() const override {
    return "negative control: weight rebound to a fresh .contiguous() copy each load";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {16, 64}, at::kFloat}});
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor old = layer.get("weight");
    at::Tensor fresh = make_parameter(old.t().contiguous().t().clone());
    set_weight_attrs(fresh, AttrMap{{"weight_loader", *find_attr(old, "weight_loader")},
                                    {"_ckpt", *find_attr(old, "_ckpt")}});
    layer.set("weight", fresh);
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("weight").t());
  }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "weight"; }
};

// Negative control: reallocates a derived tensor on every post-processing
// instead of refilling it.
class ReallocDerivedControl : public MlaDerived {
 public:
  std::string name() const override { return "neg_realloc_derived"; }
  std::string description() const override {
    return "negative control: W_UK reallocated each load instead of refilled";
  }
  void process_weights_after_loading(Layer& layer) const override {
    at::Tensor w = layer.get("kv_b_proj");
    layer.set_attribute("W_UK", w.narrow(0, 0, 32).t().contiguous());
    refill_derived(layer, "W_UV", w.narrow(0, 32, 32).clone());
  }
  bool negative_control() const override { return true; }
  std::string expected_violation() const override { return "W_UK"; }
};

// A convolution (CPU: oneDNN, which allocates and frees its own scratch
// through the CPU allocator) with a weight loaded in place.
class Conv2dInPlace : public Backend {
 public:
  std::string name() const override { return "conv2d_in_place"; }
  std::string description() const override {
    return "[8,4,3,3] conv weight and bias loaded in place, forward at::conv2d";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {8, 4, 3, 3}, at::kFloat}, {"bias", {8}, at::kFloat}});
  }
  void process_weights_after_loading(Layer&) const override {}
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::conv2d(x, layer.get("weight"), layer.get("bias"), /*stride=*/1, /*padding=*/1);
  }
  std::vector<int64_t> input_shape() const override { return {2, 4, 8, 8}; }
};

// Marlin-style workspace: allocated by the first forward and reused ever
// after. A graph is captured after warm-up, so the workspace is part of the
// capture and never moves: a correct layer.
class FirstForwardWorkspace : public Backend {
 public:
  std::string name() const override { return "first_forward_workspace"; }
  std::string description() const override {
    return "workspace allocated by the first forward, kept across reloads";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    return layer_with(device, {{"weight", {16, 64}, at::kFloat}});
  }
  void process_weights_after_loading(Layer&) const override {}
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    auto& self = const_cast<Layer&>(layer);  // a kernel's lazily made state
    if (!self.has("workspace")) self.set_attribute("workspace", at::zeros({8, 16}, x.options()));
    at::Tensor ws = self.get("workspace");
    at::mm_out(ws, x, layer.get("weight").t());
    return ws.clone();
  }
  std::vector<std::string> derived_names() const override { return {"workspace"}; }
  std::vector<int64_t> input_shape() const override { return {8, 64}; }
};

}  // namespace

RELOADSAFE_REGISTER_BACKEND(Conv2dInPlace);
RELOADSAFE_REGISTER_BACKEND(FirstForwardWorkspace);
RELOADSAFE_REGISTER_BACKEND(MarlinRepack);
RELOADSAFE_REGISTER_BACKEND(RocmRowPadding);
RELOADSAFE_REGISTER_BACKEND(TransposedWeight);
RELOADSAFE_REGISTER_BACKEND(MlaDerived);
RELOADSAFE_REGISTER_BACKEND(RetiredRenamed);
RELOADSAFE_REGISTER_BACKEND(OnlineRequant);
RELOADSAFE_REGISTER_BACKEND(EmptiedWeight);
RELOADSAFE_REGISTER_BACKEND(FreshCopyControl);
RELOADSAFE_REGISTER_BACKEND(ReallocDerivedControl);

}  // namespace reloadsafe::harness
