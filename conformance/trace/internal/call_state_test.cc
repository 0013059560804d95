#include "conformance/trace/internal/call_state.h"

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>

namespace reloadsafe::trace {
namespace {

using c10::DispatchKey;

// A key switched on (or off) for the thread while CallState::current() is
// taken, and whether the state keeps it.
struct KeyRow {
  std::string name;
  DispatchKey key;
  bool excluded;  // switched off rather than on
  bool kept;
};

void PrintTo(const KeyRow& row, std::ostream* os) {
  *os << row.name;
}

class CallStateKeys : public ::testing::TestWithParam<KeyRow> {};

// Note [A Python mode is not replayed]: the keys a Python dispatch mode
// switches on are left out (a replay has no mode to take them), and so is the
// trace's own key; any other key the thread switched on or off is kept.
TEST_P(CallStateKeys, KeepsWhatTheOpComputesByAndNotWhatAReplayCannotRebuild) {
  const KeyRow& row = GetParam();
  const c10::impl::LocalDispatchKeySet before = c10::impl::tls_local_dispatch_key_set();
  CallState state;
  if (row.excluded) {
    c10::impl::ExcludeDispatchKeyGuard off(row.key);
    state = CallState::current();
  } else {
    c10::impl::IncludeDispatchKeyGuard on(row.key);
    state = CallState::current();
  }
  const c10::DispatchKeySet set = row.excluded ? state.keys.excluded_ : state.keys.included_;
  EXPECT_EQ(set.has(row.key), row.kept) << row.name;
  // The guard put the thread back; the state taken is a copy.
  EXPECT_EQ(c10::impl::tls_local_dispatch_key_set().included_, before.included_);
  EXPECT_EQ(c10::impl::tls_local_dispatch_key_set().excluded_, before.excluded_);
}

INSTANTIATE_TEST_SUITE_P(
    Keys, CallStateKeys,
    ::testing::Values(KeyRow{"python_mode_on", DispatchKey::Python, false, false},
                      KeyRow{"python_tls_snapshot_on", DispatchKey::PythonTLSSnapshot, false,
                             false},
                      KeyRow{"trace_key_on", kTraceKey, false, false},
                      KeyRow{"trace_key_off", kTraceKey, true, false},
                      KeyRow{"autocast_cpu_on", DispatchKey::AutocastCPU, false, true},
                      KeyRow{"python_off", DispatchKey::Python, true, true},
                      KeyRow{"functionalize_on", DispatchKey::Functionalize, false, true}),
    [](const ::testing::TestParamInfo<KeyRow>& info) { return info.param.name; });

// A replay runs under the state it was handed and puts the thread's back,
// the trace's key membership included.
TEST(ReplayState, RunsUnderTheCapturedStateAndPutsTheThreadsBack) {
  CallState captured;
  {
    c10::impl::IncludeDispatchKeyGuard on(DispatchKey::AutocastCPU);
    c10::AutoGradMode grad(false);
    captured = CallState::current();
  }
  c10::impl::IncludeDispatchKeyGuard trace_on(kTraceKey);
  c10::AutoGradMode grad(true);
  const c10::impl::LocalDispatchKeySet before = c10::impl::tls_local_dispatch_key_set();
  {
    const ReplayState replay(captured);
    const c10::impl::LocalDispatchKeySet now = c10::impl::tls_local_dispatch_key_set();
    EXPECT_TRUE(now.included_.has(DispatchKey::AutocastCPU));
    EXPECT_TRUE(now.included_.has(kTraceKey));  // as the thread had it
    EXPECT_FALSE(c10::GradMode::is_enabled());
  }
  EXPECT_EQ(c10::impl::tls_local_dispatch_key_set().included_, before.included_);
  EXPECT_EQ(c10::impl::tls_local_dispatch_key_set().excluded_, before.excluded_);
  EXPECT_TRUE(c10::GradMode::is_enabled());
}

}  // namespace
}  // namespace reloadsafe::trace
