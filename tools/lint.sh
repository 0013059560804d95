#!/usr/bin/env bash
# Lint that holds: every finding fails.
#
#   tools/lint.sh [--junit FILE]   # after tools/setup.sh (the test command runs it)
#
# --junit FILE: also writes one JUnit test case per check (clang-format,
# ruff, mypy), its findings as the failure message, for the test summary.
#
# - clang-format-14 in check mode over the project's C++ (.clang-format;
#   third_party/ excluded). To fix: the same file list through
#   `clang-format-14 -i`.
# - ruff (ruff.toml) and mypy (mypy.ini) over python/, tools/ and bench/,
#   from the set-up's lint environment ($CACHE/venv-lint: both pinned, so a
#   new release cannot turn a clean tree red).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CACHE="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
lint_venv="$CACHE/venv-lint"
[ -x "$lint_venv/bin/ruff" ] && [ -x "$lint_venv/bin/mypy" ] ||
  { echo "tools/lint.sh: no lint environment at $lint_venv: run tools/setup.sh" >&2; exit 1; }
command -v clang-format-14 >/dev/null || { echo "tools/lint.sh: clang-format-14 missing: run tools/setup.sh" >&2; exit 1; }

junit=""
if [ "${1:-}" = "--junit" ]; then
  [ $# -ge 2 ] || { echo "tools/lint.sh: --junit needs a file" >&2; exit 2; }
  junit="$2"
fi

status=0
failures=0
cases=""
# check NAME COMMAND...: runs it, echoes its output, records a JUnit case.
check() {
  local name="$1" out rc=0
  shift
  echo "[lint] $name"
  out="$("$@" 2>&1)" || rc=$?
  [ -n "$out" ] && printf '%s\n' "$out"
  local escaped
  escaped="$(printf '%s' "$out" | tail -c 20000 | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g')"
  if [ $rc -eq 0 ]; then
    cases+="<testcase classname=\"lint\" name=\"$name\"/>"
  else
    status=1
    failures=$((failures + 1))
    cases+="<testcase classname=\"lint\" name=\"$name\"><failure message=\"$name found problems\">$escaped</failure></testcase>"
  fi
}

mapfile -t cpp < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/')
check clang-format clang-format-14 --dry-run --Werror "${cpp[@]}"
[ $status -eq 0 ] || echo "[lint] fix the format with: git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/' | xargs clang-format-14 -i"
check ruff "$lint_venv/bin/ruff" check --no-cache python tools bench
check mypy "$lint_venv/bin/mypy" --config-file mypy.ini --no-incremental python/reloadsafe python/tests python/setup.py python/build_backend tools bench
if [ -n "$junit" ]; then
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="lint" tests="3" failures="%s">%s</testsuite></testsuites>\n' \
    "$failures" "$cases" > "$junit"
fi
[ $status -eq 0 ] && echo "[lint] clean (${#cpp[@]} C++ files; python/, tools/, bench/)"
exit $status
