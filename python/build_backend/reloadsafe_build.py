"""In-tree build backend (PEP 517) of the reloadsafe package: setuptools'
own backend (setup.py builds the package with torch.utils.cpp_extension),
plus the one step pip's build isolation would otherwise prevent.

The extension must be compiled against the torch of the environment it is
installed into, not a torch of the registry's choosing: pip builds in an
isolated environment whose packages (setuptools, ninja, nlohmann-json: the
[build-system] requirements) come first on sys.path and from which the
target environment's site-packages is removed. Before a hook that builds
the extension runs setup.py, the site-packages folder that holds the target
interpreter's torch is appended to sys.path (after the isolated
environment's, so its setuptools still wins), so setup.py imports that torch
and the packages torch imports. The target interpreter is the one running
this backend (pip runs it with the interpreter it installs for), or
RELOADSAFE_PYTHON when set (the same variable names the interpreter Bazel's
build is for); it is asked without pip's isolation variables, and must be
the running Python's version.

Without a torch there (an isolated `python -m build`, whose interpreter is a
fresh environment's, unless RELOADSAFE_PYTHON names one with torch), nothing
is added and setup.py stops the build saying what to do; the sdist and the
metadata need no torch.
"""
from __future__ import annotations

import os
import subprocess
import sys

from setuptools import build_meta as _setuptools

# What pip sets to isolate the build (PYTHONPATH names its own site folder,
# whose sitecustomize removes the environment's site-packages).
_ISOLATION_VARIABLES = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")

_PROBE = (
    "import importlib.util, os, sys\n"
    "print('%d.%d' % sys.version_info[:2])\n"
    "s = importlib.util.find_spec('torch')\n"
    "print(os.path.dirname(list(s.submodule_search_locations)[0]) if s and s.submodule_search_locations else '')\n"
)


def target_python() -> str:
    """The interpreter the wheel is built for: RELOADSAFE_PYTHON, or this one."""
    return os.environ.get("RELOADSAFE_PYTHON") or sys.executable


def environment_torch_site(python: str) -> str | None:
    """The site-packages folder from which interpreter `python`, outside any
    build isolation, imports torch; None when it has no torch. SystemExit
    when `python` is another Python version than this one (the wheel is this
    one's)."""
    env = {k: v for k, v in os.environ.items() if k not in _ISOLATION_VARIABLES}
    try:
        done = subprocess.run([python, "-c", _PROBE], env=env, text=True, capture_output=True)
    except OSError as e:
        raise SystemExit(f"reloadsafe: cannot run {python} to find its torch: {e}") from None
    if done.returncode != 0:
        return None
    version, _, site = done.stdout.partition("\n")
    running = "{}.{}".format(*sys.version_info[:2])
    if version.strip() != running:
        raise SystemExit(f"reloadsafe: {python} is Python {version.strip()} but the build runs on Python "
                         f"{running}: build with that interpreter (or unset RELOADSAFE_PYTHON).")
    return site.strip() or None


def expose_environment_torch(path: list[str] = sys.path) -> str | None:
    """Appends the target environment's torch folder to `path` (once);
    returns it, or None when there is none."""
    site = environment_torch_site(target_python())
    if site and site not in path:
        path.append(site)
    return site


def _with_torch(hook):
    def run(*args, **kwargs):
        expose_environment_torch()
        return hook(*args, **kwargs)

    run.__name__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


# The hooks that build the extension see the environment's torch. The others
# (requirements, metadata, the sdist) do not need it, and setup.py then
# describes the extension without torch: importing it takes seconds a hook.
build_wheel = _with_torch(_setuptools.build_wheel)
build_editable = _with_torch(_setuptools.build_editable)
get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
build_sdist = _setuptools.build_sdist
