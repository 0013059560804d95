// golden_model_test.cc: the golden expectations, checked against the
// independent model of the specification (fuzz/spec_model.h).
//
// The expected files (golden/<area>.expected.jsonl) are written by the runner
// itself when they are regenerated, so a bug in the runner or the utilities
// could be regenerated into place. This test recomputes, from each case
// alone and with the model's 128-bit arithmetic, what every expected result
// of the operations the model covers must say:
//  - extent: the model's `_extent` (or an error exactly when it overflows);
//  - in_own_storage: whether new is placed (model::places), and the layout,
//    byte offset and storage of the result;
//  - storage_view: a view exactly when the layout ends within the storage.
// It never calls the runner or the utilities.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "fuzz/spec_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace reloadsafe::conformance {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using fuzz::model::Int128;

// The golden folder in the runfiles.
fs::path golden_dir() {
  std::vector<fs::path> candidates;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* workspace = std::getenv("TEST_WORKSPACE");
    candidates.push_back(fs::path(srcdir) / (workspace ? workspace : "reloadsafe") / "golden");
  }
  candidates.push_back(fs::current_path() / "golden");
  std::error_code ec;
  for (const fs::path& dir : candidates) {
    if (fs::is_directory(dir, ec)) return dir;
  }
  return {};
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r\n") != std::string::npos) lines.push_back(line);
  }
  return lines;
}

// Element sizes by case-format dtype name (golden/FORMAT.md).
std::optional<int64_t> itemsize(const Json& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"bool", 1},    {"uint8", 1},   {"int8", 1},          {"int16", 2},
      {"int32", 4},   {"int64", 8},   {"float16", 2},       {"bfloat16", 2},
      {"float32", 4}, {"float64", 8}, {"float8_e4m3fn", 1}, {"float8_e5m2", 1}};
  if (!dtype.is_string()) return std::nullopt;
  auto it = sizes.find(dtype.get<std::string>());
  return it == sizes.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

