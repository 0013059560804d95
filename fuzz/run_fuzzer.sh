#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEED_CORPUS [libFuzzer flags...]
#
# Runs a libFuzzer binary as a test: the seed corpus (read-only) plus a
# scratch corpus in TEST_TMPDIR, with the given bounds (-runs, -max_total_time,
# -timeout, -seed). An input that crashes, hangs past -timeout, leaks or trips
# a sanitizer fails the test; the input is saved in TEST_UNDECLARED_OUTPUTS_DIR
# (bazel-testlogs/fuzz/<test>/test.outputs/outputs.zip) and the log says how
# to replay it.
set -uo pipefail

fuzzer=$1
seeds=$2
shift 2

scratch="${TEST_TMPDIR:-$(mktemp -d)}/corpus"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}"
mkdir -p "$scratch" "$artifacts"

# The workspace's --config=asan sets ASAN_OPTIONS for every test; keep it, and
# give the fuzzers the same defaults when it is not set: leak checking on, as
# in --config=asan (LibTorch's process-lifetime allocations stay reachable
# from its globals, so LeakSanitizer does not report them), and container-
# overflow checks off, because LibTorch's STL is not instrumented.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_container_overflow=0}:abort_on_error=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}:halt_on_error=1"

"$fuzzer" -artifact_prefix="$artifacts/" -print_final_stats=1 "$@" "$scratch" "$seeds"
status=$?
if [[ $status -ne 0 ]]; then
  name=$(basename "$fuzzer")
  echo
  echo "$name failed (exit $status). The failing input is in $artifacts"
  echo "(bazel-testlogs/fuzz/<this test>/test.outputs/outputs.zip). Replay it with:"
  echo "  bazel build //fuzz:$name && bazel-bin/fuzz/$name <crash-file>"
fi
exit $status
