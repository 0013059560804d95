#!/usr/bin/env bash
# Builds reloadsafe's Python extension (reloadsafe._C) inside an unpacked GPU
# bundle, for a Python the bundle's prebuilt extension was not built for: the
# binding sources are compiled against that Python's headers and its torch,
# then linked against the core, a shared library tools/gpu_bundle.sh built
# (it does not depend on the Python version), which is put beside the
# extension. Needs a C++ compiler, that Python's headers and its torch; no
# Bazel.
#
#   ext/build_ext.sh PYTHON OUTPUT    # OUTPUT: .../reloadsafe/_C<EXT_SUFFIX>
#
# gpu_check.sh runs it when the bundle's extension does not match.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -eq 2 ] || { echo "usage: build_ext.sh PYTHON OUTPUT" >&2; exit 2; }
python="$1"
output="$2"
# The system's compiler first (RELOADSAFE_CXX overrides): an image's own
# toolchain (CXX=/opt/gcc/bin/g++ on the H200 machine) may link libstdc++
# statically into a shared object, and a second, uninitialised libstdc++ in
# the process crashed the first stream the core wrote to.
CXX="${RELOADSAFE_CXX:-$(command -v c++ || command -v g++ || echo "${CXX:-c++}")}"
command -v "$CXX" >/dev/null || { echo "build_ext.sh: no C++ compiler ($CXX): install g++ or set RELOADSAFE_CXX" >&2; exit 1; }
# What this Python and its torch need: include folders, the C++ ABI and
# standard, the libraries to link.
eval "$("$python" - <<'PY'
import glob, os, shlex, sys, sysconfig
import importlib.util


def stop(message):
    # Printed for the shell to run: it says why, and stops the script.
    print(f"echo {shlex.quote('build_ext.sh: ' + message)} >&2; exit 1")
    sys.exit(0)

spec = importlib.util.find_spec("torch")
if spec is None:
    stop("this Python has no torch")
root = list(spec.submodule_search_locations)[0]
inc = sysconfig.get_paths()["include"]
if not os.path.exists(os.path.join(inc, "Python.h")):
    stop(f"no Python.h in {inc}: install this Python's headers (python3-dev)")
import re
with open(os.path.join(root, "version.py")) as f:
    found = re.search(r"^__version__\b.*?=\s*['\"](\d+)\.(\d+)", f.read(), re.M)
if found is None:
    stop("cannot read the torch version from its version.py")
major, minor = int(found.group(1)), int(found.group(2))
abi = "1"
try:
    import torch  # the ABI torch was built with
    abi = str(int(torch._C._GLIBCXX_USE_CXX11_ABI))
except Exception:
    pass
site = os.path.dirname(root)
cudart = sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libcudart.so*")) +
                glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
for k, v in {"PYINC": inc, "TORCH": root, "ABI": abi, "STD": "c++20" if (major, minor) >= (2, 14) else "c++17",
             "CUDART": cudart[0] if cudart else ""}.items():
    print(f"{k}={shlex.quote(v)}")
PY
)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
flags=(-std="$STD" -O0 -fPIC -fvisibility=hidden -w -D_GLIBCXX_USE_CXX11_ABI="$ABI"
  -I "$here/src" -isystem "$here/include" -isystem "$TORCH/include"
  -isystem "$TORCH/include/torch/csrc/api/include" -isystem "$PYINC")
# One translation unit for the bindings: LibTorch's and pybind11's headers
# are most of the time, and they are read once.
for src in "$here"/src/python/src/*.cc; do echo "#include \"$src\""; done > "$work/bindings.cc"
echo "[build_ext] $CXX -c bindings.cc ($(ls "$here"/src/python/src/*.cc | wc -l) sources)"
"$CXX" "${flags[@]}" -c "$work/bindings.cc" -o "$work/bindings.o"
libs=(-L "$TORCH/lib" -ltorch_python -ltorch -ltorch_cpu -lc10)
[ -e "$TORCH/lib/libtorch_cuda.so" ] && libs+=(-ltorch_cuda -lc10_cuda)
[ -n "$CUDART" ] && libs+=("$CUDART")
dir="$(dirname "$output")"
mkdir -p "$dir"
# The core beside the extension, found through $ORIGIN.
gunzip -c "$here/libreloadsafe_core.so.gz" > "$dir/libreloadsafe_core.so"
"$CXX" -shared -o "$output" "$work/bindings.o" "$dir/libreloadsafe_core.so" -Wl,--no-as-needed "${libs[@]}" \
  -Wl,-rpath,'$ORIGIN' -Wl,-rpath,"$TORCH/lib" -Wl,--allow-shlib-undefined
if ! readelf -d "$output" | grep -q 'NEEDED.*libstdc++\.so'; then
  echo "build_ext.sh: $CXX linked libstdc++ into the extension statically; use a compiler that links" \
    "it as a shared library (RELOADSAFE_CXX=/usr/bin/g++)" >&2
  exit 1
fi
echo "[build_ext] $output ($("$CXX" -dumpfullversion 2>/dev/null || echo "$CXX"))"
