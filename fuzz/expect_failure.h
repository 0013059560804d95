// expect_failure.h: checking a property against a mutant, for the tests that
// show each property of fuzz/ can fail.
//
// A property that no implementation could fail proves nothing. Each property
// file therefore runs its own property once more against a deliberately wrong
// implementation (or a wrong model) and asserts that RapidCheck finds a
// counterexample.
//
// This runs RapidCheck's own checker (what rc::check runs) with its own seed,
// case budget and a silent listener, rather than rc::check itself: rc::check
// records every failure for the `RC_PARAMS="reproduce=..."` summary printed at
// exit, so an expected failure would print a reproduce line in a passing
// test's log. The seed, budget and (empty) reproduce list are fixed,
// independent of RC_PARAMS, so these tests are deterministic in CI, in soak
// runs and in replays alike.
//
// Usage:
//   const Falsified f = check_quietly([] { my_property(mutant_impl); });
//   ASSERT_TRUE(f.failed) << "the property cannot tell the mutant apart";
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

namespace reloadsafe::fuzz {

/// What checking a property found.
struct Falsified {
  bool failed = false;
  int cases = 0;               // test cases run, the failing one included
  std::string counterexample;  // the shrunk counterexample and the failure
};

namespace detail {
class SilentListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};
}  // namespace detail

/// Checks `property` (a callable with RC_ASSERTs, like a RC_GTEST_PROP body)
/// for up to `max_success` cases from `seed`, printing nothing.
template <typename Testable>
Falsified check_quietly(Testable&& property, int max_success = 2000, uint64_t seed = 20261130) {
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = max_success;
  params.maxSize = 100;
  detail::SilentListener listener;
  const rc::detail::TestMetadata metadata;  // no id: nothing is kept for the exit summary
  // An empty reproduce map: a replay (RC_PARAMS="reproduce=...") of another
  // property must not turn this check into a no-op.
  const std::unordered_map<std::string, rc::detail::Reproduce> no_reproduce;
  const rc::detail::TestResult result =
      rc::detail::checkProperty(rc::detail::toProperty(std::forward<Testable>(property)), metadata,
                                params, listener, no_reproduce);
  Falsified out;
  rc::detail::FailureResult failure;
  if (result.match(failure)) {
    out.failed = true;
    out.cases = failure.numSuccess + 1;
    std::ostringstream text;
    for (const auto& [type, value] : failure.counterExample) text << "  " << value << "\n";
    text << "  " << failure.description;
    out.counterexample = text.str();
  } else {
    std::ostringstream text;
    rc::detail::printResultMessage(result, text);
    out.counterexample = text.str();
  }
  return out;
}

}  // namespace reloadsafe::fuzz
