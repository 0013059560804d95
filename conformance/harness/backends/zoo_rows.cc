#define TORCH_ASSERT_NO_OPERATORS

#include "conformance/harness/backends/zoo_rows.h"

#include <c10/util/Exception.h>

namespace reloadsafe::harness {
namespace {

std::vector<ZooRow>& registry() {
  static auto* rows = new std::vector<ZooRow>();
  return *rows;
}

}  // namespace

bool register_zoo_row(ZooRow row) {
  TORCH_CHECK(!row.id.empty() && !row.thread.empty(), "a zoo row needs its id and its thread");
  TORCH_CHECK(!row.buggy.empty() && !row.fixed.empty() && row.buggy != row.fixed, "zoo row ",
              row.id, " needs a buggy and a fixed backend, two of them");
  TORCH_CHECK(!row.flagged.empty(), "zoo row ", row.id,
              " names nothing the buggy backend must be flagged with");
  for (const ZooRow& other : registry()) {
    TORCH_CHECK(other.id != row.id, "zoo row ", row.id, " is registered twice");
    for (const std::string& name : {row.buggy, row.fixed}) {
      TORCH_CHECK(name != other.buggy && name != other.fixed, "zoo rows ", other.id, " and ",
                  row.id, " both name the backend ", name);
    }
  }
  registry().push_back(std::move(row));
  return true;
}

const std::vector<ZooRow>& zoo_rows() {
  return registry();
}

const ZooRow* find_zoo_row(const std::string& backend) {
  for (const ZooRow& row : registry()) {
    if (row.buggy == backend || row.fixed == backend) return &row;
  }
  return nullptr;
}

}  // namespace reloadsafe::harness
