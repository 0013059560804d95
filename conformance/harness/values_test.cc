// The protocol's value comparisons: bytes unchanged (a snapshot, and two
// tensors byte for byte) and outputs close to a cold load's.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/values.h"

#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace reloadsafe::harness {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

at::Tensor floats(std::initializer_list<float> values) {
  return at::tensor(std::vector<float>(values), at::kFloat);
}

// A NaN whose payload differs from the default quiet NaN's.
at::Tensor other_nan() {
  const uint32_t bits = 0x7fc00001;
  float f = 0;
  std::memcpy(&f, &bits, sizeof f);
  return floats({f});
}

TEST(PlainCpuBytes, OnlyADenseContiguousCpuTensor) {
  const at::Tensor m = at::arange(6, at::kFloat).reshape({2, 3});
  struct Case {
    const char* name;
    at::Tensor t;
    bool plain;
  };
  const Case cases[] = {
      {"contiguous", m, true},
      {"empty", at::empty({0}), true},
      {"transposed", m.t(), false},
      {"sparse", m.to_sparse(), false},
      {"meta", at::empty({2}, at::TensorOptions().device(c10::kMeta)), false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(plain_cpu_bytes(c.t), c.plain) << c.name;
  }
}

TEST(SameBytes, ComparesBytesShapeAndDtype) {
  const at::Tensor m = at::arange(6, at::kFloat).reshape({2, 3});
  struct Case {
    const char* name;
    at::Tensor a;
    at::Tensor b;
    bool same;
  };
  const Case cases[] = {
      {"equal", m, m.clone(), true},
      {"one element differs", m, m.clone().index_put_({0, 0}, 9.0), false},
      {"same NaN", floats({kNaN}), floats({kNaN}), true},
      // An element-wise == would call these equal (0.0 == -0.0) or unequal
      // (NaN != NaN); the bytes say otherwise.
      {"NaN payloads", floats({kNaN}), other_nan(), false},
      {"zero and minus zero", floats({0.0f}), floats({-0.0f}), false},
      {"shape", m, m.reshape({3, 2}), false},
      {"dtype", m, m.to(at::kInt), false},
      {"a transposed copy of the same values", m.t(), m.t().contiguous(), true},
      {"empty", at::empty({0}), at::empty({0}), true},
      // A layer may hold a sparse buffer (a pruning mask): compared by the
      // values it stands for, whatever its layout.
      {"sparse, equal", m.to_sparse(), m.clone().to_sparse(), true},
      {"sparse, one value differs", m.to_sparse(), m.clone().index_put_({0, 1}, 9.0).to_sparse(),
       false},
      {"sparse and its dense form", m.to_sparse(), m, true},
      {"sparse CSR, equal", m.to_sparse_csr(), m.clone().to_sparse_csr(), true},
      {"sparse CSR, one value differs", m.to_sparse_csr(),
       m.clone().index_put_({1, 2}, 9.0).to_sparse_csr(), false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(same_bytes(c.a, c.b), c.same) << c.name;
  }
}

TEST(Close, WithinTheToleranceAndNanAndInfinityInPlace) {
  struct Case {
    const char* name;
    at::Tensor a;
    at::Tensor b;
    bool close;
  };
  const Case cases[] = {
      {"equal", floats({1, 2}), floats({1, 2}), true},
      {"within 1e-5", floats({1, 2}), floats({1, 2.00001f}), true},
      {"beyond", floats({1, 2}), floats({1, 2.001f}), false},
      {"NaN in the same place", floats({kNaN, 1}), floats({kNaN, 1}), true},
      {"NaN in one only", floats({kNaN, 1}), floats({0, 1}), false},
      {"infinity in the same place", floats({kInf, -kInf}), floats({kInf, -kInf}), true},
      {"infinities of other signs", floats({kInf}), floats({-kInf}), false},
      {"shape", floats({1, 2}), floats({1, 2}).reshape({2, 1}), false},
      {"dtypes differ, values equal", floats({1, 2}), at::tensor({1.0, 2.0}, at::kDouble), true},
      {"integers", at::arange(4, at::kInt), at::arange(4, at::kInt), true},
      {"integers differ", at::arange(4, at::kInt), at::arange(4, at::kInt) + 1, false},
      {"sparse, equal", floats({0, 2}).to_sparse(), floats({0, 2}).to_sparse(), true},
      {"sparse, beyond", floats({0, 2}).to_sparse(), floats({0, 2.001f}).to_sparse(), false},
      {"sparse and dense", floats({0, 2}).to_sparse(), floats({0, 2}), true},
      // No CPU allclose for these: float8 compares as float32, bits by bytes.
      {"float8, equal", floats({1, 2}).to(at::kFloat8_e4m3fn),
       floats({1, 2}).to(at::kFloat8_e4m3fn), true},
      {"float8, differ", floats({1, 2}).to(at::kFloat8_e4m3fn),
       floats({1, 3}).to(at::kFloat8_e4m3fn), false},
      {"float8 e5m2", floats({1, 2}).to(at::kFloat8_e5m2), floats({1, 2}).to(at::kFloat8_e5m2),
       true},
      {"bits, equal", at::arange(4, at::kByte).view(at::kBits8),
       at::arange(4, at::kByte).view(at::kBits8), true},
      {"bits, differ", at::arange(4, at::kByte).view(at::kBits8),
       (at::arange(4, at::kByte) + 1).view(at::kBits8), false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(close(c.a, c.b), c.close) << c.name;
  }
}

TEST(MaxDiff, SaysByHowMuchOrThatTheShapesDiffer) {
  EXPECT_EQ(max_diff(floats({1, 2}), floats({1, 2.25f})), "max |diff| 0.25");
  EXPECT_EQ(max_diff(floats({1, 2}), floats({1, 2})), "max |diff| 0");
  EXPECT_EQ(max_diff(floats({NAN, 2, NAN}), floats({1, 2, 3})),
            "2 NaN where the other has numbers");
  EXPECT_EQ(max_diff(floats({NAN, 2}), floats({NAN, 2.5f})), "max |diff| 0.5");
  EXPECT_EQ(max_diff(at::zeros({2, 3}), at::zeros({3, 2})), "shape [2, 3] vs [3, 2]");
  EXPECT_EQ(max_diff(floats({INFINITY, 1}), floats({INFINITY, 3})), "max |diff| 2")
      << "the same infinity is no difference";
  EXPECT_EQ(max_diff(floats({-INFINITY, 1}), floats({0, 1})), "max |diff| inf");
  EXPECT_EQ(max_diff(floats({1, 2, 3, 4}).view({2, 2}).t(), floats({1, 3, 2, 4.5f}).view({2, 2})),
            "max |diff| 0.5")
      << "elements compared by index, not by storage order";
  EXPECT_EQ(max_diff(at::arange(4, at::kInt), at::arange(4, at::kLong) * 2), "max |diff| 3");
  EXPECT_EQ(max_diff(at::empty({0}), at::empty({0})), "max |diff| 0");
  EXPECT_EQ(max_diff(floats({0, 2}).reshape({1, 2}).to_sparse(),
                     floats({0, 2.25f}).reshape({1, 2}).to_sparse_csr()),
            "max |diff| 0.25");
}

}  // namespace
}  // namespace reloadsafe::harness
