// Checkpoints drawn from pools (Note [Checkpoints from a pool]): each draw
// is the seed's window of the pool, scaled as at::mul scales it, in a tensor
// of its own; the pools are only read.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/checkpoint_pools.h"

#include "conformance/harness/digest.h"
#include "conformance/harness/values.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/remainder.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// `values` times `scale` through ATen ops, as a draw scales them.
at::Tensor scaled_through_ops(const at::Tensor& values, double scale) {
  const at::ScalarType dtype = values.scalar_type();
  if (at::isComplexType(dtype)) return values.mul(scale);
  if (!at::isFloatingType(dtype)) return values.clone();
  if (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16)
    return values.mul(scale);
  return values.to(at::kFloat).mul(scale).to(dtype);
}

// What a draw from a given pool must equal: the window through ATen ops.
at::Tensor window_through_ops(const at::Tensor& pool, uint64_t seed) {
  const PoolWindow w = pool_window(seed);
  return scaled_through_ops(pool.as_strided(pool.sizes(), pool.strides(), w.offset), w.scale);
}

// What the draw of `name` (of `sizes`) from its dtype's pool must equal: the
// seed's window from the name's base on, wrapping at kSharedPoolElements,
// scaled through ATen ops.
at::Tensor expected_draw(const CheckpointPools& pools, const std::string& name,
                         c10::IntArrayRef sizes, uint64_t seed) {
  const PoolWindow w = pool_window(seed);
  const at::Tensor window = pools.pool(name).narrow(0, w.offset, kSharedPoolElements);
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  const at::Tensor index =
      (at::arange(n, at::kLong) + *pools.base(name)).remainder(kSharedPoolElements);
  // Gathered as bytes: index_select has no kernel for every dtype.
  const int64_t item = static_cast<int64_t>(window.element_size());
  const at::Tensor gathered = window.view(at::kByte)
                                  .view({kSharedPoolElements, item})
                                  .index_select(0, index)
                                  .view(window.scalar_type())
                                  .view(sizes);
  return scaled_through_ops(gathered, w.scale);
}

Checkpoint layouts_of(at::ScalarType dtype, std::vector<int64_t> sizes) {
  return {{"w", at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kMeta))}};
}

struct DtypeCase {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
};

const std::vector<DtypeCase>& dtype_cases() {
  static const std::vector<DtypeCase> cases = {
      {at::kFloat, {16, 60}},
      {at::kFloat, {3, 5, 7}},
      {at::kFloat, {0, 4}},
      {at::kDouble, {9, 4}},
      {at::kHalf, {33}},
      {at::kBFloat16, {8, 8}},
      {at::kFloat8_e4m3fn, {16, 16}},
      {at::kFloat8_e5m2, {7, 9}},
      {at::kFloat8_e4m3fnuz, {33}},
      {at::kFloat8_e5m2fnuz, {4, 4}},
      {at::kByte, {16, 64}},
      {at::kChar, {5, 5}},
      {at::kInt, {4, 64}},
      {at::kLong, {7}},
      {at::kBool, {6, 6}},
      {at::kComplexFloat, {4, 5}},
      // At ATen's grain size and above, through the op.
      {at::kFloat, {256, 160}},
      {at::kHalf, {32768}},
  };
  return cases;
}

const std::vector<uint64_t> kSeeds = {
    0, 1, 2, 1000004, 7920, uint64_t{1} << 40, std::numeric_limits<uint64_t>::max()};

TEST(CheckpointPools, EachDrawIsTheSeedsWindowScaledAsAtMulScalesIt) {
  for (const DtypeCase& c : dtype_cases()) {
    const CheckpointPools pools(layouts_of(c.dtype, c.sizes));
    const at::Tensor& pool = pools.pool("w");
    EXPECT_EQ(pool.numel(), kSharedPoolElements + kPoolWindows);
    for (uint64_t seed : kSeeds) {
      SCOPED_TRACE(std::string(c10::toString(c.dtype)) + " " + c10::str(c.sizes) + " seed " +
                   std::to_string(seed));
      const at::Tensor drawn = pools.draw(seed).at("w");
      EXPECT_EQ(drawn.sizes(), c10::IntArrayRef(c.sizes));
      EXPECT_EQ(drawn.scalar_type(), c.dtype);
      EXPECT_TRUE(drawn.device().is_cpu());
      EXPECT_TRUE(drawn.is_contiguous());
      EXPECT_TRUE(same_bytes(drawn, expected_draw(pools, "w", c.sizes, seed)));
      EXPECT_FALSE(drawn.storage().is_alias_of(pool.storage()));
    }
  }
}

