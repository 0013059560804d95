#!/usr/bin/env bash
# Builds reloadsafe's wheel for one Python and the torch installed for it, as
# any torch extension is built: setuptools and torch.utils.cpp_extension
# (python/setup.py), no Bazel.
#
#   tools/build_wheel.sh PYTHON OUT_DIR
#
# PYTHON is an interpreter (3.10 to 3.13) whose environment has the torch to
# build against (2.11 to 2.15) and the `build` package; the wheel
# (reloadsafe-<v>-cpXY-cpXY-linux_x86_64.whl) is for that Python and that
# torch only. Two steps, as `python -m build` takes them:
#   1. the sdist of python/ (`PYTHON -m build --sdist`): the package, setup.py
#      and the C++ files of python/extension_sources.bzl;
#   2. the wheel from that sdist (`PYTHON -m pip wheel`): pip's isolated build
#      environment brings the build requirements from the Python package
#      registry (setuptools, ninja, nlohmann-json), python/build_backend/ lets
#      setup.py import PYTHON's torch, and ninja compiles in parallel.
# Needs a C++ compiler (g++ or clang++: C++17, C++20 for torch 2.14 and newer)
# and PYTHON's headers. MAX_JOBS=N limits the compile jobs (default: ninja's,
# the number of cores plus two); the sources are compiled in one translation
# unit per job (MAX_JOBS, else the cores, or the CPUs of a cgroup quota where
# that is fewer); RELOADSAFE_UNITY_BATCH=N sets how many sources share a unit
# instead (python/setup.py; 1: each its own). Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -eq 2 ] || { echo "usage: tools/build_wheel.sh PYTHON OUT_DIR" >&2; exit 2; }
python="$1"
out="$2"
"$python" -c "import build" 2>/dev/null ||
  { echo "tools/build_wheel.sh: $python has no 'build' package: $python -m pip install build" >&2; exit 1; }
"$python" -c "import torch" 2>/dev/null ||
  { echo "tools/build_wheel.sh: $python cannot import torch: install the torch to build against (2.11 to 2.15) there" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "[build_wheel] sdist of python/"
"$python" -m build --sdist --outdir "$work/sdist" python >"$work/sdist.log" 2>&1 ||
  { cat "$work/sdist.log" >&2; echo "tools/build_wheel.sh: the sdist failed (its log is above)" >&2; exit 1; }
sdist=("$work"/sdist/reloadsafe-*.tar.gz)
torch_version="$("$python" -c "import torch; print(torch.__version__)")"
echo "[build_wheel] wheel from $(basename "${sdist[0]}") for $("$python" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])') and torch $torch_version"
mkdir -p "$out"
"$python" -m pip wheel --no-deps -w "$work/wheel" "${sdist[0]}"
wheels=("$work"/wheel/reloadsafe-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] ||
  { echo "tools/build_wheel.sh: pip wrote no single reloadsafe wheel" >&2; exit 1; }
cp "${wheels[0]}" "$out/"
echo "[build_wheel] built in $((SECONDS - start)) s"
echo "$out/$(basename "${wheels[0]}")"
