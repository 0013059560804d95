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
# 4. `bazel test --config=tsan //utils:tensor_attrs_test //utils:file_loader_test`:
#    the attribute table's concurrency test (threads sharing one tensor) and
#    the file loader's (threads sharing one loader, its ring and counters)
#    under ThreadSanitizer, in their own output folders. Counted as area
#    `tsan`.
# 5. The newest supported torch (2.15; 1-3 are against the default, 2.11):
#    `bazel test --config=torch2.15 //...` (the C++ suite, in its own output
#    folders) and the Python tests in the cache's venv-torch2.15. Counted as
#    areas `cpp-torch2.15` and `python-torch2.15`.
# 6. The external-repository path: tools/consumer_test.sh builds and tests
#    conformance/harness/example_consumer, a workspace of its own that uses
#    reloadsafe through deps.bzl and reload_harness_test. Area `consumer`.
# 7. Lint (tools/lint.sh: clang-format, ruff, mypy) and the fast tests of the
#    trace, the census, the capture and the utilities under AddressSanitizer
#    and UBSan (--config=asan, its own output folders). Areas `lint`, `asan`.
# 8. The GPU bundle as a GPU machine would start it (tools/gpu_bundle_test.py):
#    built, copied outside the checkout, gpu_check.sh --no-gpu with nothing of
#    Bazel's in its environment; every part starts and each GPU test skips
#    for want of a device. Area `gpu-bundle`.
# 9. The package as a user installs it (tools/pip_install_test.sh), on the
#    oldest supported Python with the oldest torch and the newest with the
#    newest: built by setuptools with no `bazel` on PATH (tools/build_wheel.sh,
#    sdist then wheel), installed into a fresh environment, python/tests run
#    there with -n 2. Areas `pip-py3.10-torch2.11`, `pip-py3.13-torch2.15`.
#    The first builds as a user's machine would (one translation unit per
#    compile job); the second compiles every source in one unit, so that a
#    name two sources both define fails here, whichever sources a machine
#    with another number of cores puts together.
# The summary ends with the torch versions the tests recorded.
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
tsan_targets=(//utils:tensor_attrs_test //utils:file_loader_test)
echo "[test] bazel test --config=tsan ${tsan_targets[*]} $*"
bazel test --config=tsan "$@" "${tsan_targets[@]}" || status=$?
tsan_junit=()
for target in "${tsan_targets[@]}"; do
  tsan_junit+=(--junit "tsan=$(readlink -f bazel-testlogs)/utils/${target#//utils:}/test.xml")
done

# --- 5-6: the newest supported torch, and the external-repository path ------
newest=2.15
echo "[test] bazel test --config=torch$newest //... $*"
bazel test --config=torch$newest "$@" //... || status=$?
testlogs_newest="$(readlink -f bazel-testlogs)"
echo "[test] python against torch $newest: bazel build --config=torch$newest //python:package, then pytest python/tests"
pytest_newest_xml="$(dirname "$pytest_xml")/pytest-torch$newest.xml"
tools/pytest.sh --torch $newest "$pytest_newest_xml" || status=$?
echo "[test] consumer workspace: conformance/harness/example_consumer"
consumer_xml="$(dirname "$pytest_xml")/consumer.xml"
tools/consumer_test.sh "$consumer_xml" "$@" || status=$?
newest_results=(--testlogs "cpp-torch$newest=$testlogs_newest" --pytest-xml "python-torch$newest=$pytest_newest_xml"
  --junit "consumer=$consumer_xml")
# --- end of 5-6 ----------------------------------------------------------------

# --- 7: lint, and the fast tests under the sanitizers --------------------------
echo "[test] lint: tools/lint.sh"
lint_xml="$(dirname "$pytest_xml")/lint.xml"
tools/lint.sh --junit "$lint_xml" || status=$?
asan_targets=(//utils/... //conformance/trace/...)
echo "[test] bazel test --config=asan ${asan_targets[*]} $*"
bazel test --config=asan "$@" "${asan_targets[@]}" || status=$?
testlogs_asan="$(readlink -f bazel-testlogs)"
newest_results+=(--junit "lint=$lint_xml" --testlogs "asan=$testlogs_asan")
# --- end of 7 -------------------------------------------------------------------

# --- 8: the GPU bundle, started as on a GPU machine ------------------------------
echo "[test] GPU bundle: tools/gpu_bundle.sh --fast, gpu_check.sh --no-gpu outside the checkout"
bundle_xml="$(dirname "$pytest_xml")/gpu-bundle.xml"
cache="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
"$cache/venv/bin/python" -m pytest -q -p no:cacheprovider tools/gpu_bundle_test.py --junitxml="$bundle_xml" || status=$?
newest_results+=(--junit "gpu-bundle=$bundle_xml")
# --- end of 8 -------------------------------------------------------------------

# --- 9: the installed package, without Bazel, on the oldest and newest Python ----
for stage in "3.10 2.11 " "3.13 2.15 1000"; do
  read -r py series batch <<<"$stage"
  echo "[test] installed package: Python $py, torch $series (tools/pip_install_test.sh${batch:+, RELOADSAFE_UNITY_BATCH=$batch})"
  pip_xml="$(dirname "$pytest_xml")/pip-py$py-torch$series.xml"
  pip_start=$SECONDS
  RELOADSAFE_UNITY_BATCH="${batch:-${RELOADSAFE_UNITY_BATCH:-}}" tools/pip_install_test.sh "$py" "$series" "$pip_xml" ||
    status=$?
  echo "[test] installed package on Python $py: $((SECONDS - pip_start)) s"
  newest_results+=(--pytest-xml "pip-py$py-torch$series=$pip_xml")
done
# --- end of 9 -------------------------------------------------------------------

tools/summarize_tests.py --pytest-xml "python=$pytest_xml" "${tsan_junit[@]}" "${newest_results[@]}" "$testlogs" || status=$?
exit $status
