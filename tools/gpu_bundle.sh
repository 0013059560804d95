#!/usr/bin/env bash
# Builds the GPU test, harness and benchmark binaries here and gathers them,
# with the shared libraries a GPU test machine without Bazel may lack, into
# gpu_bundle/ (ignored by git). tools/gpu_run.sh runs the bundle there.
#
#   tools/gpu_bundle.sh            # then carry gpu_bundle/ to the GPU machine
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/setup.sh >/dev/null
TARGETS=(
  //utils:cuda_graph_reload_test
  //conformance/harness:cuda_graph_test
  //conformance/harness:reload_harness
)
BENCH_TARGETS=()
for b in bench/*_bench.cc; do
  [ -e "$b" ] && BENCH_TARGETS+=("//bench:$(basename "$b" .cc)")
done
bazel build "${TARGETS[@]}"
[ ${#BENCH_TARGETS[@]} -eq 0 ] || bazel build -c opt "${BENCH_TARGETS[@]}"
rm -rf gpu_bundle
mkdir -p gpu_bundle/bin gpu_bundle/lib
bin="$(bazel info bazel-bin)"
for t in "${TARGETS[@]}"; do
  p="${t#//}"
  cp -L "$bin/${p/://}" gpu_bundle/bin/
done
optbin="$(bazel info -c opt bazel-bin)"
for t in "${BENCH_TARGETS[@]}"; do
  p="${t#//}"
  cp -L "$optbin/${p/://}" gpu_bundle/bin/
done
# Libraries the binaries need that are not part of LibTorch or the CUDA
# runtime: Google Benchmark is a Debian shared library.
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian gpu_bundle/lib/ 2>/dev/null || true
cp tools/gpu_run.sh tools/testlogs.py gpu_bundle/
echo "[gpu_bundle] $(du -sh gpu_bundle | cut -f1) in gpu_bundle/: $(ls gpu_bundle/bin | tr '\n' ' ')"
