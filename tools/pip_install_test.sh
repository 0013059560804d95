#!/usr/bin/env bash
# The package as a user installs it: built without Bazel for one Python and
# torch, installed into a fresh environment, and python/tests run there.
#
#   tools/pip_install_test.sh PYTHON_VERSION TORCH_SERIES JUNIT_XML [pytest args]
#   tools/pip_install_test.sh 3.13 2.15 /tmp/pip-py3.13.xml
#
# 1. With no `bazel` on PATH (each PATH folder that has one is replaced by a
#    copy of its links without it), tools/build_wheel.sh builds the sdist and
#    from it the wheel for the interpreter of the set-up's environment
#    $CACHE/venv-pyPYTHON_VERSION-torchTORCH_SERIES (tools/setup.sh).
# 2. A fresh virtual environment of that interpreter, layered over the
#    set-up's one (a .pth file makes its torch, pytest and numpy importable;
#    nothing of reloadsafe is there), gets the wheel through pip.
# 3. python/tests runs there with `pytest -n 2`, still without `bazel`; the
#    package must be imported from the fresh environment.
# A missing environment or Python fails with what to install, as a failed
# case in JUNIT_XML. Used by tools/test.sh.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 3 ] || { echo "usage: tools/pip_install_test.sh PYTHON_VERSION TORCH_SERIES JUNIT_XML [pytest args]" >&2; exit 2; }
py="$1"
series="$2"
xml="$3"
shift 3
cache="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
base="$cache/venv-py$py-torch$series"
area="pip-py$py-torch$series"

# A JUnit file with one failed case saying why, for the test summary.
fail() {
  echo "tools/pip_install_test.sh: $*" >&2
  local msg="${*//&/&amp;}"
  msg="${msg//</&lt;}"
  msg="${msg//>/&gt;}"
  msg="${msg//\"/&quot;}"
  cat >"$xml" <<EOF
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="$area" tests="1" failures="1" errors="0" skipped="0">
<testcase classname="pip_install_test" name="install_and_test"><failure message="$msg">$msg</failure></testcase>
</testsuite></testsuites>
EOF
  exit 1
}

[ -x "$base/bin/python" ] ||
  fail "no environment at $base: tools/setup.sh makes it from Python $py (python$py on PATH, or pyenv's $py), which this machine lacks if set-up warned so; install Python $py with its venv module and headers, then run tools/setup.sh"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# PATH without bazel: a folder that has it is replaced by one of links to
# everything else in it (the compiler and the rest of /usr/bin stay).
new_path=()
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -n "$d" ] && [ -d "$d" ] || continue
  if [ -e "$d/bazel" ]; then
    shadow="$work/path/${#new_path[@]}"
    mkdir -p "$shadow"
    ln -s "$d"/* "$shadow"/
    rm -f "$shadow"/bazel "$shadow"/bazel-* "$shadow"/bazelisk
    new_path+=("$shadow")
  else
    new_path+=("$d")
  fi
done
PATH="$(IFS=:; echo "${new_path[*]}")"
export PATH
if command -v bazel >/dev/null; then fail "bazel is still on PATH ($(command -v bazel))"; fi

echo "[pip-install] Python $py, torch $series: building the wheel without Bazel"
build_start=$SECONDS
tools/build_wheel.sh "$base/bin/python" "$work/dist" || fail "tools/build_wheel.sh failed (its output is above)"
wheel="$(echo "$work"/dist/reloadsafe-*.whl)"
[ -f "$wheel" ] || fail "tools/build_wheel.sh wrote no wheel"
echo "[pip-install] wheel built in $((SECONDS - build_start)) s: $(basename "$wheel")"

env_dir="$work/venv"
"$base/bin/python" -m venv "$env_dir" || fail "could not create a virtual environment with $base/bin/python"
site="$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
base_site="$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$base_site" >"$site/_reloadsafe_test_base.pth"
"$env_dir/bin/python" -m pip install --quiet --no-deps "$wheel" || fail "pip could not install $wheel"
where="$("$env_dir/bin/python" -c 'import reloadsafe; print(reloadsafe.__file__)')" || fail "the installed package does not import"
case "$where" in
  "$site"/*) echo "[pip-install] reloadsafe imports from the fresh environment: $where" ;;
  *) fail "reloadsafe was imported from $where, not from the fresh environment's $site" ;;
esac

echo "[pip-install] pytest -n 2 python/tests"
"$env_dir/bin/python" -m pytest -q -n 2 -p no:cacheprovider python/tests --junitxml="$xml" "$@"