// A JSON array of integers in [0, INT64_MAX].
std::optional<std::vector<int64_t>> sizes_of(const Json& v) {
  if (!v.is_array()) return std::nullopt;
  std::vector<int64_t> out;
  for (const Json& x : v) {
    if (!x.is_number_integer() || (!x.is_number_unsigned() && x.get<int64_t>() < 0)) {
      return std::nullopt;
    }
    if (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return std::nullopt;
    }
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// PyTorch's contiguous strides, or nullopt when one exceeds int64.
std::optional<std::vector<int64_t>> contiguous(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  Int128 acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (acc > fuzz::model::kInt64Max) return std::nullopt;
    stride[i] = static_cast<int64_t>(acc);
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return stride;
}

// A layout as the model sees it; nullopt for one the model does not describe
// (bad field types, unknown dtype or device); the runner rejects those.
struct ModelLayout {
  int64_t itemsize = 1;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t offset = 0;
  std::optional<int64_t> span;
  std::optional<int64_t> storage_nbytes;  // nullopt: "on" another tensor
  std::string device = "cpu";
  bool on = false;
};

std::optional<ModelLayout> layout_of(const Json& j) {
  if (!j.is_object() || !j.contains("shape")) return std::nullopt;
  ModelLayout l;
  const auto size = itemsize(j.value("dtype", Json()));
  const auto shape = sizes_of(j["shape"]);
  if (!size || !shape) return std::nullopt;
  l.itemsize = *size;
  l.dtype = j["dtype"];
  l.shape = *shape;
  const auto stride = j.contains("stride") ? sizes_of(j["stride"]) : contiguous(l.shape);
  if (!stride || stride->size() != l.shape.size()) return std::nullopt;
  l.stride = *stride;
  if (j.contains("offset")) {
    const auto offset = sizes_of(Json::array({j["offset"]}));
    if (!offset) return std::nullopt;
    l.offset = (*offset)[0];
  }
  if (j.contains("device")) {
    if (!j["device"].is_string()) return std::nullopt;
    l.device = j["device"];
  }
  l.span = fuzz::model::extent(l.shape, l.stride);
  l.on = j.contains("on");
  if (!l.on && l.span) {
    const Int128 needed = (static_cast<Int128>(l.offset) + *l.span) * l.itemsize;
    if (needed > fuzz::model::kInt64Max) return std::nullopt;
    l.storage_nbytes = static_cast<int64_t>(needed);
    if (j.contains("storage_nbytes")) {
      const auto n = sizes_of(Json::array({j["storage_nbytes"]}));
      if (!n || (*n)[0] < needed) return std::nullopt;
      l.storage_nbytes = (*n)[0];
    }
  }
  return l;
}

// What the model says an expected result must hold: "" when it agrees, what
// differs when it does not, nullopt for a case the model does not describe.
using Verdict = std::optional<std::string>;

Verdict check_extent(const Json& c, const Json& expected) {
  const auto shape = c.contains("shape") ? sizes_of(c["shape"]) : std::nullopt;
  if (!shape) return std::nullopt;
  const auto stride = c.contains("stride") ? sizes_of(c["stride"]) : contiguous(*shape);
  if (c.contains("stride") && (!stride || stride->size() != shape->size())) return std::nullopt;
  const std::optional<int64_t> span = stride ? fuzz::model::extent(*shape, *stride) : std::nullopt;
  if (!span) {
    return expected.contains("error") ? ""
                                      : "the model's extent overflows int64, expected an error";
  }
  if (expected.contains("error")) return "the model's extent is " + std::to_string(*span);
  return expected.value("extent", Json()) == *span
             ? ""
             : "extent " + expected.value("extent", Json()).dump() + " but the model says " +
                   std::to_string(*span);
}

Verdict check_in_own_storage(const Json& c, const Json& expected) {
  if (expected.contains("error")) return std::nullopt;  // the runner's own checks
  const auto old_layout = layout_of(c.value("old", Json()));
  const auto new_layout = layout_of(c.value("new", Json()));
  if (!old_layout || !new_layout || old_layout->on || !old_layout->span) return std::nullopt;
  fuzz::model::FitQuery q;
  q.old_itemsize = old_layout->itemsize;
  q.old_numel = fuzz::model::numel(old_layout->shape);
  q.old_span = old_layout->span;
  q.old_offset = old_layout->offset;
  q.storage_nbytes = *old_layout->storage_nbytes;
  q.new_itemsize = new_layout->itemsize;
  q.new_numel = fuzz::model::numel(new_layout->shape);
  q.new_span = new_layout->span;
  const std::string new_device = new_layout->on ? old_layout->device : new_layout->device;
  q.same_device = old_layout->device == new_device;
  // Storages without bytes (meta, or zero bytes) have no data pointer.
  const bool old_null = old_layout->device == "meta" || *old_layout->storage_nbytes == 0;
  const bool new_null =
      !new_layout->on && (new_layout->device == "meta" || new_layout->storage_nbytes == 0);
  q.same_data_ptr = new_layout->on || (old_null && new_null);
  q.whole_storage = c.contains("whole_storage") && c["whole_storage"] == true;
  const bool placed = fuzz::model::places(q);

  Json result = {
      {"dtype", new_layout->dtype}, {"shape", new_layout->shape}, {"stride", new_layout->stride}};
  if (placed) {
    result["byte_offset"] = old_layout->offset * old_layout->itemsize;
    result["storage"] = "old";
  } else {
    result["byte_offset"] = new_layout->offset * new_layout->itemsize;
    result["storage"] = new_layout->on ? "old" : "new";
  }
  if (expected.value("placed", Json()) != placed) {
    return std::string("placed is ") + expected.value("placed", Json()).dump() +
           " but the model says " + (placed ? "true" : "false");
  }
  if (expected.value("result", Json()) != result) {
    return "result " + expected.value("result", Json()).dump() + " but the model says " +
           result.dump();
  }
  return "";
}

Verdict check_storage_view(const Json& c, const Json& expected) {
  if (c.contains("on") || !c.contains("storage_nbytes")) return std::nullopt;
  Json layout = c;
  layout.erase("storage_nbytes");
  const auto l = layout_of(layout);
  const auto nbytes = sizes_of(Json::array({c["storage_nbytes"]}));
  if (!l || !nbytes || !l->span) return std::nullopt;
  const bool fits = (static_cast<Int128>(l->offset) + *l->span) * l->itemsize <=
                    static_cast<Int128>((*nbytes)[0]);
  if (fits == expected.contains("error")) {
    return std::string("the model says the view ") + (fits ? "fits" : "does not fit") +
           " its storage, but the expected line " + (fits ? "is an error" : "has a view");
  }
  if (!fits) return "";
  const Json view = {{"dtype", l->dtype},
                     {"shape", l->shape},
                     {"stride", l->stride},
                     {"byte_offset", l->offset * l->itemsize},
                     {"storage", "same"}};
  return expected.value("view", Json()) == view ? ""
                                                : "view " + expected.value("view", Json()).dump() +
                                                      " but the model says " + view.dump();
}

// The check for an operation the model covers; nullptr for the others.
using Check = Verdict (*)(const Json&, const Json&);
// Nesting depth of arrays and objects (the runner refuses more than 64).
int depth_of(const Json& j) {
  if (!j.is_structured()) return 0;
  int deepest = 0;
  for (const Json& child : j) deepest = std::max(deepest, depth_of(child));
  return deepest + 1;
}

std::string op_of(const Json& c) {
  return c.contains("op") && c["op"].is_string() ? c["op"].get<std::string>() : "";
}

Check check_for(const Json& c) {
  const std::string op = op_of(c);
  if (op == "extent") return check_extent;
  if (op == "in_own_storage") return check_in_own_storage;
  if (op == "storage_view") return check_storage_view;
  return nullptr;
}

TEST(GoldenModelTest, ExpectationsAgreeWithTheModel) {
  const fs::path dir = golden_dir();
  ASSERT_FALSE(dir.empty()) << "cannot find the golden directory in the runfiles";
  std::map<std::string, int> checked;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = ".expected.jsonl";
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const fs::path cases_path = dir / (name.substr(0, name.size() - suffix.size()) + ".jsonl");
    const std::vector<std::string> cases = lines_of(cases_path);
    const std::vector<std::string> expected = lines_of(entry.path());
    ASSERT_EQ(cases.size(), expected.size()) << name;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Json c = Json::parse(cases[i], nullptr, /*allow_exceptions=*/false);
      if (!c.is_object() || depth_of(c) > 64) continue;  // not a case the model reads
      const Check check = check_for(c);
      if (check == nullptr) continue;
      const Json e = Json::parse(expected[i]);
      const Verdict problem = check(c, e);
      if (!problem) continue;
      EXPECT_EQ(*problem, "") << name << " case " << (c.contains("id") ? c["id"] : Json()).dump();
      ++checked[op_of(c)];
    }
  }
  // The files hold many cases of each; a count far below means the model
  // skipped them and checked nothing.
  EXPECT_GE(checked["extent"], 15);
  EXPECT_GE(checked["in_own_storage"], 40);
  EXPECT_GE(checked["storage_view"], 10);
  for (const auto& [op, n] : checked) std::cout << op << ": " << n << " cases checked\n";
}

