// case_json_test.cc: the typed case readers on the inputs they must accept
// and refuse.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/case_json.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <string>

namespace reloadsafe::conformance {
namespace {

std::string nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(ParseCase, NestingUpToTheLimitIsReadBeyondItRefused) {
  EXPECT_NO_THROW(parse_case(nested(kMaxJsonDepth)));
  EXPECT_THROW(parse_case(nested(kMaxJsonDepth + 1)), c10::Error);
  // Refused as soon as the limit is passed, before the (unfinished) rest.
  EXPECT_THROW(parse_case(std::string(100000, '[')), c10::Error);
  EXPECT_THROW(parse_case("{\"a\": "), Json::parse_error);
}

TEST(AsInt, Int64RangeOnly) {
  EXPECT_EQ(as_int(Json::parse("9223372036854775807"), "x"), INT64_MAX);
  EXPECT_EQ(as_int(Json::parse("-9223372036854775808"), "x"), INT64_MIN);
  EXPECT_THROW(as_int(Json::parse("9223372036854775808"), "x"), c10::Error);
  EXPECT_THROW(as_int(Json::parse("1.0"), "x"), c10::Error);
  EXPECT_THROW(as_int(Json::parse("true"), "x"), c10::Error);
}

TEST(AsAttrs, TensorValues) {
  const AttrMap attrs = as_attrs(
      Json::parse(R"({"s": {"tensor": 3}, "v": {"tensor": [0, 2]}, "b": {"tensor": [true]}})"),
      "a");
  const at::Tensor s = std::get<at::Tensor>(attrs.at("s"));
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.scalar_type(), at::kLong);
  EXPECT_EQ(s.item<int64_t>(), 3);
  const at::Tensor v = std::get<at::Tensor>(attrs.at("v"));
  EXPECT_TRUE(at::equal(v, at::tensor({0, 2}, at::kLong)));
  const at::Tensor b = std::get<at::Tensor>(attrs.at("b"));
  EXPECT_EQ(b.scalar_type(), at::kBool);
  EXPECT_EQ(b.sizes(), c10::IntArrayRef({1}));
  for (const char* bad : {R"({"t": {"tensor": [1, true]}})", R"({"t": {"tensor": [1.5]}})",
                          R"({"t": {"tensor": 1, "extra": 2}})", R"({"t": {"other": 1}})",
                          R"({"shape": 1})", R"({"t": null})"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(as_attrs(Json::parse(bad), "a"), c10::Error);
  }
  // Names of tensor methods pass here; set_weight_attrs itself refuses them.
  EXPECT_NO_THROW(as_attrs(Json::parse(R"({"size": 1, "stride": 2})"), "a"));
}

TEST(AsDtype, NamesRoundTrip) {
  for (const char* name : {"bool", "uint8", "int8", "int16", "int32", "int64", "float16",
                           "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(dtype_name(as_dtype(Json(name), "d")), name);
  }
  EXPECT_THROW(as_dtype(Json("UINT8"), "d"), c10::Error);
}

}  // namespace
}  // namespace reloadsafe::conformance
