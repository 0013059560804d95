#include "utils/tensor_attrs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

namespace reloadsafe {
namespace {

TEST(TensorAttrs, BelongToTheObjectAndSurviveSetData) {
  at::Tensor p = make_parameter(at::zeros({4}, at::kByte));
  set_attr(p, "is_shuffled", true);
  at::Tensor handle = p;  // same object
  EXPECT_TRUE(attr_truthy(handle, "is_shuffled"));
  p.set_data(at::zeros({1}, at::kInt));  // `param.data = t`, dtype changes
  EXPECT_TRUE(attr_truthy(p, "is_shuffled"));
  EXPECT_TRUE(is_parameter(p));
}

TEST(TensorAttrs, NewObjectsStartEmpty) {
  at::Tensor p = make_parameter(at::zeros({4}));
  set_attr(p, "x", int64_t{1});
  struct Case {
    const char* name;
    at::Tensor t;
  } cases[] = {{"view", p.view({2, 2})},
               {"detach", p.detach()},
               {"clone", p.clone()},
               {"make_parameter", make_parameter(p)}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(has_attr(c.t, "x"));
  }
  EXPECT_FALSE(is_parameter(p.detach()));
}

TEST(TensorAttrs, Truthiness) {
  struct Case {
    AttrValue v;
    bool truthy;
  } cases[] = {{false, false},           {true, true},          {int64_t{0}, false},
               {int64_t{2}, true},       {0.0, false},          {std::string(), false},
               {std::string("a"), true}, {at::Tensor(), false}, {WeightLoader{"L", nullptr}, true}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(truthy(cases[i].v), cases[i].truthy);
  }
}

TEST(TensorAttrs, EntriesDieWithTheirTensors) {
  const size_t before = detail::attr_table_size();
  {
    at::Tensor t = at::zeros({2});
    set_attr(t, "k", true);
    EXPECT_EQ(detail::attr_table_size(), before + 1);
  }
  EXPECT_EQ(detail::attr_table_size(), before);
}

TEST(TensorAttrs, ConcurrentUseIsSafe) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([i] {
      for (int j = 0; j < 200; ++j) {
        at::Tensor t = at::zeros({1});
        set_attr(t, "i", int64_t{i});
        ASSERT_EQ(std::get<int64_t>(*find_attr(t, "i")), i);
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(SetWeightAttrs, NeverOverwritesAndFailsAtomically) {
  at::Tensor w = at::zeros({2});
  set_weight_attrs(w, AttrMap{{"output_dim", int64_t{0}}});
  EXPECT_THROW(set_weight_attrs(w, AttrMap{{"a_new_one", true}, {"output_dim", int64_t{1}}}),
               c10::Error);
  EXPECT_FALSE(has_attr(w, "a_new_one"));  // nothing set by the failed call
  EXPECT_EQ(std::get<int64_t>(*find_attr(w, "output_dim")), 0);
  EXPECT_THROW(set_weight_attrs(w, AttrMap{{"shape", int64_t{1}}}), c10::Error);
  set_weight_attrs(w, std::nullopt);  // nothing to do
  EXPECT_EQ(attrs(w).size(), 1u);
}

}  // namespace
}  // namespace reloadsafe
