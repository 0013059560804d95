#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

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
  } cases[] = {{false, false},
               {true, true},
               {int64_t{0}, false},
               {int64_t{2}, true},
               {0.0, false},
               {std::string(), false},
               {std::string("a"), true},
               {at::Tensor(), false},
               {WeightLoader{"L", nullptr}, true},
               // A tensor is its one value, as `bool(tensor)` in Python.
               {at::zeros({1}, at::kLong), false},
               {at::ones({1}, at::kLong), true},
               {at::scalar_tensor(0.0), false},
               {at::scalar_tensor(2.5), true},
               {at::ones({1, 1}, at::kBool), true}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(truthy(cases[i].v), cases[i].truthy);
  }
}

TEST(TensorAttrs, TruthOfATensorWithoutOneValueIsAnError) {
  // Python: "Boolean value of Tensor with no values / more than one value is
  // ambiguous", and a meta tensor has no value to read.
  const at::Tensor ambiguous[] = {at::zeros({0}), at::zeros({2}),
                                  at::empty({1}, at::TensorOptions().device(at::kMeta))};
  for (const at::Tensor& t : ambiguous) {
    SCOPED_TRACE(t.sizes());
    EXPECT_THROW(truthy(AttrValue(t)), c10::Error);
    at::Tensor w = make_parameter(at::zeros({2}));
    set_attr(w, "retired", t);
    EXPECT_THROW(attr_truthy(w, "retired"), c10::Error);
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

// Every thread reads and writes the attributes of one shared tensor object,
// the same key included, while others change them. find_attr returns a copy
// taken under the table's lock, so what a thread reads is always a value some
// thread wrote, never a torn or freed one. Run under ThreadSanitizer by CI
// (tools/test.sh, --config=tsan), which reports any unsynchronised access.
TEST(TensorAttrs, ConcurrentUseOfOneTensorIsSafe) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  const at::Tensor shared = make_parameter(at::zeros({1}));
  std::vector<std::thread> threads;
  std::vector<int> bad(kThreads, 0);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([i, &shared, &bad] {
      const std::string own = "k" + std::to_string(i);
      for (int j = 0; j < kRounds; ++j) {
        set_attr(shared, "shared", std::string(64, static_cast<char>('a' + i)));
        set_attr(shared, own, int64_t{j});
        // Another thread may have erased "shared" since; if it is there, it
        // is one whole value some thread wrote.
        const std::optional<AttrValue> v = find_attr(shared, "shared");
        const auto* s = v ? std::get_if<std::string>(&*v) : nullptr;
        if (v && (s == nullptr || s->size() != 64 || (*s)[0] < 'a' || (*s)[0] >= 'a' + kThreads ||
                  s->find_first_not_of((*s)[0]) != std::string::npos)) {
          ++bad[i];
        }
        const std::optional<AttrValue> mine = find_attr(shared, own);
        if (!mine || std::get<int64_t>(*mine) != j) ++bad[i];
        if (!is_parameter(shared) || attrs(shared).count(own) != 1) ++bad[i];
        if (j % 3 == 0) erase_attr(shared, "shared");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(bad[i], 0);
    EXPECT_EQ(std::get<int64_t>(*find_attr(shared, "k" + std::to_string(i))), kRounds - 1);
  }
}

TEST(SetWeightAttrs, NeverOverwritesAndFailsAtomically) {
  at::Tensor w = at::zeros({2});
  set_weight_attrs(w, AttrMap{{"output_dim", int64_t{0}}});
  EXPECT_THROW(set_weight_attrs(w, AttrMap{{"a_new_one", true}, {"output_dim", int64_t{1}}}),
               c10::Error);
  EXPECT_FALSE(has_attr(w, "a_new_one"));  // nothing set by the failed call
  EXPECT_EQ(std::get<int64_t>(*find_attr(w, "output_dim")), 0);
  set_weight_attrs(w, std::nullopt);  // nothing to do
  set_weight_attrs(w, AttrMap{});     // nothing to do
  EXPECT_EQ(attrs(w).size(), 1u);
}

// What counts as an existing attribute: a parameter's `weight_loader`
// property answers from its `_weight_loader` field (vLLM's parameter classes;
// replace_parameter reads it the same way, R44/R45), so on a parameter with
// `_weight_loader` setting `weight_loader` is refused like any existing
// attribute. A plain tensor's `_weight_loader` is only a field.
TEST(SetWeightAttrs, ExistingAttributesIncludeAParametersBackedLoader) {
  struct Row {
    const char* name;
    bool parameter;
    const char* existing;  // attribute the weight has before the call
    const char* key;       // attribute the call sets
    bool refused;
  } rows[] = {
      {"parameter with _weight_loader: weight_loader", true, "_weight_loader", "weight_loader",
       true},
      {"parameter with _weight_loader: _weight_loader", true, "_weight_loader", "_weight_loader",
       true},
      {"parameter with weight_loader: weight_loader", true, "weight_loader", "weight_loader", true},
      {"parameter with weight_loader: _weight_loader", true, "weight_loader", "_weight_loader",
       false},
      {"parameter with _weight_loader: output_dim", true, "_weight_loader", "output_dim", false},
      {"parameter with output_dim: weight_loader", true, "output_dim", "weight_loader", false},
      {"plain tensor with _weight_loader: weight_loader", false, "_weight_loader", "weight_loader",
       false},
      {"plain tensor with weight_loader: weight_loader", false, "weight_loader", "weight_loader",
       true},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    at::Tensor w = r.parameter ? make_parameter(at::zeros({2})) : at::zeros({2});
    set_attr(w, r.existing, WeightLoader{"backing", nullptr});
    const AttrMap call{{r.key, WeightLoader{"new", nullptr}}, {"a_new_one", true}};
    if (r.refused) {
      EXPECT_THROW(set_weight_attrs(w, call), c10::Error);
      EXPECT_EQ(attrs(w).size(), 1u);  // a refused call sets nothing
      EXPECT_EQ(std::get<WeightLoader>(*find_attr(w, r.existing)).name, "backing");
    } else {
      EXPECT_NO_THROW(set_weight_attrs(w, call));
      EXPECT_EQ(std::get<WeightLoader>(*find_attr(w, r.key)).name, "new");
      EXPECT_TRUE(attr_truthy(w, "a_new_one"));
      EXPECT_EQ(std::get<WeightLoader>(*find_attr(w, r.existing)).name, "backing");
    }
  }
}

// `hasattr(weight, key)` is true for every attribute, method and property of
// torch.Tensor, so the reference refuses all of them (not only the data
// properties).
TEST(SetWeightAttrs, RefusesEveryNameATensorAnswersTo) {
  for (const char* name : {"shape", "data", "size", "is_leaf", "stride", "T", "mT", "grad_fn",
                           "copy_", "__class__", "__dict__", "requires_grad", "untyped_storage"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(is_tensor_member_name(name));
    at::Tensor w = at::zeros({2});
    EXPECT_THROW(set_weight_attrs(w, AttrMap{{name, int64_t{1}}}), c10::Error);
    EXPECT_TRUE(attrs(w).empty());
  }
  for (const char* name : {"weight_loader", "_weight_loader", "output_dim", "is_shuffled",
                           "retired", "runtime_name", "_ckpt", "Shape", "sizes", ""}) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(is_tensor_member_name(name));
  }
}

// The reference returns on None and loops over nothing on {}: neither looks
// at the weight, so a None weight is fine there.
TEST(SetWeightAttrs, NothingToSetIsANoOpEvenWithoutAWeight) {
  EXPECT_NO_THROW(set_weight_attrs(at::Tensor(), std::nullopt));
  EXPECT_NO_THROW(set_weight_attrs(at::Tensor(), AttrMap{}));
  EXPECT_THROW(set_weight_attrs(at::Tensor(), AttrMap{{"output_dim", int64_t{0}}}), c10::Error);
}

TEST(TensorAttrs, FindAttrReturnsACopy) {
  at::Tensor w = at::zeros({2});
  EXPECT_FALSE(find_attr(w, "x").has_value());
  EXPECT_FALSE(find_attr(at::Tensor(), "x").has_value());
  set_attr(w, "x", std::string("before"));
  const std::optional<AttrValue> v = find_attr(w, "x");
  set_attr(w, "x", std::string("after"));
  erase_attr(w, "x");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(std::get<std::string>(*v), "before");
}

}  // namespace
}  // namespace reloadsafe
