#!/usr/bin/env bash
# Runs a benchmark binary once, briefly, as a test: every benchmark must run
# to completion and produce valid JSON.
set -euo pipefail
bin="$1"
shift
out="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}/$(basename "$bin").json"
"$bin" --benchmark_min_time=0 --benchmark_repetitions=1 \
  --benchmark_out="$out" --benchmark_out_format=json "$@"
python3 - "$out" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
runs = [b for b in data["benchmarks"] if b.get("run_type") == "iteration"]
errors = [b["name"] for b in runs if b.get("error_occurred")]
if not runs:
    sys.exit("no benchmark ran")
if errors:
    sys.exit("benchmarks reported errors: " + ", ".join(errors))
print(f"{len(runs)} benchmark runs OK")
PY
