#include "utils/layer.h"

#include "utils/parameter_names.h"
#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace reloadsafe {
namespace {

TEST(Layer, GetattrFindsEachTable) {
  Layer layer;
  layer.register_param("w", make_parameter(at::zeros({2})));
  layer.register_buffer("b", at::zeros({3}));
  layer.set_attribute("a", at::zeros({4}));
  layer.register_module("sub", std::make_shared<Layer>());
  struct Case {
    const char* name;
    SlotKind kind;
    int64_t numel;  // -1: undefined tensor
  } cases[] = {
      {"w", SlotKind::kParameter, 2}, {"b", SlotKind::kBuffer, 3},
      {"a", SlotKind::kAttribute, 4}, {"sub", SlotKind::kSubmodule, -1},
      {"x", SlotKind::kAbsent, -1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(layer.kind(c.name), c.kind);
    at::Tensor t = layer.get(c.name);
    EXPECT_EQ(t.defined() ? t.numel() : -1, c.numel);
  }
}

TEST(Layer, SetattrFollowsModuleRules) {
  Layer layer;
  at::Tensor p = make_parameter(at::zeros({2}));
  layer.set_attribute("w", at::zeros({1}));
  layer.set("w", p);  // a parameter replaces the plain attribute
  EXPECT_EQ(layer.kind("w"), SlotKind::kParameter);
  EXPECT_THROW(layer.set("w", at::zeros({2})), c10::Error);  // plain tensor onto a parameter
  layer.set("w", at::Tensor());                              // None keeps the slot
  EXPECT_EQ(layer.kind("w"), SlotKind::kParameter);
  EXPECT_FALSE(layer.get("w").defined());
  layer.register_module("sub", std::make_shared<Layer>());
  layer.set("sub", p);
  EXPECT_EQ(layer.kind("sub"), SlotKind::kParameter);
  layer.register_buffer("b", at::zeros({3}));
  EXPECT_THROW(layer.set("b", at::ones({3})), c10::Error);
  EXPECT_THROW(layer.register_param("", p), c10::Error);
}

TEST(Layer, NamesCanAliasOneObjectAndModuleSeesIt) {
  Layer layer;
  at::Tensor p = make_parameter(at::zeros({2}));
  layer.register_param("a", p);
  layer.register_param("b", p);
  EXPECT_TRUE(layer.get("a").is_same(layer.get("b")));
  // LibTorch lists the object under both names, as the notes warn.
  EXPECT_EQ(layer.named_parameters(false).size(), 2u);
}

// A backend author's module: registers its parameter through LibTorch's own
// API, holds a LibTorch submodule, and still works with the utilities.
struct UserModule : Layer {
  UserModule() {
    weight = register_parameter("weight", at::zeros({4, 4}), /*requires_grad=*/false);
    proj = register_module("proj", torch::nn::Linear(4, 4));
  }
  at::Tensor weight;
  torch::nn::Linear proj{nullptr};
};

TEST(Layer, UserModuleRegisteredThroughLibTorchWorksWithTheUtilities) {
  UserModule m;
  const void* ptr = m.weight.data_ptr();
  EXPECT_TRUE(is_parameter(m.get("weight")));
  replace_parameter(m, "weight", at::ones({2, 4}));
  // The member handle is the same object, so it sees the placed data.
  EXPECT_EQ(m.weight.data_ptr(), ptr);
  EXPECT_TRUE(at::equal(m.weight, at::ones({2, 4})));
  EXPECT_EQ(m.parameters().size(), 3u);  // weight, proj.weight, proj.bias
  EXPECT_EQ(kernel_parameters(m).size(), 1u);
}

// Parameters are marked when they are registered; reading a layer (get,
// parameter_slots) never writes the attribute table.
TEST(Layer, RegistrationMarksAndReadingChangesNothing) {
  UserModule m;
  EXPECT_TRUE(is_parameter(m.weight));  // marked by register_parameter itself
  Layer layer;
  at::Tensor plain = at::zeros({2});
  layer.set_attribute("plain", plain);
  const size_t before = detail::attr_table_size();
  const Layer& reader = layer;
  EXPECT_TRUE(reader.get("plain").is_same(plain));
  EXPECT_TRUE(reader.parameter_slots().empty());
  EXPECT_FALSE(is_parameter(reader.get("plain")));
  EXPECT_EQ(detail::attr_table_size(), before);
}

TEST(GetMoeExpertMapping, FirstModuleWithTheMethod) {
  auto model = std::make_shared<Layer>("Model");
  auto dense = std::make_shared<Layer>("Dense");
  auto moe = std::make_shared<Layer>("Moe");
  auto moe2 = std::make_shared<Layer>("Moe2");
  moe->get_expert_mapping = [] {
    return ExpertMapping{{"experts.w13_weight", "experts.0.gate_proj.", 0, "w1"}};
  };
  moe2->get_expert_mapping = [] { return ExpertMapping{}; };
  model->register_module("dense", dense);
  model->register_module("moe", moe);
  model->register_module("moe2", moe2);
  ExpertMapping mapping = get_moe_expert_mapping(*model);
  ASSERT_EQ(mapping.size(), 1u);
  EXPECT_EQ(std::get<2>(mapping[0]), 0);
  // The model's own method comes first.
  model->get_expert_mapping = [] { return ExpertMapping(2); };
  EXPECT_EQ(get_moe_expert_mapping(*model).size(), 2u);
}

TEST(GetMoeExpertMapping, NoneIsAnError) {
  Layer model;
  model.register_module("dense", std::make_shared<Layer>());
  model.register_module("linear", torch::nn::Linear(2, 2));
  EXPECT_THROW(get_moe_expert_mapping(model), c10::Error);
}

}  // namespace
}  // namespace reloadsafe
