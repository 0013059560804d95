#include "utils/reload_context.h"

namespace reloadsafe {
namespace {
// Decision: both flags are per thread. Post-processing of one model runs on
// one thread; a loader thread of another model must not see this one's flags.
thread_local bool direct_reload = false;
thread_local bool pre_processed = false;
}  // namespace

bool direct_reload_enabled() {
  return direct_reload;
}

DirectReloadScope::DirectReloadScope(bool enabled) : previous_(direct_reload) {
  direct_reload = enabled;
}

DirectReloadScope::~DirectReloadScope() {
  direct_reload = previous_;
}

bool weights_pre_processed() {
  return pre_processed;
}

WeightsAlreadyProcessed::WeightsAlreadyProcessed() : previous_(pre_processed) {
  pre_processed = true;
}

WeightsAlreadyProcessed::~WeightsAlreadyProcessed() {
  pre_processed = previous_;
}

}  // namespace reloadsafe
