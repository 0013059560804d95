#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/ops/operation.h"

#include <map>

namespace reloadsafe::conformance {

Operation find_operation(const std::string& name) {
  static const auto* table = new std::map<std::string, Operation>{
#define RS_CASE_OPERATION(name) {#name, &run_##name},
#include "conformance/ops/operations.inc"
#undef RS_CASE_OPERATION
  };
  auto it = table->find(name);
  return it == table->end() ? nullptr : it->second;
}

}  // namespace reloadsafe::conformance
