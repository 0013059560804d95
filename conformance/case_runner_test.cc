// case_runner_test.cc: the case runner's contract on hostile input (every
// line yields one JSON result line, with `error` where the case cannot be
// evaluated, and nothing throws), plus the documented examples of the case
// format and the behaviour of run_cases.
#include "conformance/case_runner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace reloadsafe::conformance {
namespace {

using Json = nlohmann::json;

// Evaluates `line` and returns the parsed result; fails the test if the
// runner throws or writes something that is not one JSON object with an id.
Json evaluate(const std::string& line) {
  std::string out;
  EXPECT_NO_THROW(out = evaluate_case(line)) << line;
  EXPECT_EQ(out.find('\n'), std::string::npos) << out;
  const Json j = Json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << out;
  EXPECT_TRUE(j.is_object() && j.contains("id")) << out;
  return j.is_object() ? j : Json::object();
}

struct HostileCase {
  const char* name;
  std::string line;
};

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

const std::vector<HostileCase>& hostile_cases() {
  static const auto* cases = new std::vector<HostileCase>{
      // Not JSON, or not a case.
      {"empty_object", "{}"},
      {"truncated", R"({"id": "t", "op": "extent", "shape": [4)"},
      {"truncated_string", R"({"id": "t", "op": "ext)"},
      {"trailing_garbage", R"({"id": "t", "op": "extent", "shape": [4]} })"},
      {"array", "[1, 2]"},
      {"number", "1e400"},
      {"null", "null"},
      {"bare_word", "extent"},
      {"nan", R"({"id": "t", "op": "extent", "shape": [NaN]})"},
      {"bad_utf8", std::string("{\"id\": \"\xff\xfe\", \"op\": \"extent\"}")},
      {"deep_arrays", repeat("[", 100000) + repeat("]", 100000)},
      {"deep_objects", repeat("{\"a\":", 1000) + "1" + repeat("}", 1000)},
      {"deep_in_id", R"({"id": )" + repeat("[", 65) + repeat("]", 65) + R"(, "op": "extent"})"},
      // Unknown or missing operations and fields.
      {"unknown_op", R"({"id": "t", "op": "grow"})"},
      {"op_not_string", R"({"id": "t", "op": ["extent"]})"},
      {"missing_shape", R"({"id": "t", "op": "extent"})"},
      {"missing_layouts", R"({"id": "t", "op": "in_own_storage"})"},
      // Wrong JSON types.
      {"shape_string", R"({"id": "t", "op": "extent", "shape": "4"})"},
      {"shape_object", R"({"id": "t", "op": "extent", "shape": {"0": 4}})"},
      {"shape_float", R"({"id": "t", "op": "extent", "shape": [2.5]})"},
      {"shape_null_item", R"({"id": "t", "op": "extent", "shape": [null]})"},
      {"stride_bool", R"({"id": "t", "op": "extent", "shape": [2], "stride": [true]})"},
      {"dtype_number",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": 5, "shape": [1]}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"layout_string",
       R"({"id": "t", "op": "in_own_storage", "old": "uint8[4]", "new": {"dtype": "uint8", "shape": [1]}})"},
      {"whole_storage_number",
       R"({"id": "t", "op": "in_own_storage", "whole_storage": 1, "old": {"dtype": "uint8", "shape": [1]}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"attrs_array",
       R"({"id": "t", "op": "replace_parameter", "old": null, "new": {"dtype": "uint8", "shape": [1], "attrs": [1]}})"},
      {"attrs_nested",
       R"({"id": "t", "op": "replace_parameter", "old": null, "new": {"dtype": "uint8", "shape": [1], "attrs": {"a": {"b": 1}}}})"},
      {"steps_string", R"({"id": "t", "op": "layer_script", "tensors": [], "steps": "go"})"},
      {"step_name_number",
       R"({"id": "t", "op": "layer_script", "tensors": [], "steps": [{"do": "get_live_param", "name": 7}]})"},
      {"modules_object", R"({"id": "t", "op": "get_moe_expert_mapping", "modules": {}})"},
      {"depth_negative", R"({"id": "t", "op": "weights_already_processed", "depth": -1})"},
      // Unknown dtypes and devices.
      {"unknown_dtype",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": "complex32", "shape": [1]}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"dtype_case",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": "UINT8", "shape": [1]}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"device_cuda",
       R"({"id": "t", "op": "copy_weight", "dst": {"dtype": "uint8", "shape": [1], "device": "cuda:0"}, "src": {"dtype": "uint8", "shape": [1]}})"},
      // Negative and huge sizes, overflowing strides and offsets.
      {"negative_size", R"({"id": "t", "op": "extent", "shape": [2, -3]})"},
      {"negative_stride", R"({"id": "t", "op": "extent", "shape": [2], "stride": [-1]})"},
      {"int64_min_size", R"({"id": "t", "op": "extent", "shape": [-9223372036854775808]})"},
      {"uint64_size", R"({"id": "t", "op": "extent", "shape": [18446744073709551615]})"},
      {"too_big_integer",
       R"({"id": "t", "op": "extent", "shape": [123456789012345678901234567890]})"},
      {"extent_overflow",
       R"({"id": "t", "op": "extent", "shape": [3, 3], "stride": [4611686018427387904, 1]})"},
      {"contiguous_overflow", R"({"id": "t", "op": "extent", "shape": [8, 4611686018427387904]})"},
      {"numel_overflow_zero_strides",
       R"({"id": "t", "op": "storage_view", "storage_nbytes": 1, "dtype": "uint8", "shape": [4294967296, 4294967296], "stride": [0, 0]})"},
      {"bytes_overflow",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": "float64", "shape": [2], "stride": [2305843009213693952]}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"offset_overflow",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": "uint8", "shape": [2], "offset": 9223372036854775807}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"huge_storage",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": "uint8", "shape": [1], "storage_nbytes": 9223372036854775807}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"huge_tensor",
       R"({"id": "t", "op": "set_weight_attrs", "tensor": {"dtype": "float64", "shape": [1073741824]}, "weight_attrs": null})"},
      {"huge_storage_view",
       R"({"id": "t", "op": "storage_view", "storage_nbytes": 4611686018427387904, "dtype": "uint8", "shape": [1]})"},
      {"many_storages",
       R"({"id": "t", "op": "layer_script", "tensors": [{"name": "a", "dtype": "uint8", "shape": [1073741824]}, {"name": "b", "dtype": "uint8", "shape": [1]}], "steps": []})"},
      // Layouts that do not fit.
      {"not_fitting",
       R"({"id": "t", "op": "in_own_storage", "old": {"dtype": "int32", "shape": [4], "storage_nbytes": 15}, "new": {"dtype": "uint8", "shape": [1]}})"},
      {"view_beyond_old",
       R"({"id": "t", "op": "replace_parameter", "old": {"dtype": "uint8", "shape": [4]}, "new": {"dtype": "int32", "shape": [1], "offset": 1, "on": "old"}})"},
      {"storage_view_beyond",
       R"({"id": "t", "op": "storage_view", "storage_nbytes": 3, "dtype": "int32", "shape": [1]})"},
  };
  return *cases;
}

