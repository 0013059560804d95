#!/usr/bin/env bash
# README's main-job command: set-up, then the whole battery, with a report
# (Markdown, JSON, PNG charts) in the folder named at the end.
#
#   tools/run.sh [--quick]      --quick: fewer reloads and benchmark repetitions
#
#   1. tests: utilities, golden conformance cases, hostile inputs, fuzz properties
#   2. the reload harness over every registered backend (normal and direct reload)
#   3. the GPU tests (or why they were skipped)
#   4. the benchmarks against their limits and the committed baseline
#   5. the report
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
reloads=50
repetitions=5
[ "${1:-}" = "--quick" ] && { reloads=10; repetitions=2; }
tools/setup.sh || exit 1
out="$PWD/reports/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out/bench"
status=0
step() { printf '\n[run] %s\n' "$*"; }

step "1/5 tests: utils, conformance, golden cases, fuzz properties"
bazel test //utils/... //conformance/... //fuzz/... || status=1

step "2/5 reload harness: every registered backend, $reloads reloads per mode"
bazel run //conformance/harness:reload_harness -- --reloads "$reloads" --json "$out/harness.json" \
  | tee "$out/harness.txt" || status=1

step "3/5 GPU tests (they skip, with the reason, where no GPU is visible)"
bazel test --config=gpu //... || status=1

step "4/5 benchmarks: $repetitions repetitions each, against bench/baselines/"
python3 bench/compare.py --repetitions "$repetitions" --results-dir "$out/bench" --charts "$out" \
  copy_bench replace_bench 2>&1 | tee "$out/bench/compare.txt"
echo "${PIPESTATUS[0]}" > "$out/bench/compare.rc"

step "5/5 report"
python3 tools/report.py --testlogs "$(bazel info bazel-testlogs 2>/dev/null)" --out "$out" \
  --harness "$out/harness.json" --bench "$out/bench" || status=1
echo "[run] report: $out/report.md"
exit $status
