#!/usr/bin/env bash
# The Python package's tests: builds //python:package, then runs python/tests
# with the set-up's venv pytest against it (the package folder on PYTHONPATH;
# the venv itself is not changed).
#
#   tools/pytest.sh [--torch SERIES] JUNIT_XML [extra pytest arguments]
#     --torch 2.15  against the newest supported torch: the cache's
#                   venv-torch2.15 and Bazel's --config=torch2.15 (its own
#                   output folders); by default the cache's venv (torch 2.11)
#
# Used by tools/test.sh and tools/run.sh; run tools/setup.sh first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
venv="$cache/venv"
config=()
if [ "${1:-}" = "--torch" ]; then
  [ $# -ge 2 ] || { echo "tools/pytest.sh: --torch needs a series (2.15)" >&2; exit 2; }
  venv="$cache/venv-torch$2"
  config=("--config=torch$2")
  grep -q "^build:torch$2 " .bazelrc || { echo "tools/pytest.sh: .bazelrc has no --config=torch$2" >&2; exit 2; }
  shift 2
fi
[ $# -ge 1 ] || { echo "usage: tools/pytest.sh [--torch SERIES] JUNIT_XML [pytest args]" >&2; exit 2; }
xml="$1"
shift
[ -x "$venv/bin/python" ] || { echo "tools/pytest.sh: no Python environment at $venv: run tools/setup.sh" >&2; exit 1; }
bazel build "${config[@]}" //python:package || exit 1
PYTHONPATH="$(bazel info "${config[@]}" bazel-bin)/python/package_site" \
  exec "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests --junitxml="$xml" "$@"