class HostileInputTest : public testing::TestWithParam<HostileCase> {};

TEST_P(HostileInputTest, YieldsAnErrorLine) {
  const Json result = evaluate(GetParam().line);
  ASSERT_TRUE(result.contains("error")) << result.dump();
  EXPECT_TRUE(result["error"].is_string());
  EXPECT_FALSE(result["error"].get<std::string>().empty());
  // An error line holds the id and the error, nothing else.
  EXPECT_EQ(result.size(), 2u) << result.dump();
}

INSTANTIATE_TEST_SUITE_P(Table, HostileInputTest, testing::ValuesIn(hostile_cases()),
                         [](const testing::TestParamInfo<HostileCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(HostileInputTest, ErrorLinesEchoTheId) {
  EXPECT_EQ(evaluate(R"({"id": "x-1", "op": "nope"})")["id"], "x-1");
  EXPECT_EQ(evaluate(R"({"id": 17, "op": "nope"})")["id"], 17);
  EXPECT_TRUE(evaluate(R"({"op": "nope"})")["id"].is_null());
  EXPECT_TRUE(evaluate(R"({"id": "x-1", "op": )")["id"].is_null());  // unreadable: no id
}

// Every prefix of a valid case is malformed JSON (except the whole line).
TEST(HostileInputTest, EveryTruncationIsAnError) {
  const std::string line =
      R"({"id": "L", "op": "layer_script", "uses_meta_device": false, "tensors": [{"name": "w", "kind": "parameter", "dtype": "uint8", "shape": [4], "attrs": {"weight_loader": "L"}}], "steps": [{"do": "set", "name": "weight", "tensor": "w"}, {"do": "kernel_parameters"}]})";
  for (size_t n = 0; n < line.size(); ++n) {
    const Json result = evaluate(line.substr(0, n));
    EXPECT_TRUE(result.contains("error")) << "prefix of " << n << " bytes: " << result.dump();
  }
  EXPECT_FALSE(evaluate(line).contains("error"));
}

// Random byte changes to valid cases: every result is either an error line
// (the id and a message, nothing else) or a full result with the keys the
// unchanged case has. Both kinds must occur, or the mutations test nothing.
TEST(HostileInputTest, MutatedCasesYieldAnErrorOrAFullResult) {
  const std::vector<std::string> seeds = {
      R"({"id": "S", "op": "in_own_storage", "whole_storage": true, "old": {"dtype": "uint8", "shape": [8], "storage_nbytes": 32}, "new": {"dtype": "int32", "shape": [4], "stride": [1]}})",
      R"({"id": "R", "op": "replace_parameter", "direct_reload": true, "uses_meta_device": false, "old": {"kind": "parameter", "dtype": "uint8", "shape": [16], "attrs": {"weight_loader": "L"}}, "new": {"kind": "tensor", "dtype": "int32", "shape": [2], "offset": 1, "on": "old"}})",
      R"({"id": "C", "op": "copy_weight", "integrated": true, "dst": {"dtype": "int16", "shape": [2, 2], "stride": [1, 2]}, "src": {"dtype": "int8", "shape": [2]}})",
      R"({"id": "V", "op": "storage_view", "storage_nbytes": 16, "dtype": "int32", "shape": [2, 2], "stride": [1, 2], "offset": 0})",
      R"({"id": "M", "op": "get_moe_expert_mapping", "modules": [{"path": "a.b", "mapping": [["p", "w", 0, "s"]]}]})",
  };
  const std::string alphabet = "0123456789-[]{}\",:.e9 ntfa\\";
  std::mt19937 rng(1234);
  for (const std::string& seed : seeds) {
    const Json expected = evaluate(seed);
    ASSERT_FALSE(expected.contains("error")) << expected.dump();
    std::vector<std::string> keys;
    for (const auto& item : expected.items()) keys.push_back(item.key());
    int errors = 0;
    int results = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::string line = seed;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        line[rng() % line.size()] = alphabet[rng() % alphabet.size()];
      }
      const Json result = evaluate(line);
      if (result.contains("error")) {
        ++errors;
        ASSERT_TRUE(result["error"].is_string()) << line << "\n" << result.dump();
        EXPECT_FALSE(result["error"].get<std::string>().empty()) << line;
        EXPECT_EQ(result.size(), 2u) << line << "\n" << result.dump();
        continue;
      }
      ++results;
      std::vector<std::string> got;
      for (const auto& item : result.items()) got.push_back(item.key());
      // A case that still evaluates has the same outputs, except that a
      // replace_parameter case whose old layout became null reports no
      // old_storage.
      if (got != keys) {
        std::vector<std::string> without_old_storage = keys;
        without_old_storage.erase(
            std::remove(without_old_storage.begin(), without_old_storage.end(), "old_storage"),
            without_old_storage.end());
        EXPECT_EQ(got, without_old_storage) << line << "\n" << result.dump();
      }
    }
    SCOPED_TRACE(seed);
    EXPECT_GT(errors, 0);
    EXPECT_GT(results, 0);
  }
}

