#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/storage_fit.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace reloadsafe {
namespace {

// Bytes of a whole storage, as a vector, for before/after comparisons.
std::vector<uint8_t> storage_bytes(const c10::Storage& s) {
  const auto* p = static_cast<const uint8_t*>(s.data());
  return std::vector<uint8_t>(p, p + s.nbytes());
}

// A uint8 storage of `nbytes` filled with a recognisable pattern.
c10::Storage patterned_storage(int64_t nbytes) {
  at::Tensor t = at::empty({nbytes}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  for (int64_t i = 0; i < nbytes; ++i) p[i] = static_cast<uint8_t>(7 * i + 13);
  return t.storage();
}

at::Tensor on(const c10::Storage& s, int64_t offset, std::vector<int64_t> shape,
              std::vector<int64_t> stride, at::ScalarType dtype) {
  return storage_view(s, offset, shape, stride, dtype);
}

TEST(Extent, MatchesDefinitionOnLayouts) {
  struct Case {
    const char* name;
    std::vector<int64_t> shape, stride;
    int64_t expected;
  } cases[] = {
      {"contiguous", {4, 4}, {4, 1}, 16},
      {"transposed", {4, 4}, {1, 4}, 16},
      {"padded rows", {4, 3}, {8, 1}, 27},
      {"expanded", {4, 4}, {0, 1}, 4},
      {"zero dim", {}, {}, 1},
      {"no elements", {0, 4}, {4, 1}, 0},
      {"size one any stride", {1, 5}, {1000, 1}, 5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(checked_extent(c.shape, c.stride), c.expected);
    at::Tensor t = at::empty_strided(c.shape, c.stride, at::kFloat);
    EXPECT_EQ(extent(t), c.expected);
  }
}

TEST(Extent, OverflowIsReportedNotWrapped) {
  const int64_t big = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_EQ(checked_extent({3}, {big}), std::nullopt);
  EXPECT_EQ(checked_extent({2, 2}, {big, big}), std::nullopt);
  EXPECT_THROW(checked_extent({-1}, {1}), c10::Error);
  EXPECT_THROW(checked_extent({2}, {-1}), c10::Error);
  EXPECT_THROW(checked_extent({2, 2}, {1}), c10::Error);
}

TEST(StorageView, SharesTheStorageAtTheOffset) {
  c10::Storage s = patterned_storage(64);
  at::Tensor v = storage_view(s, 3, {2, 2}, {2, 1}, at::kInt);
  EXPECT_TRUE(v.storage().is_alias_of(s));
  EXPECT_EQ(v.data_ptr(), static_cast<char*>(s.mutable_data()) + 12);
  EXPECT_EQ(v.storage_offset(), 3);
  EXPECT_EQ(s.nbytes(), 64u);
}

TEST(StorageView, RefusesToGrowAResizableStorage) {
  c10::Storage s = patterned_storage(64);
  ASSERT_TRUE(s.resizable());
  const void* before = s.data();
  EXPECT_THROW(storage_view(s, 0, {17}, {1}, at::kInt), c10::Error);
  EXPECT_THROW(storage_view(s, 16, {1}, {1}, at::kInt), c10::Error);
  EXPECT_THROW(storage_view(s, -1, {1}, {1}, at::kInt), c10::Error);
  EXPECT_THROW(storage_view(s, 0, {2, 2}, {std::numeric_limits<int64_t>::max(), 1}, at::kInt),
               c10::Error);
  EXPECT_EQ(s.data(), before);
  EXPECT_EQ(s.nbytes(), 64u);
  // Exactly full is fine; an empty view at the end is fine.
  EXPECT_NO_THROW(storage_view(s, 0, {16}, {1}, at::kInt));
  EXPECT_NO_THROW(storage_view(s, 16, {0}, {1}, at::kInt));
}

// One row per paragraph of _in_own_storage: the old tensor lives on a storage
// of `storage_nbytes` bytes; `placed` is the expected decision.
struct FitCase {
  const char* name;
  int64_t storage_nbytes;
  // old: element offset, shape, stride, dtype
  int64_t old_offset;
  std::vector<int64_t> old_shape, old_stride;
  at::ScalarType old_dtype;
  // new: shape, stride, dtype (a storage of its own)
  std::vector<int64_t> new_shape, new_stride;
  at::ScalarType new_dtype;
  bool whole_storage;
  bool placed;
};

// clang-format off
const FitCase kFitCases[] = {
    // name                                   bytes off old shape  stride   dtype       new shape  stride   dtype       whole  placed
    {"equal-size repack uint8 -> int32",      1024, 0, {16, 64}, {64, 1}, at::kByte,  {4, 64},  {64, 1}, at::kInt,   false, true},
    {"smaller",                                 64, 0, {16},     {1},     at::kFloat, {8},      {1},     at::kFloat, false, true},
    {"larger",                                 128, 0, {8},      {1},     at::kFloat, {16},     {1},     at::kFloat, false, false},
    {"larger, direct reload, fits storage",    128, 0, {8},      {1},     at::kFloat, {16},     {1},     at::kFloat, true,  true},
    {"larger, direct reload, past storage",    128, 4, {8},      {1},     at::kFloat, {32},     {1},     at::kFloat, true,  false},
    {"transposed new",                          64, 0, {4, 4},   {4, 1},  at::kFloat, {4, 4},   {1, 4},  at::kFloat, false, true},
    {"padded new with gaps",                   256, 0, {4, 4},   {4, 1},  at::kFloat, {4, 4},   {8, 1},  at::kFloat, false, false},
    {"padded new, direct reload",              256, 0, {4, 4},   {4, 1},  at::kFloat, {4, 4},   {8, 1},  at::kFloat, true,  true},
    {"old with gaps",                          256, 0, {4, 4},   {8, 1},  at::kFloat, {4, 4},   {4, 1},  at::kFloat, false, false},
    {"misaligned byte offset",                  64, 1, {8},      {1},     at::kByte,  {2},      {1},     at::kInt,   false, false},
    {"aligned byte offset",                     64, 4, {8},      {1},     at::kByte,  {2},      {1},     at::kInt,   false, true},
    {"emptied weight",                          64, 0, {16},     {1},     at::kFloat, {0},      {1},     at::kFloat, false, false},
    {"emptied weight, direct reload",           64, 0, {16},     {1},     at::kFloat, {0},      {1},     at::kFloat, true,  true},
    {"expanded new",                            64, 0, {16},     {1},     at::kFloat, {4, 4},   {0, 1},  at::kFloat, false, false},
    {"expanded new, direct reload",             64, 0, {16},     {1},     at::kFloat, {4, 4},   {0, 1},  at::kFloat, true,  false},
    {"empty expanded new, direct reload",       64, 0, {16},     {1},     at::kFloat, {2, 0},   {0, 1},  at::kFloat, true,  true},
    {"zero-dim new",                            64, 0, {16},     {1},     at::kFloat, {},       {},      at::kFloat, false, true},
    {"empty old",                               64, 0, {0},      {1},     at::kFloat, {1},      {1},     at::kFloat, false, false},
};
// clang-format on

TEST(InOwnStorage, PlacesExactlyWhenTheSpecificationSaysItFits) {
  for (const auto& c : kFitCases) {
    SCOPED_TRACE(c.name);
    c10::Storage s = patterned_storage(c.storage_nbytes);
    at::Tensor old = on(s, c.old_offset, c.old_shape, c.old_stride, c.old_dtype);
    const int64_t span = *checked_extent(c.new_shape, c.new_stride);
    at::Tensor fresh = at::arange(span + 1, at::kDouble)
                           .add_(1)
                           .to(c.new_dtype)
                           .as_strided(c.new_shape, c.new_stride);
    const void* ptr = s.data();
    const std::vector<uint8_t> before = storage_bytes(s);

    at::Tensor result = in_own_storage(old, fresh, c.whole_storage);

    EXPECT_EQ(s.data(), ptr);
    EXPECT_EQ(s.nbytes(), static_cast<size_t>(c.storage_nbytes));
    if (!c.placed) {
      EXPECT_TRUE(result.is_same(fresh));
      EXPECT_EQ(storage_bytes(s), before);
      continue;
    }
    EXPECT_FALSE(result.is_same(fresh));
    EXPECT_TRUE(result.storage().is_alias_of(s));
    EXPECT_EQ(result.storage_offset() * result.element_size(),
              c.old_offset * static_cast<int64_t>(old.element_size()));
    EXPECT_EQ(result.sizes(), fresh.sizes());
    EXPECT_EQ(result.strides(), fresh.strides());
    EXPECT_EQ(result.scalar_type(), fresh.scalar_type());
    EXPECT_TRUE(at::equal(result, fresh));
    // Bytes outside the written elements are untouched (neighbours, gaps).
    const std::vector<uint8_t> after = storage_bytes(s);
    std::vector<bool> written(after.size(), false);
    const auto sizes = result.sizes().vec();
    const auto itemsize = static_cast<int64_t>(result.element_size());
    for (int64_t i = 0; i < result.numel(); ++i) {
      int64_t rem = i, elem = result.storage_offset();
      for (int64_t d = result.dim() - 1; d >= 0; --d) {
        elem += (rem % sizes[d]) * result.stride(d);
        rem /= sizes[d];
      }
      for (int64_t b = 0; b < itemsize; ++b) written[elem * itemsize + b] = true;
    }
    for (size_t b = 0; b < after.size(); ++b) {
      if (!written[b]) {
        ASSERT_EQ(after[b], before[b]) << "byte " << b << " outside the result changed";
      }
    }
  }
}

TEST(InOwnStorage, NewAlreadyOnTheOldStorageIsReturnedAsIs) {
  c10::Storage s = patterned_storage(64);
  at::Tensor old = on(s, 0, {16}, {1}, at::kFloat);
  at::Tensor view = on(s, 8, {4}, {1}, at::kFloat);
  const std::vector<uint8_t> before = storage_bytes(s);
  EXPECT_TRUE(in_own_storage(old, view).is_same(view));
  EXPECT_TRUE(in_own_storage(old, view, /*whole_storage=*/true).is_same(view));
  EXPECT_EQ(storage_bytes(s), before);
}

TEST(InOwnStorage, OtherDeviceIsNotPlaced) {
  c10::Storage s = patterned_storage(64);
  at::Tensor old = on(s, 0, {16}, {1}, at::kFloat);
  at::Tensor meta = at::empty({4}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  EXPECT_TRUE(in_own_storage(old, meta).is_same(meta));
  EXPECT_TRUE(in_own_storage(old, meta, true).is_same(meta));
}

TEST(InOwnStorage, MetaOnMetaIsNotPlaced) {
  auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  at::Tensor old = at::empty({16}, meta);
  at::Tensor fresh = at::empty({4}, meta);
  EXPECT_TRUE(in_own_storage(old, fresh).is_same(fresh));
  EXPECT_TRUE(in_own_storage(old, fresh, true).is_same(fresh));
}

TEST(InOwnStorage, InterleavedZeroStrideIsAnErrorAndWritesNothing) {
  // span >= numel although rows share elements: the reference's copy_ refuses
  // it; the port says why before writing anything.
  c10::Storage s = patterned_storage(256);
  at::Tensor old = on(s, 0, {16}, {1}, at::kFloat);
  at::Tensor fresh = at::zeros({12}, at::kFloat).as_strided({2, 3}, {0, 5});
  const std::vector<uint8_t> before = storage_bytes(s);
  EXPECT_THROW(in_own_storage(old, fresh, /*whole_storage=*/true), c10::Error);
  EXPECT_EQ(storage_bytes(s), before);
}

TEST(InOwnStorage, HugeMetaLayoutDoesNotFit) {
  auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  at::Tensor old = at::empty({16}, meta);
  at::Tensor huge = at::empty_strided({2, 2}, {int64_t{1} << 61, 1}, meta);
  EXPECT_TRUE(in_own_storage(old, huge, true).is_same(huge));
}

}  // namespace
}  // namespace reloadsafe
