// weights_already_processed: what weights_pre_processed() reads in and
// around nested WeightsAlreadyProcessed scopes, on unwinding, and on a new
// thread (golden/FORMAT.md).

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/ops/operation.h"
#include "utils/reload_context.h"

#include <c10/util/Exception.h>

#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace reloadsafe::conformance {

void run_weights_already_processed(const Json& c, OJson& out) {
  // Bound that keeps hostile cases from exhausting the stack.
  constexpr int64_t kMaxScopeDepth = 64;
  const int64_t depth = as_int(required(c, "depth", "the case"), "depth");
  TORCH_CHECK(depth >= 0 && depth <= kMaxScopeDepth, "depth must be in [0, ", kMaxScopeDepth,
              "], not ", depth);
  const bool raise = opt_bool(c, "throw", false);
  std::vector<bool> seen{weights_pre_processed()};
  bool new_thread = true;
  std::function<void(int64_t)> enter = [&](int64_t level) {
    if (level == depth) {
      std::thread([&new_thread] { new_thread = weights_pre_processed(); }).join();
      if (raise) throw std::runtime_error("thrown inside the innermost scope");
      return;
    }
    {
      WeightsAlreadyProcessed scope;
      seen.push_back(weights_pre_processed());
      enter(level + 1);
    }
    seen.push_back(weights_pre_processed());
  };
  try {
    enter(0);
  } catch (const std::runtime_error&) {
    seen.push_back(weights_pre_processed());
  }
  out["observed"] = seen;
  out["new_thread"] = new_thread;
}

}  // namespace reloadsafe::conformance
