// The report formats: the JSON schema's fields (which the Python API and
// downstream tools read by name) and the table's cells, verdicts and listed
// lines.

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/report_format.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

using nlohmann::json;

ModeReport clean_mode(ReloadMode m) {
  ModeReport r;
  r.mode = m;
  r.reloads_done = 3;
  r.declared_reads = 2;
  r.undeclared_reads = 1;
  r.memory_bytes = {64, 64, 64, 64};
  return r;
}

Violation moved(int reload, std::string tensor) {
  return Violation{reload, std::move(tensor), "address", "0x10", "0x20", ""};
}

// A sample with one violation in its direct mode.
BackendReport failing_sample() {
  BackendReport r;
  r.name = "sample";
  r.description = "a sample";
  r.modes = {clean_mode(ReloadMode::kNormal), clean_mode(ReloadMode::kDirect)};
  ModeReport& direct = r.modes[1];
  direct.violation_count = 1;
  direct.flagged = {"weight", "aten::mm arg 1 (mat2)"};
  direct.violations = {{2, "weight", "address", "0x10", "0x20", "aten::mm arg 1 (mat2)"}};
  direct.warnings = {{"scale", "aten::mul.Tensor arg 1 (other)", "undeclared, stays put"}};
  return r;
}

RunOptions run_options() {
  RunOptions o;
  o.reloads = 3;
  o.seed = 7;
  o.trace = false;
  return o;
}

TEST(ToJson, WritesTheRunsOptionsAndEveryFieldOfTheSchema) {
  const json j = json::parse(to_json({failing_sample()}, run_options()));
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["reloads"], 3);
  EXPECT_EQ(j["seed"], 7);
  EXPECT_EQ(j["trace"], false);
  ASSERT_EQ(j["backends"].size(), 1u);
  const json& b = j["backends"][0];
  EXPECT_EQ(b["name"], "sample");
  EXPECT_EQ(b["description"], "a sample");
  EXPECT_EQ(b["negative_control"], false);
  EXPECT_FALSE(b.contains("expected_violation")) << "only a negative control names one";
  EXPECT_EQ(b["ok"], false);
  ASSERT_TRUE(b["modes"].contains("normal"));
  ASSERT_TRUE(b["modes"].contains("direct"));

  const json& normal = b["modes"]["normal"];
  struct Field {
    const char* name;
    json value;
  };
  const Field normal_fields[] = {
      {"expected_to_pass", true},
      {"reloads_done", 3},
      {"violation_count", 0},
      {"declared_reads", 2},
      {"undeclared_reads", 1},
      {"flagged", json::array()},
      {"violations", json::array()},
      {"warnings", json::array()},
      {"memory_bytes", {64, 64, 64, 64}},
      {"graph_replays", 0},
  };
  for (const Field& f : normal_fields) {
    SCOPED_TRACE(f.name);
    ASSERT_TRUE(normal.contains(f.name));
    EXPECT_EQ(normal[f.name], f.value);
  }
  EXPECT_FALSE(normal.contains("error")) << "written only where a mode has one";

  const json& direct = b["modes"]["direct"];
  EXPECT_EQ(direct["violation_count"], 1);
  EXPECT_EQ(direct["flagged"], json({"weight", "aten::mm arg 1 (mat2)"}));
  const json violations = {{{"reload", 2},
                            {"tensor", "weight"},
                            {"what", "address"},
                            {"before", "0x10"},
                            {"after", "0x20"},
                            {"read", "aten::mm arg 1 (mat2)"}}};
  EXPECT_EQ(direct["violations"], violations);
  const json warnings = {{{"tensor", "scale"},
                          {"read", "aten::mul.Tensor arg 1 (other)"},
                          {"message", "undeclared, stays put"}}};
  EXPECT_EQ(direct["warnings"], warnings);
}

TEST(ToJson, WritesAnErrorWholeAndAnUntracedViolationWithoutARead) {
  BackendReport r = failing_sample();
  r.modes[0].error = "first line\nrelease: second line";
  r.modes[1].violations = {moved(1, "weight")};
  const json j = json::parse(to_json({r}, run_options()));
  const json& modes = j["backends"][0]["modes"];
  EXPECT_EQ(modes["normal"]["error"], "first line\nrelease: second line");
  EXPECT_FALSE(modes["direct"]["violations"][0].contains("read"));
}

TEST(ToJson, NamesANegativeControlsExpectedViolation) {
  BackendReport r = failing_sample();
  r.negative_control = true;
  r.expected_violation = "weight";
  const json b = json::parse(to_json({r}, run_options()))["backends"][0];
  EXPECT_EQ(b["negative_control"], true);
  EXPECT_EQ(b["expected_violation"], "weight");
  EXPECT_EQ(b["ok"], true);
}

