#!/usr/bin/env bash
# Installs what reloadsafe's build needs, once per machine.
#
#   tools/setup.sh        # idempotent; a few seconds when everything is there
#
# - Debian packages: Bazel (bazel-bootstrap, offline-capable with the shims in
#   third_party/), GoogleTest/GoogleMock, RapidCheck, Google Benchmark,
#   nlohmann-json, clang 14 with its libFuzzer runtime (fuzz/), clang-format 14
#   (tools/lint.sh); and matplotlib from the Python package registry (charts).
# - A lint environment ($CACHE/venv-lint) with ruff and mypy, pinned.
# - A Python environment in the cache ($CACHE/venv) with torch $TORCH_VERSION
#   (the official CUDA build), pytest and numpy from the Python package
#   registry, torchao and bitsandbytes (pinned, for python/tests/real) and
#   transformers (pinned: whole models built from configs).
#   Its torch package is also the LibTorch the C++ build links
#   (third_party/libtorch/libtorch.bzl), and its nvidia-* packages are the CUDA
#   runtime libraries LibTorch loads. RELOADSAFE_LIBTORCH=<dir> builds the C++
#   side against another LibTorch instead.
# - user.bazelrc in the checkout: a Bazel disk cache in the same cache folder,
#   so a fresh clone does not rebuild what another clone already built; and,
#   where /dev/shm is a tmpfs with room, Bazel's sandboxes there (see
#   sandbox_base below).
# - A second Python environment, $CACHE/venv-torch2.15, with the newest
#   supported torch (the test command tests both ends of the range), and
#   pytest-xdist in both (the newest-torch block below).
# - Two more on the oldest and newest supported Python, $CACHE/venv-py3.10-
#   torch2.11 and $CACHE/venv-py3.13-torch2.15, which the test command builds
#   the package for without Bazel and installs it over (the installed-package
#   block below). Python 3.10 and 3.13 are found as python3.10 / python3.13 on
#   PATH, or through pyenv.
set -euo pipefail

TORCH_VERSION=2.11.0
CACHE="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
VENV="$CACHE/venv"
TOP="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
APT_PACKAGES=(bazel-bootstrap bazel-rules-java libgtest-dev libgmock-dev
  librapidcheck-dev libbenchmark-dev nlohmann-json3-dev python3 python3-venv python3-dev clang-14 libclang-rt-14-dev
  clang-format-14 patchelf)

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@";
  elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $*"; fi
}

install_debian_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "Debian packages: present"
    return
  fi
  say "Debian packages: installing ${missing[*]}"
  as_root apt-get update -q
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
}

python_pip() {
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip "$@"
  else
    say "installing pip (python3-pip)"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q python3-pip >/dev/null
    python3 -m pip "$@"
  fi
}

# The Python environment: torch $TORCH_VERSION (whose torch/include and
# torch/lib are also the LibTorch the C++ build links; its nvidia-* packages
# bring the CUDA runtime libraries), pytest and numpy, in $CACHE/venv. One
# torch for both sides: the Python extension and the C++ tests load the same
# libraries. About 4.6 GB and two minutes on a fresh machine. Made by
# install_torch_venv (below), the same way as the newest torch's environment.

# The real quantization libraries python/tests/real builds layers on, pinned
# to versions that run on a CPU with the venv's torch. Installed with
# --no-deps so they cannot replace the venv's torch; what they import besides
# torch (numpy; packaging for bitsandbytes) the venv already has.
# bitsandbytes' optional `kernels` package (a download of GPU kernels) is not
# installed: bitsandbytes falls back to its own CPU code and says so.
QUANT_PACKAGES=(torchao==0.18.0 bitsandbytes==0.50.2)

# Whether the Python PYTHON has every package named: NAME==VERSION at that
# version, a bare NAME at any.
packages_present() {
  local python="$1"
  shift
  "$python" - "$@" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name, _, version = spec.partition("==")
    found = m.version(name)  # raises, and so fails, when absent
    if version and found != version:
        sys.exit(1)
PY
}

