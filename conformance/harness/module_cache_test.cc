#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/module_cache.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace reloadsafe::harness {
namespace {

TEST(TensorMapCache, NamesItsTensorsByKeyUndeclared) {
  std::map<std::string, at::Tensor> map{{"(64, cpu)", at::arange(4)}, {"(8, cpu)", at::ones({2})}};
  TensorMapCache cache("_perm_cache", map);
  const auto tensors = cache.tensors();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "_perm_cache[(64, cpu)]");
  EXPECT_EQ(tensors[1].name, "_perm_cache[(8, cpu)]");
  EXPECT_FALSE(tensors[0].declared);
  EXPECT_TRUE(tensors[0].tensor.is_same(map.at("(64, cpu)")));
}

TEST(CachesStashed, EmptiesTheCachesAndPutsBackTheSameTensorsDroppingWhatWasAdded) {
  const at::Tensor kept = at::arange(4);
  std::map<std::string, at::Tensor> map{{"k", kept}};
  TensorMapCache cache("c", map);
  {
    CachesStashed stashed({&cache});
    EXPECT_TRUE(map.empty());
    map["k"] = at::zeros({4}, at::kLong);  // what a cold load made aside puts there
    map["other"] = at::ones({1});
    ASSERT_EQ(stashed.tensors().size(), 2u);
    EXPECT_EQ(stashed.tensors()[0].name, "c[k]");
    {
      CachesStashed nested({&cache});  // stashes nest
      EXPECT_TRUE(map.empty());
    }
    EXPECT_EQ(map.size(), 2u);
  }
  ASSERT_EQ(map.size(), 1u);
  EXPECT_TRUE(map.at("k").is_same(kept));
}

TEST(TensorMapCache, RestoreWithoutAStashIsRefused) {
  std::map<std::string, at::Tensor> map;
  TensorMapCache cache("c", map);
  EXPECT_THROW(cache.restore(), c10::Error);
}

}  // namespace
}  // namespace reloadsafe::harness