TEST(ToJson, ReplacesBytesThatAreNotUtf8) {
  BackendReport r = failing_sample();
  r.modes[0].error = "device \xff";
  const json j = json::parse(to_json({r}, run_options()));
  EXPECT_EQ(j["backends"][0]["modes"]["normal"]["error"], "device \xef\xbf\xbd");
}

// The first line of the table that starts with `prefix`, or "" if none.
std::string line_starting(const std::string& table, const std::string& prefix) {
  size_t at = 0;
  while (at < table.size()) {
    const size_t end = table.find('\n', at);
    const std::string line = table.substr(at, end == std::string::npos ? end : end - at);
    if (line.rfind(prefix, 0) == 0) return line;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ToTable, GivesEachBackendItsCellsAndVerdict) {
  struct Row {
    const char* name;
    BackendReport report;
    std::vector<std::string> in_line;  ///< in the backend's line, in order
  };
  BackendReport pass = failing_sample();
  pass.name = "passes";
  pass.modes[1] = clean_mode(ReloadMode::kDirect);
  BackendReport fail = failing_sample();
  fail.name = "fails";
  BackendReport unclaimed = failing_sample();
  unclaimed.name = "unclaimed";
  unclaimed.modes[1].expected_to_pass = false;
  BackendReport error = failing_sample();
  error.name = "errs";
  error.modes[0].error = "boom";
  BackendReport flagged = failing_sample();
  flagged.name = "flagged";
  flagged.negative_control = true;
  flagged.expected_violation = "weight";
  BackendReport missed = flagged;
  missed.name = "missed";
  missed.expected_violation = "bias";
  const Row rows[] = {
      {"pass", pass, {"kept", "kept", "2/1", "pass"}},
      {"fail", fail, {"kept", "1 violations, 1 warn", "2/1", "FAIL"}},
      {"unclaimed", unclaimed, {"kept", "1 violations, 1 warn (not claimed)", "pass"}},
      {"error", error, {"error", "1 violations", "FAIL"}},
      {"negative control flagged", flagged, {"flagged (negative control)"}},
      {"negative control missed", missed, {"NOT FLAGGED"}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const std::string table = to_table({row.report});
    EXPECT_EQ(table.rfind("backend", 0), 0u) << table;
    const std::string line = line_starting(table, row.report.name + " ");
    ASSERT_FALSE(line.empty()) << table;
    size_t at = 0;
    for (const std::string& part : row.in_line) {
      at = line.find(part, at);
      ASSERT_NE(at, std::string::npos) << "'" << part << "' in '" << line << "'";
      at += part.size();
    }
  }
}

// Three violations and three warnings per mode in full; the rest counted,
// with every name flagged, so a layer with five rebuilt tensors shows five.
TEST(ToTable, ListsThreeViolationsAndWarningsPerModeAndCountsTheRestWithEveryNameFlagged) {
  BackendReport r = failing_sample();
  ModeReport& direct = r.modes[1];
  direct.violations.clear();
  direct.flagged.clear();
  for (int i = 1; i <= 5; ++i) {
    direct.violations.push_back(moved(i, "w" + std::to_string(i)));
    direct.flagged.push_back("w" + std::to_string(i));
  }
  direct.warnings.assign(5, direct.warnings[0]);
  direct.violation_count = 5;
  const std::string table = to_table({r});
  EXPECT_EQ(count(table, "  sample [direct] reload "), 3u) << table;
  EXPECT_EQ(count(table, "  sample [direct] warning: "), 3u) << table;
  EXPECT_NE(table.find("  sample [direct] reload 1: w1 address: 0x10 -> 0x20\n"), std::string::npos)
      << table;
  EXPECT_NE(table.find("  sample [direct] and 2 more violations; flagged: w1, w2, w3, w4, w5\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("  sample [direct] and 2 more warnings\n"), std::string::npos) << table;
}

TEST(ToTable, LinesUpAMultiLineErrorUnderItsFirstLine) {
  BackendReport r = failing_sample();
  r.modes[0].error = "first\nsecond\nrelease: third";
  const std::string table = to_table({r});
  const std::string head = "  sample [normal] error: ";
  const std::string indent(head.size(), ' ');
  EXPECT_NE(table.find(head + "first\n" + indent + "second\n" + indent + "release: third\n"),
            std::string::npos)
      << table;
}

}  // namespace
}  // namespace reloadsafe::harness
