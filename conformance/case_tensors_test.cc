// case_tensors_test.cc: the layout types a case's JSON becomes, the storage
// budget and the byte patterns.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_tensors.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

namespace reloadsafe::conformance {
namespace {

TEST(ReadObject, OwnedOrViewByType) {
  const ObjectSpec owned = read_object(
      Json::parse(R"({"dtype": "int16", "shape": [2, 3], "offset": 1, "kind": "parameter"})"),
      "old");
  const auto* o = std::get_if<OwnedTensor>(&owned.tensor);
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->geometry.stride, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(o->geometry.needed_nbytes, 14);
  EXPECT_EQ(o->storage_nbytes, 14);
  EXPECT_EQ(owned.kind, ObjectKind::kParameter);

  const ObjectSpec view = read_object(
      Json::parse(R"({"dtype": "uint8", "shape": [2], "on": "old", "storage_nbytes": 1})"), "new");
  const auto* v = std::get_if<ViewTensor>(&view.tensor);
  ASSERT_NE(v, nullptr);  // storage_nbytes is ignored on a view
  EXPECT_EQ(v->on, "old");
  EXPECT_FALSE(view.kind.has_value());

  const NamedObject named =
      read_named_object(Json::parse(R"({"name": "w", "dtype": "uint8", "shape": [1]})"), "t");
  EXPECT_EQ(named.name, "w");
  EXPECT_THROW(read_object(Json::parse(R"({"name": "w", "dtype": "uint8", "shape": [1]})"), "t"),
               c10::Error);
  EXPECT_THROW(
      read_object(Json::parse(R"({"dtype": "uint8", "shape": [4], "storage_nbytes": 3})"), "old"),
      c10::Error);
}

TEST(CaseTensors, BudgetIsCheckedBeforeAllocating) {
  const ObjectSpec half =
      read_object(Json::parse(R"({"dtype": "uint8", "shape": [536870912]})"), "a");  // 512 MiB each
  const ObjectSpec meta = read_object(
      Json::parse(R"({"dtype": "uint8", "shape": [1073741824], "device": "meta"})"), "m");
  EXPECT_NO_THROW(CaseTensors::plan({&half.tensor, &half.tensor, &meta.tensor, nullptr}));
  const ObjectSpec one = read_object(Json::parse(R"({"dtype": "uint8", "shape": [1]})"), "b");
  EXPECT_THROW(CaseTensors::plan({&half.tensor, &half.tensor, &one.tensor}), c10::Error);
}

TEST(CaseTensors, PatternsAndViews) {
  CaseTensors tensors;
  const ObjectSpec old = read_object(Json::parse(R"({"dtype": "uint8", "shape": [4]})"), "old");
  const at::Tensor t0 = tensors.own(old.tensor, 0, "old");
  const at::Tensor t1 = tensors.own(old.tensor, 1, "new");
  EXPECT_TRUE(at::equal(t0, at::tensor({13, 20, 27, 34}, at::kByte)));
  EXPECT_TRUE(at::equal(t1, at::tensor({171, 182, 193, 204}, at::kByte)));
  const ObjectSpec view = read_object(
      Json::parse(R"({"dtype": "uint8", "shape": [2], "offset": 2, "on": "old"})"), "v");
  const at::Tensor v = tensors.second(view.tensor, &t0.storage(), "old", "new");
  EXPECT_TRUE(v.storage().is_alias_of(t0.storage()));
  EXPECT_TRUE(at::equal(v, at::tensor({27, 34}, at::kByte)));
  EXPECT_THROW(tensors.second(view.tensor, nullptr, "old", "new"), c10::Error);
  EXPECT_THROW(tensors.second(view.tensor, &t0.storage(), "dst", "src"), c10::Error);
  EXPECT_THROW(tensors.own(view.tensor, 0, "old"), c10::Error);
}

}  // namespace
}  // namespace reloadsafe::conformance
