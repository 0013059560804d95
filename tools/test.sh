#!/usr/bin/env bash
# README's test command: set-up (idempotent), then every test.
#
#   tools/test.sh [extra bazel flags]     e.g. tools/test.sh --config=asan
#
# CI passes --nocache_test_results, so every test runs even when the disk
# cache holds a result for it.
#
# 1. `bazel test //...`: all CPU tests, and builds and links every target,
#    GPU tests included.
# 2. `bazel test --config=gpu //...`: the GPU tests. Without a visible CUDA
#    device they skip, and the summary lists each skip with its reason.
# 3. The Python package's tests (python/tests) with the set-up's venv pytest,
#    against the package Bazel builds (//python:package, on PYTHONPATH; the
#    venv itself is not changed). Counted in the summary as area `python`.
# 4. `bazel test --config=tsan //utils:tensor_attrs_test`: the attribute
#    table's concurrency test (threads sharing one tensor) under
#    ThreadSanitizer, in its own output folders. Counted as area `tsan`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/setup.sh
status=0
echo "[test] bazel test //... $*"
bazel test "$@" //... || status=$?
echo "[test] bazel test --config=gpu //... $*"
bazel test --config=gpu "$@" //... || status=$?
testlogs="$(readlink -f bazel-testlogs)"  # the folder of the configuration just used
echo "[test] python: bazel build //python:package, then pytest python/tests"
pytest_xml="$(mktemp -d)/pytest.xml"
trap 'rm -rf "$(dirname "$pytest_xml")"' EXIT
tools/pytest.sh "$pytest_xml" || status=$?
echo "[test] bazel test --config=tsan //utils:tensor_attrs_test $*"
bazel test --config=tsan "$@" //utils:tensor_attrs_test || status=$?
tsan_xml="$(readlink -f bazel-testlogs)/utils/tensor_attrs_test/test.xml"
tools/summarize_tests.py --pytest-xml "python=$pytest_xml" --junit "tsan=$tsan_xml" "$testlogs" || status=$?
exit $status