# Whole Hugging Face models for python/tests/real/test_real_models.py and the
# whole-model benchmark: transformers builds tiny models from their configs
# (no hub, no download). Installed with its dependencies (tokenizers,
# safetensors, huggingface-hub; none of them is torch), pinned.
MODEL_PACKAGES=(transformers==5.25.0)

# Both take the environment as an optional argument (default: $VENV).
quant_libraries_ready() {
  packages_present "${1:-$VENV}/bin/python" "${QUANT_PACKAGES[@]}" numpy packaging "${MODEL_PACKAGES[@]}"
}

install_quant_libraries() {
  local venv="${1:-$VENV}"
  if quant_libraries_ready "$venv"; then
    say "quantization libraries: ${QUANT_PACKAGES[*]} present in $venv"
    return
  fi
  say "quantization libraries: installing ${QUANT_PACKAGES[*]} into $venv (--no-deps, for python/tests/real)"
  "$venv/bin/python" -m pip install -q --progress-bar on --no-deps "${QUANT_PACKAGES[@]}"
  say "model library: installing ${MODEL_PACKAGES[*]} into $venv (for python/tests/real)"
  "$venv/bin/python" -m pip install -q --progress-bar on "${MODEL_PACKAGES[@]}"
  quant_libraries_ready "$venv" || die "the Python environment in $venv lacks ${QUANT_PACKAGES[*]}, ${MODEL_PACKAGES[*]} (or numpy, packaging) after installing"
}

# Earlier set-ups unpacked a separate LibTorch and CUDA runtime into the
# cache; the venv's torch replaces both. They are left for older checkouts
# that may still use them.
note_old_cache() {
  local old
  for old in "$CACHE/libtorch-$TORCH_VERSION" "$CACHE/cuda-runtime"; do
    [ -d "$old" ] && say "note: $old is no longer used by this checkout (the venv's torch replaces it); remove it once no older checkout needs it"
  done
  return 0
}

check_libtorch_override() {
  [ -n "${RELOADSAFE_LIBTORCH:-}" ] || return 0
  [ -d "$RELOADSAFE_LIBTORCH/include" ] && [ -d "$RELOADSAFE_LIBTORCH/lib" ] ||
    die "RELOADSAFE_LIBTORCH=$RELOADSAFE_LIBTORCH has no include/ and lib/"
  say "LibTorch: using RELOADSAFE_LIBTORCH=$RELOADSAFE_LIBTORCH"
}

# matplotlib draws the benchmark charts (bench/compare.py); optional for the
# tests, so a failure here is reported and set-up goes on.
install_python_packages() {
  if python3 -c "import matplotlib" >/dev/null 2>&1; then
    say "matplotlib: present"
    return
  fi
  say "matplotlib: installing (for the benchmark charts)"
  python_pip install -q --progress-bar on matplotlib ||
    say "matplotlib: could not be installed; benchmark charts will be skipped"
}

# --- The newest supported torch (a second Python environment) -------------
# The test command tests the Python package and the C++ suite against both ends
# of the supported torch range (third_party/libtorch/libtorch.bzl): the default
# torch above, in $VENV, and the newest, in $VENV_NEWEST (Bazel's
# --config=torch$NEWEST_TORCH_SERIES reads it). Both environments also get
# pytest-xdist, so the Python tests show `pytest -n` working, and the
# quantization libraries (install_quant_libraries), so python/tests/real runs
# against both torches.
NEWEST_TORCH_VERSION=2.15.0
NEWEST_TORCH_SERIES="${NEWEST_TORCH_VERSION%.*}"
VENV_NEWEST="$CACHE/venv-torch$NEWEST_TORCH_SERIES"

# `build` makes the package's sdist (tools/build_wheel.sh); safetensors
# writes the files the loader's tests and docs/utilities.md read (the
# environments with transformers already have it, at the version it pins).
TEST_EXTRAS=(pytest-xdist build safetensors)

