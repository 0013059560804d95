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
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/setup.sh
status=0
echo "[test] bazel test //... $*"
bazel test "$@" //... || status=$?
echo "[test] bazel test --config=gpu //... $*"
bazel test --config=gpu "$@" //... || status=$?
# bazel-testlogs points at the folder of the configuration just used.
tools/summarize_tests.py "$(readlink -f bazel-testlogs)" || status=$?
exit $status
