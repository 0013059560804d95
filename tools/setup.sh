#!/usr/bin/env bash
# Installs what reloadsafe's build needs, once per machine.
#
#   tools/setup.sh        # idempotent; a few seconds when everything is there
#
# - Debian packages: Bazel (bazel-bootstrap, offline-capable with the shims in
#   third_party/), GoogleTest/GoogleMock, RapidCheck, Google Benchmark,
#   nlohmann-json, clang 14 with its libFuzzer runtime (fuzz/); and matplotlib from the Python package registry (charts).
# - LibTorch $TORCH_VERSION, the official CUDA build, taken from the `torch`
#   wheel of the Python package registry and unpacked (include/, lib/, share/)
#   into a cache outside the checkout, so fresh clones reuse it.
#   RELOADSAFE_LIBTORCH=<dir> skips this and builds against that LibTorch.
# - user.bazelrc in the checkout: a Bazel disk cache in the same cache folder,
#   so a fresh clone does not rebuild what another clone already built.
set -euo pipefail

TORCH_VERSION=2.11.0
CACHE="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
TOP="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
APT_PACKAGES=(bazel-bootstrap bazel-rules-java libgtest-dev libgmock-dev
  librapidcheck-dev libbenchmark-dev nlohmann-json3-dev python3 clang-14 libclang-rt-14-dev)

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

install_libtorch() {
  if [ -n "${RELOADSAFE_LIBTORCH:-}" ]; then
    [ -d "$RELOADSAFE_LIBTORCH/include" ] && [ -d "$RELOADSAFE_LIBTORCH/lib" ] ||
      die "RELOADSAFE_LIBTORCH=$RELOADSAFE_LIBTORCH has no include/ and lib/"
    say "LibTorch: using RELOADSAFE_LIBTORCH=$RELOADSAFE_LIBTORCH"
    return
  fi
  local dest="$CACHE/libtorch-$TORCH_VERSION"
  if [ -f "$dest/.complete" ]; then
    say "LibTorch $TORCH_VERSION: present in $dest"
    return
  fi
  say "LibTorch $TORCH_VERSION: downloading the torch wheel (about 530 MB)"
  local tmp
  tmp="$(mktemp -d "$CACHE/download.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  python_pip download --no-deps --only-binary=:all: --progress-bar on \
    --platform manylinux_2_28_x86_64 --python-version 3.12 --implementation cp \
    -d "$tmp" "torch==$TORCH_VERSION"
  local wheel
  wheel="$(ls "$tmp"/torch-"$TORCH_VERSION"-*.whl)"
  say "LibTorch $TORCH_VERSION: unpacking include/, lib/ and share/"
  python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist()
             if n.startswith(("torch/include/", "torch/lib/", "torch/share/"))
             or n == "torch/version.py"]
    for i, n in enumerate(names):
        z.extract(n, out)
        if i % 2000 == 0:
            print(f"[setup]   {i}/{len(names)} files", flush=True)
PY
  rm -rf "$dest"
  mv "$tmp/unpacked/torch" "$dest"
  touch "$dest/.complete"
  say "LibTorch $TORCH_VERSION: installed in $dest ($(du -sh "$dest" | cut -f1))"
}

# CUDA runtime libraries that LibTorch's CUDA build loads and the machine may
# lack, as "library package" pairs. libtorch_cpu itself needs the first two,
# even for CPU work; the GPU test binaries need the rest to start (and skip)
# on a machine with the CUDA Toolkit but no GPU. Missing ones are unpacked
# from the registry's wheels into $CACHE/cuda-runtime/lib.
CPU_RUNTIME=("libcudart.so.13 nvidia-cuda-runtime==13.0.*" "libcupti.so.13 nvidia-cuda-cupti==13.0.*")
GPU_RUNTIME=("libcufile.so.0 nvidia-cufile==1.15.*" "libcusparseLt.so.0 nvidia-cusparselt-cu13==0.8.0"
  "libnvshmem_host.so.3 nvidia-nvshmem-cu13==3.4.5")

install_cuda_runtime() {
  local cuda="${CUDA_HOME:-/usr/local/cuda}" dest="$CACHE/cuda-runtime/lib"
  local wanted=("${CPU_RUNTIME[@]}")
  [ -e "$cuda/include/cuda_runtime_api.h" ] && wanted+=("${GPU_RUNTIME[@]}")
  local missing=()
  for pair in "${wanted[@]}"; do
    local lib="${pair%% *}"
    [ -e "$cuda/lib64/$lib" ] || [ -e "$cuda/extras/CUPTI/lib64/$lib" ] || [ -e "$dest/$lib" ] ||
      missing+=("${pair#* }")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "CUDA runtime libraries: present"
    return
  fi
  say "CUDA runtime libraries: downloading ${missing[*]}"
  local tmp
  tmp="$(mktemp -d "$CACHE/download.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  python_pip download --no-deps --only-binary=:all: --progress-bar on -d "$tmp" "${missing[@]}"
  mkdir -p "$dest"
  python3 - "$dest" "$tmp"/*.whl <<'PY'
import os, sys, zipfile
out = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if "/lib/" in n and ".so" in os.path.basename(n):
                with open(os.path.join(out, os.path.basename(n)), "wb") as f:
                    f.write(z.read(n))
PY
  say "CUDA runtime libraries: installed in $dest ($(du -sh "$dest" | cut -f1))"
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

write_user_bazelrc() {
  local rc="$TOP/user.bazelrc"
  local want="build --disk_cache=$CACHE/bazel-disk-cache"
  if [ ! -f "$rc" ] || ! grep -qxF "$want" "$rc"; then
    printf '# Written by tools/setup.sh: machine-local settings.\n%s\n' "$want" > "$rc"
  fi
}

mkdir -p "$CACHE"
start=$SECONDS
install_debian_packages
install_libtorch
install_cuda_runtime
install_python_packages
write_user_bazelrc
say "done in $((SECONDS - start)) s (cache: $CACHE)"
