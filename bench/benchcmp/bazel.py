"""The Bazel commands compare.py runs in a workspace (the working tree or
the A/B base's worktree): build, query, bazel-bin, shutdown; with the PATH
of the shell that started it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import TextIO

from .paths import TOP


def shell_env() -> dict[str, str]:
    """The environment of the shell that started this script. pyenv's python3
    wrapper puts its own folders in front of PATH; Bazel passes PATH to the
    compile actions, so a different PATH would miss every cached action built
    from the shell."""
    env = dict(os.environ)
    root = env.get("PYENV_ROOT")
    if root:
        parts = env.get("PATH", "").split(os.pathsep)
        while parts and parts[0].startswith(root + os.sep) and not parts[0].endswith("shims"):
            parts.pop(0)
        env["PATH"] = os.pathsep.join(parts)
    return env


def bazel_bin(cwd: str) -> str:
    """The -c opt bazel-bin folder of the workspace at cwd (the bazel-bin
    symlink follows the last command's configuration)."""
    try:
        return subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=cwd, check=True,
                              capture_output=True, text=True, env=shell_env()).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.path.join(cwd, "bazel-bin")


def build(names: Sequence[str], cwd: str, log: TextIO | None) -> None:
    """bazel build -c opt //bench:<names> in the workspace at cwd; the output
    goes to `log` (a file object or None for the terminal)."""
    if not names:
        return
    targets = [f"//bench:{n}" for n in names]
    print(f"[compare] bazel build -c opt {' '.join(targets)} (in {cwd})", flush=True)
    subprocess.run(["bazel", "build", "-c", "opt", *targets], cwd=cwd, check=True,
                   env=shell_env(), stdout=log, stderr=subprocess.STDOUT if log else None)


def has_benchmark(name: str, cwd: str) -> bool:
    """Whether the workspace at cwd defines //bench:<name> (an A/B base
    older than a new benchmark does not)."""
    try:
        return subprocess.run(["bazel", "query", f"//bench:{name}"], cwd=cwd, env=shell_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        return False


def stop_bazel(cwd: str) -> None:
    """Stops the Bazel server of the workspace at cwd (the base worktree's is
    not needed once its binaries are built)."""
    with contextlib.suppress(OSError):
        subprocess.run(["bazel", "shutdown"], cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def resolve_binary(spec: str, cwd: str = TOP) -> str:
    """A binary path for a BENCH that is a name (in cwd's bazel-bin) or a path;
    exits with a message when the named one is not built."""
    if os.sep in spec or os.path.exists(spec):
        return os.path.abspath(spec)
    path = os.path.join(bazel_bin(cwd), "bench", spec)
    if not os.path.exists(path):
        sys.exit(f"[compare] {path} does not exist: build it (bazel build -c opt //bench:{spec}) "
                 f"or give the path to the binary")
    return path