# torch VERSION, pytest, numpy and the test extras are importable by python DIR/bin/python.
torch_venv_ready() {
  local dir="$1" version="$2"
  [ -x "$dir/bin/python" ] || return 1
  "$dir/bin/python" - "$version" "${TEST_EXTRAS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
if m.version("torch").split("+")[0] != sys.argv[1]:
    sys.exit(1)
for name in ("pytest", "numpy", *sys.argv[2:]):
    m.version(name)
PY
}

# A Python environment DIR with torch VERSION, pytest, numpy and the test
# extras, made with interpreter PYTHON (default python3); left alone when it
# has them already.
install_torch_venv() {
  local dir="$1" version="$2" python="${3:-python3}"
  if torch_venv_ready "$dir" "$version"; then
    say "Python environment: torch $version, pytest, numpy, ${TEST_EXTRAS[*]} present in $dir"
    return
  fi
  if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c pass 2>/dev/null; then
    say "Python environment: creating $dir with $("$python" --version 2>&1)"
    rm -rf "$dir"
    "$python" -m venv "$dir" || die "$python -m venv failed: install its venv module (python3-venv)"
  fi
  say "Python environment: installing torch==$version, pytest, numpy, ${TEST_EXTRAS[*]} into $dir (about 3 GB to download)"
  "$dir/bin/python" -m pip install --progress-bar on "torch==$version" "pytest>=7" numpy "${TEST_EXTRAS[@]}"
  torch_venv_ready "$dir" "$version" || die "the Python environment in $dir lacks torch $version, pytest, numpy or ${TEST_EXTRAS[*]} after installing"
  say "Python environment: ready in $dir ($(du -sh "$dir" | cut -f1))"
}

# --- end of the newest-torch block --------------------------------------------

# --- The installed package on the oldest and newest Python --------------------
# The test command (tools/pip_install_test.sh) builds the package as a user's
# pip does (tools/build_wheel.sh: setuptools, no Bazel) on the oldest and the
# newest supported Python, each with one end of the torch range, installs it
# into a fresh environment layered over one of these, and runs python/tests
# there. Made like the environments above (torch with its nvidia-*/CUDA
# packages, pytest, numpy, the test extras), without the real quantization
# libraries and transformers: python/tests/real skips those tests, saying so.
INSTALL_TEST_PAIRS=("3.10 $TORCH_VERSION" "3.13 $NEWEST_TORCH_VERSION")

