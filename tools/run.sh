#!/usr/bin/env bash
# README's main-job command: set-up, then the conformance battery (golden
# cases, utilities, fuzz properties, GPU tests or why they skipped), with a
# report in reports/<time>/ and a short table at the end.
#
#   tools/run.sh [extra bazel flags]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/setup.sh
out="reports/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
status=0
echo "[run] 1/2 conformance, utilities and fuzz properties"
bazel test "$@" //conformance/... //golden/... //utils/... //fuzz/... || status=$?
echo "[run] 2/2 GPU tests"
bazel test --config=gpu "$@" //... || status=$?
tools/summarize_tests.py --json "$out/summary.json" --markdown "$out/summary.md" \
  "$(bazel info "$@" bazel-testlogs 2>/dev/null)" conformance golden utils fuzz || status=$?
echo "[run] report: $out"
exit $status