// The documented examples of case-format.md, with their output shapes.
TEST(CaseFormatTest, ExtentExample) {
  EXPECT_EQ(evaluate_case(R"({"id": "E2", "op": "extent", "shape": [4, 4], "stride": [1, 4]})"),
            R"({"id":"E2","extent":16})");
}

TEST(CaseFormatTest, InOwnStorageExample) {
  const Json r = evaluate(
      R"({"id": "S4", "op": "in_own_storage", "whole_storage": false, "old": {"dtype": "uint8", "shape": [16, 64]}, "new": {"dtype": "int32", "shape": [4, 64]}})");
  EXPECT_EQ(r["placed"], true);
  EXPECT_EQ(
      r["result"],
      Json::parse(
          R"({"dtype": "int32", "shape": [4, 64], "stride": [64, 1], "byte_offset": 0, "storage": "old"})"));
  EXPECT_EQ(r["old_storage"]["nbytes"], 1024);
  EXPECT_EQ(r["old_storage"]["moved"], false);
  // new's bytes, pattern (11 i + 171) mod 256, now fill the old storage.
  const std::string hex = r["old_storage"]["hex"];
  EXPECT_EQ(hex.substr(0, 8), "abb6c1cc");
}

TEST(CaseFormatTest, ReplaceParameterExample) {
  const Json r = evaluate(
      R"({"id": "R6", "op": "replace_parameter", "direct_reload": false, "uses_meta_device": false, "old": {"kind": "parameter", "dtype": "uint8", "shape": [16, 64], "attrs": {"weight_loader": "L"}}, "new": {"kind": "tensor", "dtype": "int32", "shape": [4, 64], "attrs": {"is_shuffled": true}}})");
  EXPECT_EQ(
      r["param"],
      Json::parse(R"({"kind": "parameter", "same_object": true, "dtype": "int32", "shape": [4, 64],
                            "stride": [64, 1], "byte_offset": 0, "storage": "old",
                            "attrs": {"weight_loader": "L", "is_shuffled": true}})"));
  EXPECT_EQ(r["old_storage"]["moved"], false);
}

