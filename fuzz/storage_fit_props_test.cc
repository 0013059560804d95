// Properties of the layout arithmetic and storage fit (utils/storage_fit.h),
// checked against the independent model of fuzz/spec_model.h:
//  - checked_extent agrees with unbounded arithmetic, overflow included;
//  - storage_view gives exactly the asked-for view when it fits and throws
//    otherwise, and never grows, moves or writes a storage;
//  - in_own_storage, in both modes, places exactly when the specification
//    says new fits: at old's byte offset with new's layout and values, only
//    new's element bytes written; otherwise new itself and nothing written.
// Each property is also run against mutants, which it must catch.
#include "fuzz/expect_failure.h"
#include "fuzz/generators.h"
#include "fuzz/spec_model.h"
#include "utils/storage_fit.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <vector>

namespace reloadsafe::fuzz {
namespace {

// ---------------------------------------------------------------------------
// checked_extent

using ExtentFn = std::function<std::optional<int64_t>(c10::IntArrayRef, c10::IntArrayRef)>;

// Sizes and strides over the whole int64 range: small ones, ones whose
// products overflow, the extremes, and (rarely) negative ones.
rc::Gen<int64_t> gen_wide_int() {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return rc::gen::weightedOneOf<int64_t>({
      {8, rc::gen::inRange<int64_t>(0, 8)},
      {2, rc::gen::inRange<int64_t>((int64_t{1} << 31) - 2, (int64_t{1} << 31) + 2)},
      {1, rc::gen::element<int64_t>(int64_t{1} << 62, kMax / 2 + 1, kMax - 1, kMax)},
      {1, rc::gen::arbitrary<int64_t>()},
  });
}

struct DimsCase {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

std::ostream& operator<<(std::ostream& os, const DimsCase& c) {
  return os << "sizes=" << dims(c.sizes) << " strides=" << dims(c.strides);
}

rc::Gen<DimsCase> gen_dims_case() {
  return rc::gen::exec([] {
    DimsCase c;
    const auto rank = *rc::gen::inRange<size_t>(0, 7);
    c.sizes = *rc::gen::container<std::vector<int64_t>>(rank, gen_wide_int());
    c.strides = *rc::gen::container<std::vector<int64_t>>(rank, gen_wide_int());
    if (*rc::gen::weightedElement<bool>({{19, false}, {1, true}})) {
      c.strides.push_back(1);  // one stride too many
    }
    return c;
  });
}

void checked_extent_property(const ExtentFn& impl) {
  const DimsCase c = *gen_dims_case();
  bool valid = c.sizes.size() == c.strides.size();
  for (int64_t v : c.sizes) valid = valid && v >= 0;
  for (int64_t v : c.strides) valid = valid && v >= 0;
  RC_CLASSIFY(!valid, "rejected");
  if (!valid) {
    RC_ASSERT_THROWS_AS(impl(c.sizes, c.strides), c10::Error);
    return;
  }
  const std::optional<int64_t> expected = model::extent(c.sizes, c.strides);
  RC_CLASSIFY(!expected.has_value(), "overflows");
  const std::optional<int64_t> got = impl(c.sizes, c.strides);
  RC_LOG() << "extent " << (got ? std::to_string(*got) : "overflow") << ", expected "
           << (expected ? std::to_string(*expected) : "overflow") << "\n";
  RC_ASSERT(got == expected);
}

RC_GTEST_PROP(CheckedExtentProps, AgreesWithUnboundedArithmetic, ()) {
  checked_extent_property(
      [](c10::IntArrayRef s, c10::IntArrayRef t) { return checked_extent(s, t); });
}

// A mutant that multiplies and adds with wrap-around.
std::optional<int64_t> wrapping_extent(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  TORCH_CHECK(sizes.size() == strides.size(), "rank");
  for (size_t d = 0; d < sizes.size(); ++d) TORCH_CHECK(sizes[d] >= 0 && strides[d] >= 0, "neg");
  for (int64_t s : sizes) {
    if (s == 0) return 0;
  }
  uint64_t span = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    span += static_cast<uint64_t>(sizes[d] - 1) * static_cast<uint64_t>(strides[d]);
  }
  return static_cast<int64_t>(span);
}

TEST(CheckedExtentMutants, WrappingArithmeticIsCaught) {
  const Falsified f = check_quietly([] { checked_extent_property(wrapping_extent); });
  ASSERT_TRUE(f.failed) << f.counterexample;
  std::cout << "caught after " << f.cases << " cases:\n" << f.counterexample << "\n";
}

// ---------------------------------------------------------------------------
// storage_view

using StorageViewFn = std::function<at::Tensor(const c10::Storage&, int64_t, c10::IntArrayRef,
                                               c10::IntArrayRef, at::ScalarType)>;

// A storage and a view asked of it, which may not fit, and may (rarely) have
// a negative offset, size or stride.
struct ViewCase {
  Layout view;
  int64_t storage_nbytes = 0;
  bool meta = false;
  uint64_t seed = 0;
};

std::ostream& operator<<(std::ostream& os, const ViewCase& c) {
  return os << "view=" << c.view << " storage=" << c.storage_nbytes << "B"
            << (c.meta ? " meta" : "");
}

rc::Gen<ViewCase> gen_view_case() {
  return rc::gen::exec([] {
    ViewCase c;
    c.view = *gen_layout();
    const int64_t delta = *rc::gen::weightedElement<int64_t>({{3, 0}, {2, -1}, {1, -8}, {3, 5}});
    c.storage_nbytes = std::max<int64_t>(c.view.end_bytes() + delta, 0);
    switch (*rc::gen::weightedElement<int>({{12, 0}, {1, 1}, {1, 2}, {1, 3}})) {
      case 1:
        c.view.offset = -1 - c.view.offset;
        break;
      case 2:
        if (!c.view.shape.empty()) c.view.shape.back() = -1;
        break;
      case 3:
        if (!c.view.stride.empty()) c.view.stride.front() = -2;
        break;
      default:
        break;
    }
    c.meta = *rc::gen::weightedElement<bool>({{9, false}, {1, true}});
    c.seed = *rc::gen::arbitrary<uint64_t>();
    return c;
  });
}

void storage_view_property(const StorageViewFn& impl) {
  const ViewCase c = *gen_view_case();
  const Layout& v = c.view;
  bool valid = v.offset >= 0;
  for (int64_t s : v.shape) valid = valid && s >= 0;
  for (int64_t s : v.stride) valid = valid && s >= 0;
  const bool fits =
      valid && static_cast<model::Int128>(v.offset + v.span()) * v.itemsize() <= c.storage_nbytes;
  RC_CLASSIFY(fits, "fits");
  c10::Storage storage = make_storage(c.storage_nbytes, c.seed, c.meta);
  const uintptr_t data = address(storage.data());
  const std::vector<uint8_t> before = storage_bytes(storage);

  std::optional<at::Tensor> view;
  try {
    view = impl(storage, v.offset, v.shape, v.stride, v.dtype);
  } catch (const c10::Error& e) {
    RC_LOG() << "threw: " << e.what_without_backtrace() << "\n";
  }
  RC_ASSERT(address(storage.data()) == data);
  RC_ASSERT(static_cast<int64_t>(storage.nbytes()) == c.storage_nbytes);
  RC_ASSERT(storage_bytes(storage) == before);
  RC_ASSERT(view.has_value() == fits);
  if (!fits) return;
  RC_ASSERT(storage_id(view->storage()) == storage_id(storage));
  RC_ASSERT(view->storage_offset() == v.offset);
  RC_ASSERT(view->sizes() == c10::IntArrayRef(v.shape));
  RC_ASSERT(view->strides() == c10::IntArrayRef(v.stride));
  RC_ASSERT(view->scalar_type() == v.dtype);
  if (!c.meta && v.numel() > 0) {
    RC_ASSERT(address(view->const_data_ptr()) == data + v.offset * v.itemsize());
  }
}

RC_GTEST_PROP(StorageViewProps, ViewsExactlyWhatFitsAndNeverGrowsTheStorage, ()) {
  storage_view_property([](const c10::Storage& s, int64_t o, c10::IntArrayRef sh,
                           c10::IntArrayRef st,
                           at::ScalarType t) { return storage_view(s, o, sh, st, t); });
}

// The reference's storage_view: set_ without a fit check, which grows a
// resizable storage (Note [Why set_ is guarded]).
TEST(StorageViewMutants, UncheckedSetIsCaught) {
  const Falsified f = check_quietly([] {
    storage_view_property([](const c10::Storage& s, int64_t o, c10::IntArrayRef sh,
                             c10::IntArrayRef st, at::ScalarType t) {
      at::Tensor view = at::empty({0}, at::TensorOptions().dtype(t).device(s.device()));
      return view.set_(s, o, sh, st);
    });
  });
  ASSERT_TRUE(f.failed) << f.counterexample;
  std::cout << "caught after " << f.cases << " cases:\n" << f.counterexample << "\n";
}

// ---------------------------------------------------------------------------
// in_own_storage

using InOwnStorageFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, bool)>;
using PlacesFn = std::function<bool(const model::FitQuery&)>;

void in_own_storage_property(bool whole_storage, const InOwnStorageFn& impl,
                             const PlacesFn& places) {
  const FitCase c = *gen_fit_case();
  FitTensors t = build(c);
  const bool expect_placed = places(fit_query(c, whole_storage));
  // copy_ refuses to write a destination whose several indices share one
  // location; the implementation says so before writing anything.
  const bool refused = expect_placed && c.fresh.expanded() && c.fresh.numel() > 0;
  RC_CLASSIFY(expect_placed, "placed");
  RC_CLASSIFY(refused, "refused: expanded");
  RC_CLASSIFY(expect_placed && c.fresh.expanded() && c.fresh.numel() == 0, "empty expanded");
  RC_CLASSIFY(c.fresh_on_old, "new on old's storage");
  RC_CLASSIFY(c.old_meta || c.fresh_meta, "meta");

  const c10::Storage fresh_storage = t.fresh.storage();
  const uintptr_t data = address(t.storage.data());
  const uintptr_t fresh_data = address(fresh_storage.data());
  const std::vector<uint8_t> before = storage_bytes(t.storage);
  const std::vector<uint8_t> fresh_before = storage_bytes(fresh_storage);
  auto storages_kept = [&] {
    RC_ASSERT(address(t.storage.data()) == data);
    RC_ASSERT(static_cast<int64_t>(t.storage.nbytes()) == c.storage_nbytes());
    RC_ASSERT(address(fresh_storage.data()) == fresh_data);
    RC_ASSERT(static_cast<int64_t>(fresh_storage.nbytes()) == c.fresh_storage_nbytes());
    if (!c.fresh_on_old) RC_ASSERT(storage_bytes(fresh_storage) == fresh_before);
  };

  at::Tensor result;
  try {
    result = impl(t.old, t.fresh, whole_storage);
  } catch (const c10::Error& e) {
    RC_LOG() << "threw: " << e.what_without_backtrace() << "\n";
    RC_ASSERT(refused);
    storages_kept();
    RC_ASSERT(storage_bytes(t.storage) == before);
    return;
  }
  RC_ASSERT(!refused);
  storages_kept();
  if (!expect_placed) {
    RC_ASSERT(result.is_same(t.fresh));
    RC_ASSERT(storage_bytes(t.storage) == before);
    return;
  }
  RC_ASSERT(!result.is_same(t.fresh));
  RC_ASSERT(storage_id(result.storage()) == storage_id(t.storage));
  RC_ASSERT(result.storage_offset() * c.fresh.itemsize() == c.old.offset * c.old.itemsize());
  RC_ASSERT(result.sizes() == t.fresh.sizes());
  RC_ASSERT(result.strides() == t.fresh.strides());
  RC_ASSERT(result.scalar_type() == c.fresh.dtype);
  if (c.old_meta) return;
  RC_ASSERT(same_elements(result, t.fresh));
  std::vector<bool> written(before.size(), false);
  mark_elements(written, c.old.offset * c.old.itemsize(), c.fresh.shape, c.fresh.stride,
                c.fresh.itemsize());
  RC_ASSERT(same_outside(before, storage_bytes(t.storage), written));
}

at::Tensor real_in_own_storage(const at::Tensor& old, const at::Tensor& fresh, bool whole) {
  return in_own_storage(old, fresh, whole);
}

RC_GTEST_PROP(InOwnStorageProps, DefaultModePlacesExactlyWhenTheModelFits, ()) {
  in_own_storage_property(false, real_in_own_storage, model::places);
}

RC_GTEST_PROP(InOwnStorageProps, WholeStorageModePlacesExactlyWhenTheModelFits, ()) {
  in_own_storage_property(true, real_in_own_storage, model::places);
}

// The fit rule written again here, with one mistake switched in at a time.
enum class Mutation { kNone, kNoAlignmentCheck, kGapsInDefaultMode, kIgnoresOldGaps };

at::Tensor mutant_in_own_storage(const at::Tensor& old, const at::Tensor& fresh, bool whole,
                                 Mutation m) {
  const c10::Storage& storage = old.storage();
  const int64_t size = static_cast<int64_t>(fresh.element_size());
  const int64_t offset = old.storage_offset() * static_cast<int64_t>(old.element_size());
  const int64_t numel = fresh.numel();
  const std::optional<int64_t> span = checked_extent(fresh.sizes(), fresh.strides());
  if (!span) return fresh;
  bool fits = false;
  if (whole) {
    fits = *span >= numel && offset + *span * size <= static_cast<int64_t>(storage.nbytes());
  } else {
    const bool dense = m == Mutation::kGapsInDefaultMode ? *span >= numel : *span == numel;
    const bool old_dense =
        m == Mutation::kIgnoresOldGaps || checked_extent(old.sizes(), old.strides()) == old.numel();
    fits = numel > 0 && dense && old_dense &&
           numel * size <= old.numel() * static_cast<int64_t>(old.element_size());
  }
  const bool aligned = m == Mutation::kNoAlignmentCheck || offset % size == 0;
  if (!fits || old.device() != fresh.device() || fresh.storage().data() == storage.data() ||
      !aligned) {
    return fresh;
  }
  TORCH_CHECK(numel == 0 || !model::has_expanded_dim(shape_of(fresh), stride_of(fresh)),
              "expanded");
  at::Tensor view =
      storage_view(storage, offset / size, fresh.sizes(), fresh.strides(), fresh.scalar_type());
  view.copy_(fresh);
  return view;
}

InOwnStorageFn mutant(Mutation m) {
  return [m](const at::Tensor& old, const at::Tensor& fresh, bool whole) {
    return mutant_in_own_storage(old, fresh, whole, m);
  };
}

void expect_caught(bool whole, const InOwnStorageFn& impl, const PlacesFn& places) {
  const Falsified f = check_quietly([&] { in_own_storage_property(whole, impl, places); });
  ASSERT_TRUE(f.failed) << "the property did not catch the mutant:\n" << f.counterexample;
  std::cout << "caught after " << f.cases << " cases:\n" << f.counterexample << "\n";
}

// The harness itself is sound: unmutated, the rule written here passes.
TEST(InOwnStorageMutants, UnmutatedRuleWrittenHerePasses) {
  for (bool whole : {false, true}) {
    const Falsified f = check_quietly(
        [&] { in_own_storage_property(whole, mutant(Mutation::kNone), model::places); }, 500);
    EXPECT_FALSE(f.failed) << f.counterexample;
  }
}

TEST(InOwnStorageMutants, ForgettingTheAlignmentCheckIsCaught) {
  expect_caught(false, mutant(Mutation::kNoAlignmentCheck), model::places);
  expect_caught(true, mutant(Mutation::kNoAlignmentCheck), model::places);
}

TEST(InOwnStorageMutants, AllowingGapsInDefaultModeIsCaught) {
  expect_caught(false, mutant(Mutation::kGapsInDefaultMode), model::places);
}

TEST(InOwnStorageMutants, IgnoringOldsGapsInDefaultModeIsCaught) {
  expect_caught(false, mutant(Mutation::kIgnoresOldGaps), model::places);
}

// A wrong model: whole-storage mode judged by the default rule.
TEST(InOwnStorageMutants, AModelWithoutWholeStorageModeIsCaught) {
  expect_caught(true, real_in_own_storage, [](model::FitQuery q) {
    q.whole_storage = false;
    return model::places(q);
  });
}

}  // namespace
}  // namespace reloadsafe::fuzz
