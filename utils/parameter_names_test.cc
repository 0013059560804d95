#include "utils/parameter_names.h"

#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace reloadsafe {
namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.first);
  return names;
}

at::Tensor param(std::vector<int64_t> shape) {
  return make_parameter(at::zeros(shape));
}

TEST(IsLive, Decision) {
  at::Tensor retired = param({2});
  set_attr(retired, "retired", true);
  at::Tensor not_retired = param({2});
  set_attr(not_retired, "retired", false);
  struct Case {
    const char* name;
    at::Tensor t;
    bool live;
  } cases[] = {
      {"None", at::Tensor(), false}, {"empty", param({0}), false},
      {"retired", retired, false},   {"retired=false", not_retired, true},
      {"zero-dim", param({}), true}, {"plain", param({3, 2}), true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(is_live(c.t), c.live);
  }
}

TEST(GetLiveParam, ParametersThatAreNotLiveReadAsNone) {
  Layer layer;
  layer.register_param("w", param({2}));
  layer.register_param("empty", param({0}));
  layer.register_param("none", at::Tensor());
  layer.register_param("old", param({2}));
  retire_parameter(layer, "old");
  layer.set_attribute("plain_empty", at::zeros({0}));
  EXPECT_TRUE(get_live_param(layer, "w").defined());
  EXPECT_FALSE(get_live_param(layer, "empty").defined());
  EXPECT_FALSE(get_live_param(layer, "none").defined());
  EXPECT_FALSE(get_live_param(layer, "old").defined());
  EXPECT_FALSE(get_live_param(layer, "absent").defined());
  // Decision: plain tensor attributes are returned as they are.
  EXPECT_TRUE(get_live_param(layer, "plain_empty").defined());
  // Retired stays registered with its data.
  EXPECT_TRUE(layer.get("old").defined());
}

TEST(KernelParameters, LiveOnlyEachObjectOnceUnderItsRuntimeName) {
  Layer layer;
  layer.register_param("weight", param({4}));
  layer.register_param("scale", param({1}));
  layer.register_param("gone", at::Tensor());
  layer.register_param("empty", param({0}));
  move_parameter(layer, "weight", "qweight");  // weight is the checkpoint name
  EXPECT_EQ(names_of(layer.parameter_slots()),
            (std::vector<std::string>{"weight", "scale", "gone", "empty", "qweight"}));
  auto params = kernel_parameters(layer);
  EXPECT_EQ(names_of(params), (std::vector<std::string>{"scale", "qweight"}));
  EXPECT_TRUE(params[1].second.is_same(layer.get("weight")));
}

TEST(KernelParameters, WithoutRuntimeNameTheFirstNameWins) {
  Layer layer;
  at::Tensor w = param({4});
  layer.register_param("a", w);
  layer.register_param("b", w);  // aliased by hand, no runtime_name
  EXPECT_EQ(names_of(kernel_parameters(layer)), (std::vector<std::string>{"a"}));
}

TEST(KernelParameters, RetiringTheObjectHidesEveryName) {
  Layer layer;
  layer.register_param("weight", param({4}));
  move_parameter(layer, "weight", "qweight");
  retire_parameter(layer, "qweight");
  EXPECT_TRUE(kernel_parameters(layer).empty());
}

TEST(MoveParameter, BothNamesHoldOneObjectAndOneStorage) {
  Layer layer;
  at::Tensor w = param({4});
  layer.register_param("weight", w);
  move_parameter(layer, "weight", "qweight");
  EXPECT_TRUE(layer.get("qweight").is_same(w));
  EXPECT_EQ(std::get<std::string>(*find_attr(w, "runtime_name")), "qweight");
  // A replace that keeps the object updates both names.
  replace_parameter(layer, "qweight", at::ones({2}));
  EXPECT_TRUE(layer.get("weight").is_same(w));
  EXPECT_TRUE(at::equal(layer.get("weight"), at::ones({2})));
}

TEST(MoveParameter, OntoTheSameObjectIsANoOpRegistration) {
  Layer layer;
  at::Tensor w = param({4});
  layer.register_param("weight", w);
  move_parameter(layer, "weight", "qweight");
  move_parameter(layer, "weight", "qweight");
  EXPECT_EQ(layer.parameter_slots().size(), 2u);
  EXPECT_TRUE(layer.get("qweight").is_same(w));
}

TEST(MoveParameter, Errors) {
  Layer layer;
  layer.register_param("weight", param({4}));
  layer.register_param("other", param({4}));
  layer.register_param("none", at::Tensor());
  layer.register_buffer("buf", at::zeros({1}));
  layer.set_attribute("plain", at::zeros({1}));
  struct Case {
    const char* src;
    const char* dst;
  } cases[] = {
      {"absent", "x"},      // nothing to move
      {"none", "x"},        // None is not an object
      {"plain", "x"},       // not a parameter
      {"weight", "other"},  // another parameter is there
      {"weight", "buf"},    // a buffer is there
      {"weight", "plain"},  // a plain attribute is there
      {"weight", "a.b"},    // not a plain name
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.src) + " -> " + c.dst);
    EXPECT_THROW(move_parameter(layer, c.src, c.dst), c10::Error);
  }
  EXPECT_FALSE(has_attr(layer.get("weight"), "runtime_name"));
}

TEST(MoveParameter, OntoANoneSlotIsAllowed) {
  Layer layer;
  at::Tensor w = param({4});
  layer.register_param("weight", w);
  layer.register_param("qweight", at::Tensor());
  move_parameter(layer, "weight", "qweight");
  EXPECT_TRUE(layer.get("qweight").is_same(w));
}

TEST(RetireParameter, MarksAndKeepsTheData) {
  Layer layer;
  at::Tensor w = param({4});
  layer.register_param("weight", w);
  const void* ptr = w.data_ptr();
  retire_parameter(layer, "weight");
  EXPECT_TRUE(attr_truthy(w, "retired"));
  EXPECT_EQ(layer.get("weight").data_ptr(), ptr);
  EXPECT_THROW(retire_parameter(layer, "absent"), c10::Error);
  layer.register_param("none", at::Tensor());
  EXPECT_THROW(retire_parameter(layer, "none"), c10::Error);
}

// Decision: a submodule is refused (the reference marks the module object,
// which no utility reads); its parameters stay live.
TEST(RetireParameter, SubmoduleIsRefused) {
  Layer layer;
  auto inner = std::make_shared<Layer>("Inner");
  inner->register_param("weight", param({4}));
  layer.register_module("inner", inner);
  EXPECT_THROW(retire_parameter(layer, "inner"), c10::Error);
  EXPECT_TRUE(get_live_param(*inner, "weight").defined());
}

}  // namespace
}  // namespace reloadsafe
