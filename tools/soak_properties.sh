#!/usr/bin/env bash
# soak_properties.sh PROPERTY_TEST CASES
#
# Runs the properties (not the mutation tests) of a RapidCheck test binary
# with CASES cases each and a random seed, which RapidCheck prints first
# ("Using configuration: ... seed=..."). A failure prints the shrunk
# counterexample and its RC_PARAMS="reproduce=..." line. An RC_PARAMS given
# with --test_env replaces these settings.
set -uo pipefail

test_binary=$1
cases=$2
export RC_PARAMS="${RC_PARAMS:-max_success=$cases}"
"$test_binary" --gtest_filter='*Props.*'
status=$?
if [[ $status -ne 0 ]]; then
  name=$(basename "$test_binary")
  echo
  echo "Replay the failing case (the RC_PARAMS line above) in the CI test:"
  echo "  bazel test //$(dirname "$test_binary"):$name --test_env=RC_PARAMS=\"reproduce=<string>\""
fi
exit $status
