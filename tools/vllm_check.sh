#!/usr/bin/env bash
# check_reload over vLLM 0.33's own layers (python/tests/vllm), in vLLM's own
# environment: vLLM 0.33 pins torch 2.14, which no other environment of the
# project has.
#
#   tools/vllm_check.sh JUNIT_XML [extra pytest arguments]
#
# 1. The environment $CACHE/venv-vllm0.33 (python3 -m venv, then
#    pip install vllm==0.33.0 pytest: about 3 minutes and 9.5 GB the first
#    time, from the package registry); a few seconds when it is there.
# 2. This checkout's reloadsafe into it (pip install --force-reinstall
#    --no-deps ./python: setuptools builds the extension against that torch,
#    python/setup.py; minutes the first time in a checkout, seconds after
#    while the checkout's python/build/ was last built for that torch).
# 3. pytest over python/tests/vllm on vLLM's CPU platform, offline, the
#    results to JUNIT_XML.
#
# Needs a C++ compiler (tools/setup.sh installs it with the rest).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
[ $# -ge 1 ] || { echo "usage: tools/vllm_check.sh JUNIT_XML [pytest args]" >&2; exit 2; }
xml="$1"
shift
CACHE="${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}"
VLLM_VERSION=0.33.0
env_dir="$CACHE/venv-vllm0.33"
say() { printf '[vllm] %s\n' "$*"; }

# Whether the environment has vLLM $VLLM_VERSION and pytest (metadata only:
# importing vLLM takes seconds).
has_packages() {
  "$env_dir/bin/python" - "$VLLM_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m
import sys
try:
    ok = m.version("vllm") == sys.argv[1] and bool(m.version("pytest"))
except m.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
}

if [ ! -x "$env_dir/bin/python" ]; then
  say "creating $env_dir"
  mkdir -p "$CACHE"
  python3 -m venv "$env_dir" || { echo "tools/vllm_check.sh: python3 -m venv $env_dir failed" >&2; exit 1; }
fi
if ! has_packages; then
  say "installing vllm==$VLLM_VERSION and pytest into $env_dir (about 3 minutes, 9.5 GB)"
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "vllm==$VLLM_VERSION" pytest ||
    { echo "tools/vllm_check.sh: could not install vllm==$VLLM_VERSION into $env_dir" >&2; exit 1; }
fi

say "installing this checkout's reloadsafe into $env_dir (a Bazel build against its torch)"
"$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python ||
  { echo "tools/vllm_check.sh: could not build reloadsafe into $env_dir" >&2; exit 1; }

say "python/tests/vllm"
VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 \
  exec "$env_dir/bin/python" -m pytest -q -p no:cacheprovider python/tests/vllm --junitxml="$xml" "$@"
