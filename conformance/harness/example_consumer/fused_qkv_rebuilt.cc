// The fused QKV projection of fused_qkv.cc written the obvious way: the fused
// weight is a new tensor after every load. A graph captured after the cold
// load would read the first checkpoint's weights forever; the harness flags
// `qkv` on every reload, and rebuilt_reload_test fails.
#include "conformance/harness/backend.h"

#include <ATen/ATen.h>

namespace my_kernels {
namespace {

using reloadsafe::Layer;
using reloadsafe::harness::Backend;

class FusedQkvRebuilt : public Backend {
 public:
  std::string name() const override { return "fused_qkv_rebuilt"; }
  std::string description() const override {
    return "q/k/v fused into a new qkv tensor on every load (loses its address)";
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
    layer.set_attribute(
        "qkv", at::cat({layer.get("q_proj"), layer.get("k_proj"), layer.get("v_proj")}, 0));
  }
  at::Tensor forward(const Layer& layer, const at::Tensor& x) const override {
    return at::mm(x, layer.get("qkv").t());
  }
  std::vector<int64_t> input_shape() const override { return {4, 32}; }
  std::vector<std::string> derived_names() const override { return {"qkv"}; }
};

RELOADSAFE_REGISTER_BACKEND(FusedQkvRebuilt);

}  // namespace
}  // namespace my_kernels
