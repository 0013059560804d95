#!/usr/bin/env bash
# Launcher of check_bench.py (//bench:check_bench): the set-up's Python (the
# interpreter //python:package was built for), the package on PYTHONPATH, and
# the machine-context helper, all from this binary's runfiles.
set -euo pipefail
if [ -d "$0.runfiles" ]; then
  runfiles="$0.runfiles"
elif [ -n "${RUNFILES_DIR:-}" ]; then
  runfiles="$RUNFILES_DIR"
else
  runfiles="${TEST_SRCDIR:?check_bench: no runfiles folder (run it through Bazel or from bazel-bin)}"
fi
here="$runfiles/reloadsafe/bench"
python="$(cat "$here/check_bench_python.txt")"
PYTHONPATH="$runfiles/reloadsafe/python/package_site${PYTHONPATH:+:$PYTHONPATH}" \
  exec "$python" "$here/check_bench.py" --reloadsafe_context_binary="$here/machine_context" \
  --reloadsafe_executable="$0" "$@"