# The path of a Python X.Y interpreter: pythonX.Y on PATH (Debian's, or a
# pyenv shim that is active), else pyenv's newest X.Y; nothing if neither.
find_python() {
  local want="$1" p latest
  if p="$(command -v "python$want")" &&
    [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
    echo "$p"
    return
  fi
  if command -v pyenv >/dev/null && latest="$(pyenv latest "$want" 2>/dev/null)"; then
    p="$(pyenv root)/versions/$latest/bin/python$want"
    [ -x "$p" ] && echo "$p"
  fi
  return 0
}

# A missing Python is reported here and fails the test command's
# pip-install area (tools/pip_install_test.sh says what to install); the rest
# of set-up goes on.
install_test_venvs() {
  local pair py version python
  for pair in "${INSTALL_TEST_PAIRS[@]}"; do
    read -r py version <<<"$pair"
    python="$(find_python "$py")"
    if [ -z "$python" ]; then
      say "warning: Python $py not found (python$py on PATH, or pyenv): the test command's installed-package tests on Python $py will fail until it is installed"
      continue
    fi
    install_torch_venv "$CACHE/venv-py$py-torch${version%.*}" "$version" "$python"
  done
}
# --- end of the installed-package block ------------------------------------------

# The lint environment (tools/lint.sh): ruff and mypy, pinned, in a venv of
# their own without torch, so lint's verdict does not depend on the torch
# release or on what the test environments hold.
LINT_VENV="$CACHE/venv-lint"
LINT_PACKAGES=(ruff==0.17.6 mypy==2.4.1)

lint_venv_ready() {
  packages_present "$LINT_VENV/bin/python" "${LINT_PACKAGES[@]}"
}

install_lint_venv() {
  if lint_venv_ready; then
    say "lint environment: ${LINT_PACKAGES[*]} present in $LINT_VENV"
    return
  fi
  say "lint environment: installing ${LINT_PACKAGES[*]} into $LINT_VENV"
  [ -x "$LINT_VENV/bin/python" ] || python3 -m venv "$LINT_VENV" || die "python3 -m venv failed: install python3-venv"
  "$LINT_VENV/bin/python" -m pip install -q --progress-bar on "${LINT_PACKAGES[@]}"
  lint_venv_ready || die "the lint environment in $LINT_VENV lacks ${LINT_PACKAGES[*]} after installing"
}

# Where Bazel makes its sandboxes, or nothing for its default (inside the
# output base). A sandboxed action gets a fresh folder with a link to each of
# its declared inputs, and a compile's inputs are LibTorch's ~9400 headers:
# on the disk that holds the output base, making those links costs a quarter
# to a third of a build, on tmpfs next to nothing (docs/development.md has the
# measurement). The sandbox still holds each action to its declared inputs.
# Only a tmpfs with at least 8 GiB free qualifies (a
# container's 64 MiB /dev/shm would fill up with a linked test);
# RELOADSAFE_SANDBOX_BASE=<dir> chooses, and an empty value keeps Bazel's.
sandbox_base() {
  if [ -n "${RELOADSAFE_SANDBOX_BASE+set}" ]; then
    echo "$RELOADSAFE_SANDBOX_BASE"
    return
  fi
  local dir=/dev/shm
  [ -d "$dir" ] && [ -w "$dir" ] || return 0
  [ "$(stat -f -c %T "$dir" 2>/dev/null)" = tmpfs ] || return 0
  local free_kib
  free_kib="$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')"
  [ -n "$free_kib" ] && [ "$free_kib" -ge $((8 * 1024 * 1024)) ] && echo "$dir"
  return 0
}

# Makes user.bazelrc hold set-up's value of each flag it manages (the disk
# cache, the sandbox folder), or none where set-up chooses Bazel's default: a
# line of such a flag with another value is replaced. Lines of the user's
# own stay.
write_user_bazelrc() {
  local rc="$TOP/user.bazelrc"
  [ -f "$rc" ] || printf '# Written by tools/setup.sh: machine-local settings (lines you add are kept).\n' > "$rc"
  set_bazelrc_flag "$rc" disk_cache "$CACHE/bazel-disk-cache"
  set_bazelrc_flag "$rc" sandbox_base "$(sandbox_base)"
}

# set_bazelrc_flag RC FLAG VALUE: RC's `build --FLAG=...` lines become the one
# line `build --FLAG=VALUE`, or none for an empty VALUE.
set_bazelrc_flag() {
  local rc="$1" flag="$2" value="$3"
  local want="build --$flag=$value"
  if grep -q "^build --$flag=" "$rc" && { [ -z "$value" ] || grep -v -xF "$want" "$rc" | grep -q "^build --$flag="; }; then
    sed -i "/^build --$flag=/d" "$rc"
    say "user.bazelrc: the earlier build --$flag line removed"
  fi
  [ -z "$value" ] || grep -qxF "$want" "$rc" || { printf '%s\n' "$want" >> "$rc"; say "user.bazelrc: $want"; }
}

mkdir -p "$CACHE"
start=$SECONDS
install_debian_packages
install_torch_venv "$VENV" "$TORCH_VERSION"
install_quant_libraries
install_torch_venv "$VENV_NEWEST" "$NEWEST_TORCH_VERSION"
install_quant_libraries "$VENV_NEWEST"
install_test_venvs
note_old_cache
check_libtorch_override
install_python_packages
install_lint_venv
write_user_bazelrc
say "done in $((SECONDS - start)) s (cache: $CACHE)"
