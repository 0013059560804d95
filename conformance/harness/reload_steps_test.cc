#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/reload_steps.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

TEST(DiscardStorage, FillsTheWholeStorageInPlaceWithTheDtypesGarbage) {
  struct Row {
    const char* name;
    at::Tensor base;
    int64_t integer;
    at::Tensor expected;  ///< what every element holds after; undefined: NaN
  };
  const Row rows[] = {
      {"float", at::ones({4}), 0, {}},
      {"half", at::ones({4}, at::kHalf), 0, {}},
      {"complex", at::ones({4}, at::kComplexFloat), 0, {}},
      {"int", at::ones({4}, at::kInt), -1, at::full({4}, -1, at::kInt)},
      {"uint8 zero", at::ones({4}, at::kByte), 0, at::zeros({4}, at::kByte)},
      {"bool", at::zeros({4}, at::kBool), -1, at::ones({4}, at::kBool)},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const at::Tensor view = row.base.narrow(0, 1, 2);  // a view: the whole storage is discarded
    const void* data = row.base.data_ptr();
    const size_t nbytes = row.base.storage().nbytes();
    discard_storage(view, row.integer);
    EXPECT_EQ(row.base.data_ptr(), data);
    EXPECT_EQ(row.base.storage().nbytes(), nbytes);
    if (row.expected.defined()) {
      EXPECT_TRUE(at::equal(row.base, row.expected)) << row.base;
    } else {
      EXPECT_TRUE(at::isnan(row.base).all().item<bool>()) << row.base;
    }
  }
}

// The host fills the storage by copying one element (reload_steps.cc): its
// bytes must be exactly those of fill_ over the whole storage, for every
// dtype (the common ones converted directly, the others through fill_ on one
// element) and any length (the filled run doubles, so odd lengths end the
// last copy short).
TEST(DiscardStorage, OnTheHostWritesTheBytesFillWouldWrite) {
  const at::ScalarType dtypes[] = {
      at::kFloat,  at::kDouble,        at::kHalf,        at::kBFloat16,     at::kBool,
      at::kByte,   at::kChar,          at::kShort,       at::kInt,          at::kLong,
      at::kUInt16, at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kComplexFloat, at::kComplexDouble};
  for (const at::ScalarType dtype : dtypes) {
    for (const int64_t integer : {int64_t{0}, int64_t{-1}, int64_t{3}}) {
      for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1000}}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " integer " + std::to_string(integer) +
                     " n " + std::to_string(n));
        const at::Tensor base = at::zeros({n}, at::kByte).to(dtype);
        discard_storage(base.narrow(0, n - 1, 1), integer);
        at::Tensor expected = at::zeros({n}, at::kByte).to(dtype);
        if (expected.is_floating_point() || expected.is_complex()) {
          expected.fill_(std::numeric_limits<double>::quiet_NaN());
        } else if (dtype == at::kBool) {
          expected.fill_(integer != 0);
        } else {
          expected.fill_(integer);
        }
        const size_t nbytes = static_cast<size_t>(n) * base.element_size();
        EXPECT_EQ(std::memcmp(base.const_data_ptr(), expected.const_data_ptr(), nbytes), 0);
      }
    }
  }
}

TEST(DiscardStorage, LeavesWhatHasNoBytesAlone) {
  discard_storage(at::Tensor(), 0);
  discard_storage(at::empty({0}), 0);
  discard_storage(at::empty({3}, at::kMeta), 0);
}

TEST(SleepAndWake, DiscardsEveryReachedStorageOnceAndRestoresOnlyWhatItIsTold) {
  at::Tensor param = at::ones({4});
  at::Tensor buffer = at::full({2}, 7.0);
  at::Tensor plain = at::full({3}, 5, at::kLong);
  at::Tensor alias = param.narrow(0, 0, 2);  // the same storage as param, reached twice
  const void* addresses[] = {param.data_ptr(), buffer.data_ptr(), plain.data_ptr()};
  sleep_and_wake({{"param", param, true},
                  {"alias", alias, true},
                  {"buffer", buffer, true},
                  {"plain", plain, false}},
                 /*restored=*/{buffer});
  EXPECT_TRUE(at::isnan(param).all().item<bool>());
  EXPECT_TRUE(at::equal(buffer, at::full({2}, 7.0)));
  EXPECT_TRUE(at::equal(plain, at::zeros({3}, at::kLong)));
  EXPECT_EQ(param.data_ptr(), addresses[0]);
  EXPECT_EQ(buffer.data_ptr(), addresses[1]);
  EXPECT_EQ(plain.data_ptr(), addresses[2]);
}

