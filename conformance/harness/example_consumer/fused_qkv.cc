// A backend from outside reloadsafe: a fused QKV projection. The checkpoint
// holds q_proj, k_proj and v_proj; post-processing concatenates them into one
// [48, 32] weight that the kernel reads. The fused weight is derived, so it is
// refilled in place on every reload (refill_derived): a CUDA graph captured
// after the cold load keeps reading the right memory.
#include "conformance/harness/backend.h"
#include "utils/replace_parameter.h"

#include <ATen/ATen.h>

namespace my_kernels {
namespace {

using reloadsafe::Layer;
using reloadsafe::harness::Backend;

class FusedQkv : public Backend {
 public:
  std::string name() const override { return "fused_qkv"; }
  std::string description() const override {
    return "q/k/v [16,32] each, fused into qkv [48,32] refilled in place";
  }
  std::shared_ptr<Layer> create_layer(const c10::Device& device) const override {
    auto layer = std::make_shared<Layer>();
    for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
      layer->register_param(
          name, reloadsafe::harness::make_checkpoint_param({16, 32}, at::kFloat, device));
    }
    return layer;
  }
  void process_weights_after_loading(Layer& layer) const override {
    reloadsafe::refill_derived(
        layer, "qkv", at::cat({layer.get("q_proj"), layer.get("k_proj"), layer.get("v_proj")}, 0));
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("qkv").t());
  }
  std::vector<int64_t> input_shape() const override { return {4, 32}; }
  std::vector<std::string> derived_names() const override { return {"qkv"}; }
};

RELOADSAFE_REGISTER_BACKEND(FusedQkv);

}  // namespace
}  // namespace my_kernels
