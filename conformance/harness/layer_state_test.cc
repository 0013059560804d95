#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/layer_state.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

TEST(FormatNumber, PrintsAsPythonDoes) {
  struct Row {
    NamedNumber n;
    std::string text;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const Row rows[] = {
      {{"i", 3, true}, "3"},
      {{"i", -12, true}, "-12"},
      {{"f", 0.5, false}, "0.5"},
      {{"f", 1.0, false}, "1.0"},
      {{"f", 0.1, false}, "0.1"},
      {{"f", 1.0 / 3.0, false}, "0.3333333333333333"},
      {{"f", 0.018798828125, false}, "0.018798828125"},
      {{"f", 1e20, false}, "1e+20"},
      {{"f", nan, false}, "nan"},
      {{"f", inf, false}, "inf"},
      {{"f", -inf, false}, "-inf"},
  };
  for (const Row& row : rows) EXPECT_EQ(format_number(row.n), row.text) << row.n.value;
}

// Each row: the live side's value of one name against the cold side's.
TEST(StateDifferences, NamesWhatDiffersAndSaysHow) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Row {
    const char* name;
    at::Tensor live, cold;
    std::string after;  ///< empty: equal
  };
  const Row rows[] = {
      {"equal", at::ones({3}), at::ones({3}), ""},
      {"within tolerance", at::ones({3}), at::ones({3}) + 1e-7, ""},
      {"off", at::ones({3}), at::zeros({3}), "max |diff| 1"},
      {"nan where numbers", at::tensor({1.0, nan}), at::tensor({1.0, 2.0}),
       "1 NaN where a cold load has numbers"},
      {"nan on both sides", at::tensor({1.0, nan}), at::tensor({1.0, nan}), ""},
      {"nan on both sides, numbers off", at::tensor({1.0, nan}), at::tensor({2.0, nan}),
       "max |diff| 1"},
      // Float and double go through all_close's one pass, contiguous or not;
      // other floating dtypes through at::allclose. Both give one verdict.
      {"double within tolerance", at::ones({3}, at::kDouble), at::ones({3}, at::kDouble) + 1e-7,
       ""},
      {"double off", at::ones({3}, at::kDouble), at::ones({3}, at::kDouble) + 1e-3,
       "max |diff| 0.001"},
      {"transposed equal", at::eye(3).t(), at::eye(3), ""},
      {"transposed off", at::arange(6, at::kFloat).view({2, 3}).t(),
       at::arange(6, at::kFloat).view({3, 2}), "max |diff| 2"},
      {"infinities equal", at::tensor({inf, -inf}), at::tensor({inf, -inf}), ""},
      {"infinities off", at::tensor({inf, 1.0}), at::tensor({-inf, 1.0}), "max |diff| inf"},
      {"bfloat16 equal", at::ones({3}, at::kBFloat16), at::ones({3}, at::kBFloat16), ""},
      {"bfloat16 off", at::ones({3}, at::kBFloat16), at::zeros({3}, at::kBFloat16), "max |diff| 1"},
      {"integers", at::tensor({1, 2, 3}), at::tensor({1, 5, 6}), "2 of 3 elements differ"},
      {"another shape", at::ones({2, 2}), at::ones({4}), "float32[2, 2]"},
      {"another dtype", at::ones({4}, at::kHalf), at::ones({4}), "float16[4]"},
      {"bool", at::tensor({1, 0}).to(at::kBool), at::ones({2}, at::kBool),
       "1 of 2 elements differ"},
      // No CPU arithmetic on these (an FP8 weight under compare_state).
      {"float8 equal", at::ones({4}).to(at::kFloat8_e4m3fn), at::ones({4}).to(at::kFloat8_e4m3fn),
       ""},
      {"float8 off", at::ones({4}).to(at::kFloat8_e4m3fn), at::zeros({4}).to(at::kFloat8_e4m3fn),
       "max |diff| 1"},
      {"bits off", at::ones({4}, at::kByte).view(at::kBits8),
       at::zeros({4}, at::kByte).view(at::kBits8), "bytes differ"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const std::vector<StateDifference> d =
        state_differences({{{"t", row.live, true}}, {}}, {{{"t", row.cold, true}}, {}});
    if (row.after.empty()) {
      EXPECT_TRUE(d.empty()) << d.front().after;
      continue;
    }
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].name, "t");
    EXPECT_EQ(d[0].after, row.after);
  }
}

// A sparse tensor is compared by its parts, named as Python's walk names them.
TEST(StateDifferences, ASparseTensorIsComparedByItsParts) {
  const at::Tensor dense = at::eye(4) * at::arange(1.0, 5.0);
  const at::Tensor stale = (at::eye(4) * 2.0).to_sparse();
  EXPECT_TRUE(state_differences({{{"mask", dense.to_sparse(), true}}, {}},
                                {{{"mask", dense.to_sparse(), true}}, {}})
                  .empty());
  const std::vector<StateDifference> d =
      state_differences({{{"mask", stale, true}}, {}}, {{{"mask", dense.to_sparse(), true}}, {}});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].name, "mask._values");
  EXPECT_EQ(d[0].after, "max |diff| 2");
  const std::vector<StateDifference> csr =
      state_differences({{{"w", (dense * 2.0).to_sparse_csr(), true}}, {}},
                        {{{"w", dense.to_sparse_csr(), true}}, {}});
  ASSERT_EQ(csr.size(), 1u);
  EXPECT_EQ(csr[0].name, "w.values");
}

TEST(StateDifferences, OnlyNamesBothSidesHoldAreComparedTensorsFirst) {
  LayerState live{{{"w", at::ones({3}), true},
                   {"workspace", at::ones({2}), true},  // made by a forward: the cold side has none
                   {"empty", at::empty({0}), true},
                   {"meta", at::empty({2}, at::kMeta), true}},
                  {{"n", 1.5, false}, {"k", 4, true}, {"same", 0.25, false}}};
  LayerState cold{{{"w", at::zeros({3}), true},
                   {"empty", at::empty({0}), true},
                   {"meta", at::empty({2}, at::kMeta), true}},
                  {{"n", 2.5, false}, {"k", 4, true}, {"same", 0.25 + 1e-9, false}}};
  const std::vector<StateDifference> d = state_differences(live, cold);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "w");
  EXPECT_EQ(d[0].before, "cold load float32[3]");
  EXPECT_EQ(d[0].after, "max |diff| 1");
  EXPECT_EQ(d[1].name, "n");
  EXPECT_EQ(d[1].before, "cold load 2.5");
  EXPECT_EQ(d[1].after, "1.5");
}

TEST(StateDifferences, ComparingWritesNeitherSide) {
  at::Tensor live = at::tensor({1.0, 2.0});
  at::Tensor cold = at::tensor({1.0, 3.0});
  const void* live_data = live.data_ptr();
  EXPECT_EQ(state_differences({{{"t", live, true}}, {}}, {{{"t", cold, true}}, {}}).size(), 1u);
  EXPECT_EQ(live.data_ptr(), live_data);
  EXPECT_TRUE(at::equal(live, at::tensor({1.0, 2.0})));
  EXPECT_TRUE(at::equal(cold, at::tensor({1.0, 3.0})));
}

}  // namespace
}  // namespace reloadsafe::harness
