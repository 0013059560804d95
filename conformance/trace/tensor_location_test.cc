#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/tensor_location.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace reloadsafe::trace {
namespace {

std::vector<std::string> whats(const std::vector<LocationChange>& changes) {
  std::vector<std::string> out;
  for (const auto& c : changes) out.push_back(c.what);
  return out;
}

TEST(TensorLocation, RecordsTheFactsAGraphBakesIn) {
  at::Tensor base = at::zeros({4, 8});
  at::Tensor view = base.narrow(0, 1, 2);
  const TensorLocation l = TensorLocation::of(view);
  EXPECT_EQ(l.storage, base.storage().unsafeGetStorageImpl());
  EXPECT_EQ(l.storage_data, base.data_ptr());
  EXPECT_EQ(l.storage_nbytes, 4u * 8u * sizeof(float));
  EXPECT_EQ(l.data_ptr, view.data_ptr());
  EXPECT_EQ(l.storage_offset, 8);
  EXPECT_EQ(c10::IntArrayRef(l.sizes), c10::IntArrayRef({2, 8}));
  EXPECT_EQ(c10::IntArrayRef(l.strides), c10::IntArrayRef({8, 1}));
  EXPECT_EQ(l.dtype, at::kFloat);
  EXPECT_EQ(l.layout(), "Float[2, 8] stride [8, 1] offset 8 on cpu");
}

TEST(TensorLocation, ATensorWithoutStorageHasOnlyItsLayout) {
  at::Tensor sparse = at::eye(3).to_sparse();
  const TensorLocation l = TensorLocation::of(sparse);
  EXPECT_EQ(l.storage, nullptr);
  EXPECT_EQ(l.data_ptr, nullptr);
  EXPECT_EQ(c10::IntArrayRef(l.sizes), c10::IntArrayRef({3, 3}));
  EXPECT_TRUE(l.strides.empty());
}

// Each row: how the tensor looked after, and the verdicts, in report order.
struct DiffCase {
  const char* name;
  std::function<at::Tensor(at::Tensor&)> after;  // given the original, the tensor after
  std::vector<std::string> expected;
};

TEST(TensorLocation, DiffGivesTheSameVerdictsEverywhere) {
  const std::vector<DiffCase> cases = {
      {"the same tensor", [](at::Tensor& t) { return t; }, {}},
      {"a new object on the same storage and layout",
       [](at::Tensor& t) { return t.view(t.sizes()); },
       {}},
      {"new bytes in place", [](at::Tensor& t) { return t.fill_(3); }, {}},
      {"a fresh tensor of the same layout",
       [](at::Tensor& t) { return t.clone(); },
       {"address", "storage"}},
      {"a view at another offset",
       [](at::Tensor& t) {
         return t.as_strided({4, 8}, {8, 1}, 4);
       },
       {"address", "layout"}},
      {"transposed in place of the bytes",
       [](at::Tensor& t) {
         return t.view({8, 4}).t();
       },
       {"layout"}},
      {"reinterpreted as another dtype",
       [](at::Tensor& t) { return t.view(at::kInt); },
       {"layout"}},
      {"one size fewer, the same bytes", [](at::Tensor& t) { return t.view({32}); }, {"layout"}},
      {"one more size, the same bytes",
       [](at::Tensor& t) {
         return t.view({4, 2, 4});
       },
       {"layout"}},
      {"the same sizes, one stride other",
       [](at::Tensor& t) {
         return t.as_strided({4, 8}, {4, 1});
       },
       {"layout"}},
      {"its storage emptied",
       [](at::Tensor& t) {
         t.storage().set_nbytes(0);
         return t;
       },
       {"storage resized or moved"}},
      {"its storage reallocated under it",
       [](at::Tensor& t) {
         t.resize_({64, 64});
         return t.narrow(0, 0, 4).narrow(1, 0, 8);
       },
       {"address", "storage resized or moved", "layout"}},
  };
  for (const DiffCase& c : cases) {
    SCOPED_TRACE(c.name);
    at::Tensor t = at::arange(48, at::kFloat).narrow(0, 0, 32).view({4, 8});
    const TensorLocation before = TensorLocation::of(t);
    const at::Tensor after_tensor = c.after(t);
    const TensorLocation after = TensorLocation::of(after_tensor);
    const std::vector<LocationChange> changes = before.diff(after);
    EXPECT_EQ(whats(changes), c.expected);
    EXPECT_EQ(before.same_place(after), c.expected.empty());
    // Asked of the tensor itself, without making its location: the same.
    EXPECT_EQ(before.is_place_of(after_tensor), c.expected.empty());
    // Without details: the same verdicts, nothing formatted.
    const std::vector<LocationChange> bare = before.diff(after, /*details=*/false);
    EXPECT_EQ(whats(bare), c.expected);
    for (const LocationChange& change : bare) {
      EXPECT_TRUE(change.before.empty() && change.after.empty()) << change.what;
    }
  }
}

TEST(TensorLocation, DiffSaysBeforeAndAfterAsReportsPrintThem) {
  at::Tensor t = at::zeros({2, 3});
  at::Tensor u = at::zeros({3, 2});
  const TensorLocation before = TensorLocation::of(t);
  const TensorLocation after = TensorLocation::of(u);
  const std::vector<LocationChange> changes = before.diff(after);
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].before, to_hex(t.data_ptr()));
  EXPECT_EQ(changes[0].after, to_hex(u.data_ptr()));
  EXPECT_EQ(changes[1].before, to_hex(t.storage().unsafeGetStorageImpl()));
  EXPECT_EQ(changes[2].before, "Float[2, 3] stride [3, 1] offset 0 on cpu");
  EXPECT_EQ(changes[2].after, "Float[3, 2] stride [2, 1] offset 0 on cpu");
}

TEST(TensorLocation, FormatsAddressesAndLayoutsAsAStreamWould) {
  const at::Tensor t = at::zeros({2, 3}, at::kHalf).t();
  const std::vector<const void*> addresses = {nullptr, reinterpret_cast<const void*>(uintptr_t{1}),
                                              t.data_ptr(),
                                              reinterpret_cast<const void*>(~uintptr_t{0})};
  for (const void* p : addresses) {
    std::ostringstream os;
    os << p;
    EXPECT_EQ(to_hex(p), os.str());
  }
  const TensorLocation l = TensorLocation::of(t);
  std::ostringstream os;
  os << c10::toString(l.dtype) << c10::IntArrayRef(l.sizes) << " stride "
     << c10::IntArrayRef(l.strides) << " offset " << l.storage_offset << " on " << l.device;
  EXPECT_EQ(l.layout(), os.str());
  EXPECT_EQ(l.layout(), "Half[3, 2] stride [1, 3] offset 0 on cpu");
  TensorLocation empty;  // no sizes, no strides (a scalar, or a non-strided layout)
  EXPECT_EQ(empty.layout(),
            std::string(c10::toString(empty.dtype)) + "[] stride [] offset 0 on cpu");
}

}  // namespace
}  // namespace reloadsafe::trace
