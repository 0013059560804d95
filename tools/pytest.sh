#!/usr/bin/env bash
# The Python package's tests: builds //python:package, then runs python/tests
# with the set-up's venv pytest against it (the package folder on PYTHONPATH;
# the venv itself is not changed).
#
#   tools/pytest.sh JUNIT_XML [extra pytest arguments]
#
# Used by tools/test.sh and tools/run.sh; run tools/setup.sh first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 1 ] || { echo "usage: tools/pytest.sh JUNIT_XML [pytest args]" >&2; exit 2; }
xml="$1"
shift
venv="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}/venv"
bazel build //python:package || exit 1
PYTHONPATH="$(bazel info bazel-bin)/python/package_site" \
  exec "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests --junitxml="$xml" "$@"