TEST(CaseFormatTest, OldStoragePatternAndBoolOwners) {
  // Nothing fits (new is larger), so the old storage keeps pattern 0.
  Json r = evaluate(
      R"({"id": "p", "op": "in_own_storage", "old": {"dtype": "uint8", "shape": [3]}, "new": {"dtype": "uint8", "shape": [4]}})");
  EXPECT_EQ(r["old_storage"]["hex"], "0d141b");
  r = evaluate(
      R"({"id": "b", "op": "in_own_storage", "old": {"dtype": "bool", "shape": [3]}, "new": {"dtype": "uint8", "shape": [4]}})");
  EXPECT_EQ(r["old_storage"]["hex"], "010001");
  r = evaluate(
      R"({"id": "m", "op": "in_own_storage", "old": {"dtype": "uint8", "shape": [3], "device": "meta"}, "new": {"dtype": "uint8", "shape": [4]}})");
  EXPECT_FALSE(r["old_storage"].contains("hex"));
}

TEST(RunCasesTest, OneLinePerCaseInOrderSkippingBlankLines) {
  std::istringstream in(
      "{\"id\": 1, \"op\": \"extent\", \"shape\": [2]}\n"
      "\n"
      "   \n"
      "{\"id\": 2, \"op\": \"extent\", \"shape\": [\n"
      "{\"id\": 3, \"op\": \"extent\", \"shape\": [3]}\r\n");
  std::ostringstream out;
  EXPECT_EQ(run_cases(in, out), 3);
  std::istringstream lines(out.str());
  std::string line;
  std::vector<Json> results;
  while (std::getline(lines, line)) results.push_back(Json::parse(line));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0]["extent"], 2);
  EXPECT_TRUE(results[1].contains("error"));
  EXPECT_EQ(results[2]["extent"], 3);
}

}  // namespace
}  // namespace reloadsafe::conformance