TEST(CheckpointPools, APoolGivenAsATensorIsDrawnFromAsWell) {
  // A layout that is not a meta tensor is a pool already: here one whose
  // window cannot be read in place (transposed), and one that can.
  const at::Tensor base = at::randn({3000}).narrow(0, 0, 1200).view({40, 30});
  const std::vector<std::pair<std::string, at::Tensor>> given = {
      {"transposed", base.t()},
      {"dense", base.view({1200}).narrow(0, 0, 100).view({10, 10})},
  };
  for (const auto& [label, pool] : given) {
    SCOPED_TRACE(label);
    const CheckpointPools pools({{"w", pool}});
    for (uint64_t seed : {uint64_t{3}, uint64_t{99}}) {
      const at::Tensor drawn = pools.draw(seed).at("w");
      EXPECT_TRUE(drawn.is_contiguous());
      EXPECT_TRUE(at::equal(drawn, window_through_ops(pool, seed)));
      EXPECT_FALSE(drawn.storage().is_alias_of(pool.storage()));
    }
  }
}

TEST(CheckpointPools, EveryFloatChangesFromOneSeedToTheNext) {
  const CheckpointPools pools(layouts_of(at::kFloat, {64, 64}));
  at::Tensor last = pools.draw(1).at("w");
  for (uint64_t seed = 2; seed <= 40; ++seed) {
    const at::Tensor next = pools.draw(seed).at("w");
    EXPECT_EQ(at::eq(next, last).sum().item<int64_t>(), 0) << "seed " << seed;
    last = next;
  }
}

// A draw digests each tensor as it writes it (note_digest): what a
// CheckpointDigest of the drawn checkpoint takes is the digest of its bytes.
TEST(CheckpointPools, ADrawNotesEachTensorsDigest) {
  const CheckpointPools pools({{"a", layouts_of(at::kBFloat16, {3, kSharedPoolElements}).at("w")},
                               {"b", layouts_of(at::kFloat, {40, 30}).at("w")},
                               {"c", layouts_of(at::kChar, {9}).at("w")}});
  const Checkpoint drawn = pools.draw(11);
  Checkpoint copies;
  for (const auto& [name, t] : drawn) {
    EXPECT_TRUE(noted_digest(t).has_value()) << name;
    copies.emplace(name, t.clone());
  }
  EXPECT_EQ(CheckpointDigest(drawn).whole(), CheckpointDigest(copies).whole());
}

// A large tensor too, but for the chance few of a million elements whose
// two products round to the same float.
TEST(CheckpointPools, ALargeTensorChangesFromOneSeedToTheNext) {
  const CheckpointPools pools(layouts_of(at::kFloat, {1100, 1000}));
  at::Tensor last = pools.draw(1).at("w");
  for (uint64_t seed = 2; seed <= 20; ++seed) {
    const at::Tensor next = pools.draw(seed).at("w");
    EXPECT_LE(at::eq(next, last).sum().item<int64_t>(), 3) << "seed " << seed;
    last = next;
  }
}

