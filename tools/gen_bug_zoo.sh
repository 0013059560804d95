#!/usr/bin/env bash
# Regenerates docs/bug-zoo.md from the bug zoo (python/tests/zoo): builds the
# Python package, runs every buggy and fixed layer through check_reload, and
# prints the check time of each pair. python/tests/test_zoo.py fails when the
# committed file differs from what this writes. The C++ rows' page,
# docs/bug-zoo-cpp.md, has its own generator: tools/gen_bug_zoo_cpp.sh.
#
#   tools/gen_bug_zoo.sh            # after tools/setup.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
bazel build //python:package
PYTHONPATH="$(bazel info bazel-bin)/python/package_site:python/tests" \
  "$cache/venv/bin/python" -m zoo.table docs/bug-zoo.md
