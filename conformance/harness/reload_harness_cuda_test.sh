#!/usr/bin/env bash
# reload_harness keeps its `--device cuda` promise on a machine without a GPU:
# LibTorch's CUDA kernels (libtorch_cuda.so, which `--as-needed` must not
# drop) and the protocol's graph step are linked in, and `--device cuda`
# without a device says that no device is visible, not that CUDA is missing.
#
#   reload_harness_cuda_test.sh PATH_TO_RELOAD_HARNESS
set -uo pipefail
harness="$1"
info="$("$harness" --build-info 2>&1)" || { echo "FAIL: $harness --build-info exited $?: $info"; exit 1; }
echo "$info"
case "$info" in
  *"CUDA linked (aten::mm has a CUDA kernel, graph step linked)"*) ;;
  *) echo "FAIL: reload_harness has no CUDA kernels or no graph step linked in"; exit 1 ;;
esac
out="$("$harness" --device cuda --reloads 1 --backend transposed 2>&1)"
rc=$?
echo "$out" | tail -5
if [ $rc -eq 2 ]; then
  case "$out" in
    *"no CUDA device is visible"*) echo "ok: no device here, and it says so" ;;
    *) echo "FAIL: exit 2 without naming the missing device"; exit 1 ;;
  esac
elif [ $rc -ne 0 ]; then
  echo "FAIL: --device cuda exited $rc"
  exit 1
fi
