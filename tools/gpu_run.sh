#!/usr/bin/env bash
# Runs the GPU bundle (tools/gpu_bundle.sh) on a machine with a GPU, torch
# 2.11 installed for Python, and no Bazel. Writes gtest XML, the harness JSON,
# benchmark JSON and summary.md into OUT.
#
#   OUT=/some/dir gpu_bundle/gpu_run.sh
#
# RELOADSAFE_TORCH_LIB overrides where LibTorch's libraries are (default: the
# installed torch package's lib/).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT/xml" "$OUT/bench"
start=$SECONDS

torch_lib="${RELOADSAFE_TORCH_LIB:-$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')}"
nvidia_libs="$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "lib")))
print(":".join(dict.fromkeys(dirs)))
PY
)"
export LD_LIBRARY_PATH="$here/lib:$torch_lib${nvidia_libs:+:$nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: (nvidia-smi unavailable)"
  python3 -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda)' 2>/dev/null || true
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

status=0
for t in cuda_graph_reload_test cuda_graph_test; do
  [ -x "$here/bin/$t" ] || continue
  echo "[gpu_run] $t"
  timeout 300 "$here/bin/$t" --gtest_output="xml:$OUT/xml/$t.xml" > "$OUT/$t.log" 2>&1 || status=1
  tail -3 "$OUT/$t.log"
done
if [ -x "$here/bin/reload_harness" ]; then
  echo "[gpu_run] reload_harness on cuda"
  timeout 120 "$here/bin/reload_harness" --device cuda --reloads 20 --json "$OUT/harness_cuda.json" \
    > "$OUT/harness_cuda.txt" 2>&1 || status=1
  cat "$OUT/harness_cuda.txt"
fi
for b in "$here"/bin/*_bench; do
  [ -x "$b" ] || continue
  name="$(basename "$b")"
  echo "[gpu_run] $name"
  timeout 180 "$b" --benchmark_out="$OUT/bench/$name.json" --benchmark_out_format=json \
    ${RELOADSAFE_BENCH_ARGS:-} > "$OUT/bench/$name.txt" 2>&1 || status=1
done

python3 - "$here" "$OUT" "$status" "$((SECONDS - start))" <<'PY'
import glob, os, sys
here, out, status, secs = sys.argv[1:5]
sys.path.insert(0, here)
import testlogs  # the same reader as tools/summarize_tests.py
passed = failed = skipped = replays = 0
rows = []
for path in sorted(glob.glob(os.path.join(out, "xml", "*.xml"))):
    target = testlogs.read_junit(path, os.path.basename(path)[:-4])
    for case in target.cases:
        name = f"{target.label} {case.name}"
        if case.status == "failed":
            failed += 1; rows.append(f"- FAIL {name}")
        elif case.status == "skipped":
            skipped += 1; rows.append(f"- skip {name}: {case.message}")
        else:
            passed += 1
        replays += int(case.properties.get("replays", 0) or 0)
machine = open(os.path.join(out, "machine.txt")).read()
summary = (f"# GPU check\n\n```\n{machine}```\n\n"
           f"tests: {passed} passed, {failed} failed, {skipped} skipped\n\n"
           f"CUDA-graph replays: {replays}\n\nwall time: {secs} s, exit status {status}\n\n"
           + "\n".join(rows) + "\n")
open(os.path.join(out, "summary.md"), "w").write(summary)
print(summary)
PY
exit $status