// A sparse tensor sleeps by its parts: the values become garbage, the
// indices zeros, in place; restored, it wakes as it was.
TEST(SleepAndWake, ASparseTensorSleepsAndWakesByItsParts) {
  const at::Tensor dense = at::eye(3) * at::arange(1.0, 4.0);
  at::Tensor reached = dense.to_sparse();
  at::Tensor restored = dense.to_sparse_csr();
  const void* values = reached._values().data_ptr();
  sleep_and_wake({{"reached", reached, false}, {"restored", restored, true}}, {restored});
  EXPECT_TRUE(at::isnan(reached._values()).all().item<bool>());
  EXPECT_TRUE(at::equal(reached._indices(), at::zeros_like(reached._indices())));
  EXPECT_EQ(reached._values().data_ptr(), values);
  EXPECT_TRUE(at::equal(restored.to_dense(), dense));
}

// Restored parts keep their bytes on the host in two ways: a contiguous one
// as raw bytes, any other as a copy; each wakes with exactly its own
// elements, whatever else shares its storage.
TEST(SleepAndWake, RestoresContiguousAndStridedPartsExactly) {
  struct Row {
    const char* name;
    at::Tensor base;
    std::function<at::Tensor(const at::Tensor&)> view;  ///< the restored part of base
  };
  const at::Tensor square = at::arange(16, at::kFloat).reshape({4, 4});
  const Row rows[] = {
      {"whole", square.clone(), [](const at::Tensor& t) { return t; }},
      {"narrowed at an offset", square.clone(),
       [](const at::Tensor& t) { return t.narrow(0, 1, 2); }},
      {"transposed", square.clone(), [](const at::Tensor& t) { return t.t(); }},
      {"every other column", square.clone(),
       [](const at::Tensor& t) { return t.slice(1, 0, 4, 2); }},
      {"integers", at::arange(9, at::kLong), [](const at::Tensor& t) { return t.narrow(0, 3, 4); }},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const at::Tensor restored = row.view(row.base);
    const at::Tensor before = restored.clone();
    const void* data = row.base.data_ptr();
    sleep_and_wake({{"base", row.base, true}}, {restored});
    EXPECT_EQ(row.base.data_ptr(), data);
    EXPECT_TRUE(at::equal(restored, before)) << restored;
    // What the restored part does not view stays discarded.
    const at::Tensor in_part = at::zeros(row.base.sizes(), at::kBool);
    row.view(in_part).fill_(true);
    const at::Tensor rest = row.base.masked_select(in_part.logical_not());
    if (row.base.is_floating_point()) {
      EXPECT_TRUE(at::isnan(rest).all().item<bool>()) << row.base;
    } else {
      EXPECT_TRUE(at::equal(rest, at::zeros_like(rest))) << row.base;
    }
  }
}

TEST(SleepAndWake, LevelOneRestoresParametersToo) {
  at::Tensor param = at::arange(6, at::kFloat);
  sleep_and_wake({{"param", param, true}}, {param});
  EXPECT_TRUE(at::equal(param, at::arange(6, at::kFloat)));
}

TEST(RecreateParameters, FillsEveryParameterWithTheSentinel) {
  at::Tensor w = at::zeros({2, 3});
  at::Tensor idx = at::zeros({4}, at::kInt);
  recreate_parameters({w, idx});
  EXPECT_TRUE(at::isnan(w).all().item<bool>());
  EXPECT_TRUE(at::equal(idx, at::full({4}, -1, at::kInt)));
}

}  // namespace
}  // namespace reloadsafe::harness