// The checks can fail: wrong expectations of each kind are caught.
TEST(GoldenModelTest, WrongExpectationsAreCaught) {
  // value() throws (and fails the test) if the model skipped the case.
  auto verdict = [](Check check, const char* c, const char* e) {
    return check(Json::parse(c), Json::parse(e)).value();
  };
  const char* extent_case = R"({"op": "extent", "shape": [4, 4], "stride": [1, 4]})";
  EXPECT_EQ(verdict(check_extent, extent_case, R"({"id": 1, "extent": 16})"), "");
  EXPECT_NE(verdict(check_extent, extent_case, R"({"id": 1, "extent": 13})"), "");
  EXPECT_NE(verdict(check_extent, extent_case, R"({"id": 1, "error": "x"})"), "");

  const char* fit_case =
      R"({"op": "in_own_storage", "old": {"dtype": "uint8", "shape": [16]}, "new": {"dtype": "int32", "shape": [4]}})";
  EXPECT_EQ(
      verdict(
          check_in_own_storage, fit_case,
          R"({"placed": true, "result": {"dtype": "int32", "shape": [4], "stride": [1], "byte_offset": 0, "storage": "old"}})"),
      "");
  EXPECT_NE(
      verdict(
          check_in_own_storage, fit_case,
          R"({"placed": false, "result": {"dtype": "int32", "shape": [4], "stride": [1], "byte_offset": 0, "storage": "old"}})"),
      "");
  EXPECT_NE(
      verdict(
          check_in_own_storage, fit_case,
          R"({"placed": true, "result": {"dtype": "int32", "shape": [4], "stride": [1], "byte_offset": 4, "storage": "old"}})"),
      "");

  const char* view_case =
      R"({"op": "storage_view", "storage_nbytes": 3, "dtype": "int32", "shape": [1]})";
  EXPECT_NE(
      verdict(
          check_storage_view, view_case,
          R"({"view": {"dtype": "int32", "shape": [1], "stride": [1], "byte_offset": 0, "storage": "same"}})"),
      "");
  EXPECT_EQ(verdict(check_storage_view, view_case, R"({"error": "x"})"), "");
}

}  // namespace
}  // namespace reloadsafe::conformance
