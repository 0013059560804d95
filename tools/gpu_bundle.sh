#!/usr/bin/env bash
# Builds the GPU half here and gathers it into a folder that runs on any
# machine with torch 2.11 (the same series as this build's LibTorch), a GPU
# and no Bazel: tools/gpu_check.sh inside it is the one command to run there.
#
#   tools/gpu_bundle.sh [--out DIR] [--fast]
#       --out DIR   where the bundle goes (default: gpu_bundle/, ignored by git)
#       --fast      copy_bench built as the tests are (no -c opt build); for
#                   the test command, which checks that the bundle starts
#
# Then, on the GPU machine:   OUT=results gpu_bundle/gpu_check.sh
#
# What is in it (about 26 MB):
#   bin/          cuda_graph_reload_test, cuda_graph_test,
#                 file_loader_device_test, reload_harness and copy_bench, the
#                 project's libraries linked in; their RPATH is
#                 $ORIGIN/../lib, and gpu_check.sh finds LibTorch and the CUDA
#                 runtime through the Python torch of the machine it runs on
#   lib/          shared libraries they need that are neither LibTorch's nor
#                 the CUDA runtime's (Google Benchmark)
#   python/       the reloadsafe package with its extension for this Python
#   python_tests/ the package's tests (the real-library ones excepted)
#   ext/          what gpu_check.sh needs to rebuild the extension for another
#                 Python (the binding sources, the headers, the core as a
#                 shared library)
#   gpu_check.sh, gpu_check.py (and testlogs.py, its JUnit reader), BUILD_INFO
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=gpu_bundle
fast=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --fast) fast=1; shift ;;
    *) echo "usage: tools/gpu_bundle.sh [--out DIR] [--fast]" >&2; exit 2 ;;
  esac
done
say() { printf '[gpu_bundle] %s\n' "$*"; }
# It replaces $out, so only a folder this script made (it has BUILD_INFO) or
# an empty one: never /, a home folder or the checkout.
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/BUILD_INFO" ]; then
  echo "[gpu_bundle] refusing to replace $out: it is not a bundle this script made; pass --out NEW_FOLDER" >&2
  exit 2
fi
tools/setup.sh >/dev/null
command -v patchelf >/dev/null || { echo "[gpu_bundle] patchelf is missing: run tools/setup.sh" >&2; exit 1; }

TESTS=(//utils:cuda_graph_reload_test //conformance/harness:cuda_graph_test //utils:file_loader_device_test)
say "building ${TESTS[*]} //conformance/harness:reload_harness //python:package"
bazel build "${TESTS[@]}" //conformance/harness:reload_harness //python:package
bin="$(bazel info bazel-bin)"
bench_mode=(-c opt)
[ "$fast" = 1 ] && bench_mode=()
say "building //bench:copy_bench ${bench_mode[*]}"
bazel build "${bench_mode[@]}" //bench:copy_bench
benchbin="$(bazel info "${bench_mode[@]}" bazel-bin)"

rm -rf "$out"
mkdir -p "$out"/{bin,lib,python,python_tests,ext/src,ext/include}
out="$(cd "$out" && pwd)"
for t in "${TESTS[@]}" //conformance/harness:reload_harness; do
  p="${t#//}"
  cp -L "$bin/${p/://}" "$out/bin/"
done
cp -L "$benchbin/bench/copy_bench" "$out/bin/"
chmod u+w "$out"/bin/*
# The build machine's library folders mean nothing there.
for b in "$out"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$b"; done
# Libraries the binaries load that a machine with torch alone lacks (Google
# Benchmark: a Debian library here).
for b in "$out"/bin/*; do
  ldd "$b" 2>/dev/null | awk '/=> \// {print $3}' | while read -r so; do
    case "$so" in
      */libbenchmark*) cp -L "$so" "$out/lib/" ;;
    esac
  done
done

cp -rL "$bin/python/package_site/." "$out/python/"
chmod -R u+w "$out/python"
(cd python/tests && find . -path ./real -prune -o -name '*.py' -print0 | xargs -0 cp --parents -t "$out/python_tests")

# The extension, rebuildable for another Python: binding sources, every
# header they reach, and the core it links (everything the extension links
# but the bindings, read from its link command) as one shared library,
# compressed. A shared library, not objects: the bindings are compiled there
# by whatever compiler that machine has, and objects of two GCC versions in
# one library share inline functions of two libstdc++ versions (seen on the
# H200: gcc 12's objects with its compiler's bindings crashed in an ostream).
git ls-files -z --cached --others --exclude-standard -- '*.h' '*.inc' 'python/src/*' | xargs -0 cp --parents -t "$out/ext/src"
cp -r /usr/include/nlohmann "$out/ext/include/"
params="$bin/python/_C.so-2.params"
[ -f "$params" ] || { echo "[gpu_bundle] no link parameters at $params" >&2; exit 1; }
objs="$(mktemp -d)"
execroot="$(bazel info execution_root 2>/dev/null)"
grep -E '\.o$' "$params" | grep -v '/python/_objs/' | while read -r o; do
  cp "$execroot/$o" "$objs/$(echo "$o" | tr '/' '_')"
done
torch_lib="$(bazel info output_base)/external/libtorch/lib"
cudart="$(readlink -f "$(bazel info output_base)/external/local_cuda/lib64/libcudart.so" 2>/dev/null || true)"
g++ -shared -o "$objs/libreloadsafe_core.so" -Wl,-soname,libreloadsafe_core.so "$objs"/*.o \
  -L"$torch_lib" -Wl,--no-as-needed -ltorch_cpu -lc10 -ltorch_cuda -lc10_cuda ${cudart:+"$cudart"} \
  -Wl,--allow-shlib-undefined
gzip -9 -c "$objs/libreloadsafe_core.so" > "$out/ext/libreloadsafe_core.so.gz"
rm -rf "$objs"
cp tools/gpu_build_ext.sh "$out/ext/build_ext.sh"
cp tools/gpu_check.py tools/testlogs.py "$out/"
cat > "$out/gpu_check.sh" <<'SH'
#!/usr/bin/env bash
# The GPU check (gpu_check.py says what it runs): OUT=results ./gpu_check.sh [--no-gpu]
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/gpu_check.py" "$@"
SH
chmod +x "$out/gpu_check.sh" "$out/gpu_check.py" "$out/ext/build_ext.sh"
{
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!gpu_bundle' || echo ' (with local changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  grep -E '^LIBTORCH_VERSION' "$(bazel info output_base)/external/libtorch/version.bzl" | sed 's/LIBTORCH_VERSION = /libtorch: /'
  echo "python extension: $(cd "$out/python/reloadsafe" && ls _C.*.so)"
  echo "copy_bench: ${bench_mode[*]:-fastbuild}"
} > "$out/BUILD_INFO"
say "$(du -sh "$out" | cut -f1) in $out/: $(ls "$out/bin" | tr '\n' ' ')"