// A tensor longer than the pool wraps (in stretches drawn in parallel);
// tensors of one dtype share one pool, each from its name's base, whatever
// else the layouts hold; the pools' bytes do not grow with the model.
TEST(CheckpointPools, ATensorLongerThanThePoolWrapsAndDtypesShareOnePool) {
  struct Row {
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
  };
  const Row rows[] = {
      {at::kFloat, {kSharedPoolElements - 1}},
      {at::kBFloat16, {3, kSharedPoolElements}},
      {at::kFloat8_e4m3fn, {2 * kSharedPoolElements + 5}},
      {at::kChar, {kSharedPoolElements + 7}},
      {at::kComplexFloat, {kSharedPoolElements + 3}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(std::string(c10::toString(row.dtype)) + " " + c10::str(row.sizes));
    const CheckpointPools pools({{"big", layouts_of(row.dtype, row.sizes).at("w")},
                                 {"small", layouts_of(row.dtype, {8}).at("w")}});
    EXPECT_TRUE(pools.pool("big").is_same(pools.pool("small")));
    EXPECT_NE(pools.base("big"), pools.base("small"));
    for (uint64_t seed : {uint64_t{0}, uint64_t{7920}}) {
      const at::Tensor drawn = pools.draw(seed).at("big");
      EXPECT_TRUE(drawn.is_contiguous());
      EXPECT_TRUE(same_bytes(drawn, expected_draw(pools, "big", row.sizes, seed)))
          << "seed " << seed;
    }
  }
  const CheckpointPools one({{"a", layouts_of(at::kFloat, {40, 30}).at("w")}});
  const CheckpointPools two({{"a", layouts_of(at::kFloat, {40, 30}).at("w")},
                             {"b", layouts_of(at::kFloat, {5000, 3000}).at("w")},
                             {"c", layouts_of(at::kHalf, {9}).at("w")}});
  EXPECT_TRUE(same_bytes(one.draw(3).at("a"), two.draw(3).at("a")));
  EXPECT_LT(two.nbytes(), 7 * (int64_t{1} << 20));  // a float pool and a half one
  // A given pool is not a dtype's.
  EXPECT_FALSE(CheckpointPools({{"w", at::randn({1100})}}).base("w").has_value());
}

TEST(CheckpointPools, DrawsAreRepeatableNewTensorsAndLeaveThePoolsAlone) {
  const std::vector<std::string> names = {"a", "b"};
  const CheckpointPools pools({{"a", layouts_of(at::kBFloat16, {8, 16}).at("w")},
                               {"b", layouts_of(at::kByte, {32}).at("w")}});
  std::vector<at::Tensor> before;
  for (const std::string& name : names) before.push_back(pools.pool(name).clone());
  const Checkpoint first = pools.draw(5);
  const Checkpoint again = pools.draw(5);
  ASSERT_EQ(first.size(), 2u);
  for (const auto& [name, t] : first) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(same_bytes(t, again.at(name)));
    EXPECT_FALSE(t.storage().is_alias_of(again.at(name).storage()));
  }
  size_t i = 0;
  for (const std::string& name : names) {
    EXPECT_TRUE(same_bytes(before[i++], pools.pool(name))) << name;
  }
  // The same layouts give the same pools.
  const CheckpointPools redrawn({{"a", layouts_of(at::kBFloat16, {8, 16}).at("w")},
                                 {"b", layouts_of(at::kByte, {32}).at("w")}});
  for (const std::string& name : names) {
    EXPECT_TRUE(same_bytes(pools.pool(name), redrawn.pool(name))) << name;
  }
}

// Integers span int8's range, both signs where the dtype has them, clipped
// to the dtype's; booleans both values: the same pools a Python subject
// draws (python/tests/test_check_costs.py holds it to this generator).
TEST(CheckpointPools, IntegerAndBooleanPoolsSpanTheirRanges) {
  struct Row {
    at::ScalarType dtype;
    int64_t low, high;
  };
  for (const Row& row :
       {Row{at::kChar, -128, 127}, Row{at::kByte, 0, 127}, Row{at::kInt, -128, 127},
        Row{at::kLong, -128, 127}, Row{at::kBool, 0, 1}}) {
    SCOPED_TRACE(c10::toString(row.dtype));
    const at::Tensor pool = CheckpointPools(layouts_of(row.dtype, {4096})).pool("w");
    const at::Tensor values = pool.to(at::kLong);
    EXPECT_EQ(values.min().item<int64_t>(), row.low);
    EXPECT_EQ(values.max().item<int64_t>(), row.high);
  }
  EXPECT_THROW(integer_range(at::kFloat), c10::Error);
}

TEST(CheckpointPools, WindowsStayInTheirRanges) {
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    const PoolWindow w = pool_window(seed);
    ASSERT_GE(w.offset, 0) << seed;
    ASSERT_LT(w.offset, kPoolWindows) << seed;
    ASSERT_GE(w.scale, 0.5) << seed;
    ASSERT_LT(w.scale, 2.0) << seed;
  }
}

}  // namespace
}  // namespace reloadsafe::harness
