#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/backends/zoo_doc.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Where `have` and `want` part, with a line of context on either side.
std::string first_difference(const std::string& have, const std::string& want) {
  const std::vector<std::string> a = lines_of(have), b = lines_of(want);
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  std::ostringstream os;
  os << "first difference at line " << at + 1 << ":\n";
  const size_t from = at == 0 ? 0 : at - 1;
  for (size_t i = from; i < at + 2 && i < a.size(); ++i) os << "  committed: " << a[i] << "\n";
  for (size_t i = from; i < at + 2 && i < b.size(); ++i) os << "  generated: " << b[i] << "\n";
  if (a.size() != b.size()) os << a.size() << " lines committed, " << b.size() << " generated\n";
  return os.str();
}

// docs/bug-zoo-cpp.md (a data dependency of this test) is what the rows and
// the backends give now.
TEST(ZooDoc, TheCommittedDocIsWhatTheRowsGiveNow) {
  std::ifstream in("docs/bug-zoo-cpp.md", std::ios::binary);
  ASSERT_TRUE(in) << "docs/bug-zoo-cpp.md is not among the test's data";
  const std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string want = zoo_doc();
  EXPECT_TRUE(have == want) << "docs/bug-zoo-cpp.md is stale: run tools/gen_bug_zoo_cpp.sh and "
                               "review the diff\n"
                            << first_difference(have, want);
}

// Runs in one process put tensors at other addresses; the text must not
// change, and must hold no address.
TEST(ZooDoc, TheTextIsTheSameOnEveryRunAndHoldsNoAddress) {
  const std::string first = zoo_doc();
  const std::string second = zoo_doc();
  EXPECT_TRUE(first == second) << first_difference(first, second);
  EXPECT_EQ(first.find("0x"), std::string::npos) << "an address in the doc";
}

TEST(ZooDoc, EveryRowHasItsLineInTheTableAndItsSection) {
  const std::string doc = zoo_doc();
  ASSERT_FALSE(zoo_rows().empty());
  for (const ZooRow& row : zoo_rows()) {
    SCOPED_TRACE(row.id);
    EXPECT_NE(doc.find("\n| " + row.id + " | " + row.thread + " | "), std::string::npos);
    EXPECT_NE(doc.find("\n## " + row.id + " · `" + row.buggy + "` / `" + row.fixed + "`\n"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace reloadsafe::harness
