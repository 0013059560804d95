// Checkpoints drawn from pools (Note [Checkpoints from a pool]): each draw
// is the seed's window of the pool, scaled as at::mul scales it, in a tensor
// of its own; the pools are only read.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/checkpoint_pools.h"

#include "conformance/harness/values.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// What a draw must equal: the window through ATen ops.
at::Tensor window_through_ops(const at::Tensor& pool, uint64_t seed) {
  const PoolWindow w = pool_window(seed);
  const at::Tensor window = pool.as_strided(pool.sizes(), pool.strides(), w.offset);
  const at::ScalarType dtype = pool.scalar_type();
  if (at::isComplexType(dtype)) return window.mul(w.scale);
  if (!at::isFloatingType(dtype)) return window.clone();
  if (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16)
    return window.mul(w.scale);
  return window.to(at::kFloat).mul(w.scale).to(dtype);
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
    const Checkpoint pools = checkpoint_pools(layouts_of(c.dtype, c.sizes));
    const at::Tensor& pool = pools.at("w");
    for (uint64_t seed : kSeeds) {
      SCOPED_TRACE(std::string(c10::toString(c.dtype)) + " " + c10::str(c.sizes) + " seed " +
                   std::to_string(seed));
      const at::Tensor drawn = draw_from_pools(pools, seed).at("w");
      EXPECT_EQ(drawn.sizes(), pool.sizes());
      EXPECT_EQ(drawn.scalar_type(), c.dtype);
      EXPECT_TRUE(drawn.device().is_cpu());
      EXPECT_TRUE(drawn.is_contiguous());
      EXPECT_TRUE(same_bytes(drawn, window_through_ops(pool, seed)));
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
    const Checkpoint pools = checkpoint_pools({{"w", pool}});
    for (uint64_t seed : {uint64_t{3}, uint64_t{99}}) {
      const at::Tensor drawn = draw_from_pools(pools, seed).at("w");
      EXPECT_TRUE(drawn.is_contiguous());
      EXPECT_TRUE(at::equal(drawn, window_through_ops(pool, seed)));
      EXPECT_FALSE(drawn.storage().is_alias_of(pool.storage()));
    }
  }
}

TEST(CheckpointPools, EveryFloatChangesFromOneSeedToTheNext) {
  const Checkpoint pools = checkpoint_pools(layouts_of(at::kFloat, {64, 64}));
  at::Tensor last = draw_from_pools(pools, 1).at("w");
  for (uint64_t seed = 2; seed <= 40; ++seed) {
    const at::Tensor next = draw_from_pools(pools, seed).at("w");
    EXPECT_EQ(at::eq(next, last).sum().item<int64_t>(), 0) << "seed " << seed;
    last = next;
  }
}

TEST(CheckpointPools, DrawsAreRepeatableNewTensorsAndLeaveThePoolsAlone) {
  const Checkpoint pools = checkpoint_pools({{"a", layouts_of(at::kBFloat16, {8, 16}).at("w")},
                                             {"b", layouts_of(at::kByte, {32}).at("w")}});
  std::vector<Snapshot> before;
  for (const auto& [name, pool] : pools) before.emplace_back(pool);
  const Checkpoint first = draw_from_pools(pools, 5);
  const Checkpoint again = draw_from_pools(pools, 5);
  ASSERT_EQ(first.size(), 2u);
  for (const auto& [name, t] : first) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(same_bytes(t, again.at(name)));
    EXPECT_FALSE(t.storage().is_alias_of(again.at(name).storage()));
  }
  size_t i = 0;
  for (const auto& [name, pool] : pools) EXPECT_TRUE(before[i++].unchanged(pool)) << name;
  // The same layouts give the same pools.
  const Checkpoint redrawn = checkpoint_pools({{"a", layouts_of(at::kBFloat16, {8, 16}).at("w")},
                                               {"b", layouts_of(at::kByte, {32}).at("w")}});
  for (const auto& [name, pool] : pools) EXPECT_TRUE(same_bytes(pool, redrawn.at(name))) << name;
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
    const at::Tensor pool = checkpoint_pools(layouts_of(row.dtype, {4096})).at("w");
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
