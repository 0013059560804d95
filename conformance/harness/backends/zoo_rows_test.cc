#define TORCH_ASSERT_NO_OPERATORS

#include "conformance/harness/backends/zoo_rows.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace reloadsafe::harness {
namespace {

// This binary links no backend: the registry holds only what the tests add,
// each row under ids and names of its own.
ZooRow row(const std::string& id) {
  ZooRow r;
  r.id = id;
  r.thread = "example/engine#1";
  r.mechanism_class = "F";
  r.mechanism = "a kernel object made anew on every load";
  r.buggy = "zoo_" + id + "_example_buggy";
  r.fixed = "zoo_" + id + "_example_fixed";
  r.flagged = {"kernel.workspace"};
  return r;
}

TEST(ZooRows, ARegisteredRowIsFoundByEitherOfItsBackends) {
  const size_t before = zoo_rows().size();
  ASSERT_TRUE(register_zoo_row(row("T01")));
  ASSERT_EQ(zoo_rows().size(), before + 1);
  EXPECT_EQ(zoo_rows().back().id, "T01") << "rows keep the order they were registered in";
  ASSERT_NE(find_zoo_row("zoo_T01_example_buggy"), nullptr);
  EXPECT_EQ(find_zoo_row("zoo_T01_example_buggy")->id, "T01");
  EXPECT_EQ(find_zoo_row("zoo_T01_example_fixed"), find_zoo_row("zoo_T01_example_buggy"));
  EXPECT_EQ(find_zoo_row("zoo_T01_example"), nullptr) << "a name is matched whole";
}

TEST(ZooRows, ARowThatLacksAFactOrRepeatsAnotherIsRefused) {
  ASSERT_TRUE(register_zoo_row(row("T02")));
  struct Case {
    const char* what;
    std::function<void(ZooRow&)> change;
    const char* message;
  };
  const Case cases[] = {
      {"no id", [](ZooRow& r) { r.id.clear(); }, "needs its id and its thread"},
      {"no thread", [](ZooRow& r) { r.thread.clear(); }, "needs its id and its thread"},
      {"no fixed backend", [](ZooRow& r) { r.fixed.clear(); }, "a buggy and a fixed backend"},
      {"one backend twice", [](ZooRow& r) { r.fixed = r.buggy; }, "a buggy and a fixed backend"},
      {"nothing flagged", [](ZooRow& r) { r.flagged.clear(); }, "names nothing"},
      {"an id registered", [](ZooRow& r) { r.id = "T02"; }, "T02 is registered twice"},
      {"a backend of another row", [](ZooRow& r) { r.fixed = "zoo_T02_example_buggy"; },
       "both name the backend zoo_T02_example_buggy"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ZooRow bad = row("T03");
    c.change(bad);
    const size_t before = zoo_rows().size();
    try {
      register_zoo_row(bad);
      ADD_FAILURE() << "registered";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(c.message), std::string::npos)
          << e.what_without_backtrace();
    }
    EXPECT_EQ(zoo_rows().size(), before) << "a refused row is not kept";
  }
}

struct ExampleBuggy {
  std::string name() const { return "zoo_T04_from_the_class_buggy"; }
};
struct ExampleFixed {
  std::string name() const { return "zoo_T04_from_the_class_fixed"; }
};

TEST(ZooRows, APairsBackendsAreNamedByTheirClasses) {
  ZooRow r = row("T04");
  r.buggy = r.fixed = "";
  ASSERT_TRUE((register_zoo_pair<ExampleBuggy, ExampleFixed>(r)));
  const ZooRow* found = find_zoo_row("zoo_T04_from_the_class_buggy");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->id, "T04");
  EXPECT_EQ(found->fixed, "zoo_T04_from_the_class_fixed");
}

}  // namespace
}  // namespace reloadsafe::harness
