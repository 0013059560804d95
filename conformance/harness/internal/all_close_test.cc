#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/internal/all_close.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

constexpr double kTol = 1e-5;

// The answer must be at::allclose's (equal_nan=true) wherever all_close gives one.
void expect_as_allclose(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  SCOPED_TRACE(what);
  const std::optional<bool> got = all_close(a, b, kTol, kTol);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, at::allclose(a, b, kTol, kTol, /*equal_nan=*/true));
}

TEST(AllClose, AgreesWithAllcloseElementByElement) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::string name;
    float x, y;
    bool close;
  };
  const Case cases[] = {
      {"equal", 1.5f, 1.5f, true},
      {"within atol at zero", 0.0f, 9e-6f, true},
      {"beyond atol at zero", 0.0f, 2e-5f, false},
      {"within rtol of b", 1000.0f, 1000.005f, true},
      {"beyond rtol of b", 1000.0f, 1000.05f, false},
      {"equal infinities", inf, inf, true},
      {"opposite infinities", inf, -inf, false},
      {"infinity and a number", inf, 1.0f, false},
      {"both NaN", nan, nan, true},
      {"NaN and a number", nan, 1.0f, false},
      {"a number and NaN", 1.0f, nan, false},
  };
  for (const Case& c : cases) {
    at::Tensor a = at::full({3}, 0.25f);
    at::Tensor b = at::full({3}, 0.25f);
    a.select(0, 1).fill_(c.x);
    b.select(0, 1).fill_(c.y);
    expect_as_allclose(a, b, c.name);
    EXPECT_EQ(all_close(a, b, kTol, kTol), c.close) << c.name;
    expect_as_allclose(a.to(at::kDouble), b.to(at::kDouble), c.name + " (double)");
  }
}

TEST(AllClose, AgreesWithAllcloseOnRandomOutputs) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  for (int i = 0; i < 200; ++i) {
    const at::Tensor a = at::randn({8, 33}, gen);
    // Perturbations around the tolerance: some pairs close, some not.
    const double scale = std::pow(10.0, -7.0 + 0.02 * i);
    const at::Tensor b = a + at::randn({8, 33}, gen) * scale;
    expect_as_allclose(a, b, "perturbation " + std::to_string(scale));
  }
}

TEST(AllClose, ReadsViewsAsAllcloseDoes) {
  const at::Tensor a = at::randn({6, 8});
  // A transposed view against a contiguous copy of it, and a narrowed one.
  expect_as_allclose(a.t(), a.t().contiguous(), "transposed, equal");
  expect_as_allclose(a.t(), a.t().contiguous() + 1e-3, "transposed, off");
  expect_as_allclose(a.narrow(1, 0, 5), a.narrow(1, 0, 5).clone(), "narrowed, equal");
  expect_as_allclose(a.narrow(1, 1, 5), a.narrow(1, 0, 5), "narrowed, shifted");
  EXPECT_TRUE(all_close(a.t(), a.t(), kTol, kTol).has_value()) << "decided, not left";
}

TEST(AllClose, LeavesWhatItCannotDecideToAllclose) {
  const at::Tensor a = at::randn({4, 6});
  EXPECT_FALSE(all_close(a, a.to(at::kDouble), kTol, kTol).has_value()) << "two dtypes";
  EXPECT_FALSE(all_close(a.to(at::kHalf), a.to(at::kHalf), kTol, kTol).has_value()) << "half";
  EXPECT_FALSE(all_close(a, a.reshape({6, 4}), kTol, kTol).has_value()) << "other sizes";
  EXPECT_FALSE(all_close(a._neg_view(), a, kTol, kTol).has_value()) << "negative bit";
  EXPECT_FALSE(all_close(at::Tensor(), a, kTol, kTol).has_value()) << "undefined";
  EXPECT_EQ(all_close(a, a.clone(), kTol, kTol), true);
}

}  // namespace
}  // namespace reloadsafe::harness
