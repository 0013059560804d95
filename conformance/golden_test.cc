// golden_test.cc: runs every golden case file (golden/<area>.jsonl) through
// the case runner and compares each result line with the line of the same
// position in golden/<area>.expected.jsonl, byte for byte.
//
// Regeneration (after a deliberate change of behaviour or of an error
// message; review the diff before committing it):
//   RELOADSAFE_REGENERATE_GOLDEN=1 bazel run //conformance:golden_test
// reads the case files of the workspace ($BUILD_WORKSPACE_DIRECTORY/golden)
// and rewrites their .expected.jsonl files there.
#include "conformance/case_runner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::conformance {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCaseSuffix = ".jsonl";
constexpr const char* kExpectedSuffix = ".expected.jsonl";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool regenerating() {
  const char* flag = std::getenv("RELOADSAFE_REGENERATE_GOLDEN");
  return flag != nullptr && std::string(flag) == "1";
}

// The golden directory: the workspace's when regenerating, else the runfiles'.
fs::path golden_dir() {
  if (regenerating()) {
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    if (ws == nullptr) return {};
    return fs::path(ws) / "golden";
  }
  std::vector<fs::path> candidates;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* workspace = std::getenv("TEST_WORKSPACE");
    candidates.push_back(fs::path(srcdir) / (workspace ? workspace : "reloadsafe") / "golden");
  }
  if (const char* runfiles = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(fs::path(runfiles) / "reloadsafe" / "golden");
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(fs::path(self.string() + ".runfiles") / "reloadsafe" / "golden");
  candidates.push_back(fs::current_path() / "golden");
  for (const fs::path& dir : candidates) {
    if (fs::is_directory(dir, ec)) return dir;
  }
  return {};
}

// The case files (not the expected files) of `dir`, sorted by name.
std::vector<fs::path> case_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, kCaseSuffix) && !ends_with(name, kExpectedSuffix)) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

fs::path expected_file(const fs::path& cases) {
  const std::string name = cases.filename().string();
  return cases.parent_path() /
         (name.substr(0, name.size() - std::string(kCaseSuffix).size()) + kExpectedSuffix);
}

// The lines of `path` that hold cases or results (blank lines skipped), each
// with its 1-based line number.
std::vector<std::pair<int, std::string>> read_lines(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<std::pair<int, std::string>> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (is_case_line(line)) lines.emplace_back(number, line);
  }
  return lines;
}

std::string id_of(const std::string& result_line) {
  const auto j = nlohmann::json::parse(result_line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id")) return "?";
  return j["id"].dump();
}

TEST(GoldenTest, EveryCaseMatchesItsExpectedResult) {
  const fs::path dir = golden_dir();
  ASSERT_FALSE(dir.empty()) << (regenerating()
                                    ? "RELOADSAFE_REGENERATE_GOLDEN=1 needs `bazel run` "
                                      "(BUILD_WORKSPACE_DIRECTORY is not set)"
                                    : "cannot find the golden directory in the runfiles");
  const std::vector<fs::path> files = case_files(dir);
  ASSERT_FALSE(files.empty()) << "no golden case files in " << dir;

  int64_t total = 0;
  for (const fs::path& cases : files) {
    SCOPED_TRACE(cases.filename().string());
    const auto case_lines = read_lines(cases);
    std::vector<std::string> actual;
    for (const auto& [number, line] : case_lines) actual.push_back(evaluate_case(line));
    total += static_cast<int64_t>(actual.size());

    if (regenerating()) {
      std::ofstream out(expected_file(cases), std::ios::trunc);
      for (const std::string& line : actual) out << line << '\n';
      ASSERT_TRUE(out.good()) << "cannot write " << expected_file(cases);
      std::cout << "wrote " << expected_file(cases) << " (" << actual.size() << " results)\n";
      continue;
    }

    ASSERT_TRUE(fs::exists(expected_file(cases)))
        << expected_file(cases).filename() << " is missing; write it (see golden/FORMAT.md)";
    const auto expected = read_lines(expected_file(cases));
    EXPECT_EQ(expected.size(), actual.size())
        << cases.filename() << " has " << actual.size() << " cases but "
        << expected_file(cases).filename() << " has " << expected.size() << " results";
    int reported = 0;
    for (size_t i = 0; i < std::min(expected.size(), actual.size()); ++i) {
      if (expected[i].second == actual[i]) continue;
      if (++reported > 20) {
        ADD_FAILURE() << "more mismatches in " << cases.filename() << " not shown";
        break;
      }
      ADD_FAILURE() << "golden/" << cases.filename().string() << " line " << case_lines[i].first
                    << ", case " << id_of(actual[i]) << ":\n  expected: " << expected[i].second
                    << "\n  actual:   " << actual[i];
    }
  }
  std::cout << "evaluated " << total << " golden cases in " << files.size() << " files\n";
}

}  // namespace
}  // namespace reloadsafe::conformance
