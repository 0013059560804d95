"""In-tree build backend (PEP 517) of the reloadsafe package: lets
`pip install python/` (from a checkout) build the wheel with Bazel.

The extension module must be compiled from the repository's C++ sources
against the torch of the environment pip installs into; Bazel does that
(python/BUILD.bazel). This backend runs `bazel build //python:package` with
RELOADSAFE_PYTHON set to the interpreter running pip (so the extension is
built for it and against its torch) and hands pip the wheel Bazel wrote.
Only the standard library is used; there is no source distribution.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    # pip's isolated build environment hides the target environment's
    # site-packages (PYTHONPATH, PYTHONNOUSERSITE); Bazel's probe of the
    # interpreter must see its torch.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    env.setdefault("RELOADSAFE_PYTHON", sys.executable)
    # pip also puts its temporary build environment's bin folders first on
    # PATH. Bazel's actions see PATH, so a changed PATH would rebuild every
    # action instead of reusing the checkout's earlier build.
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if "pip-build-env-" not in d
    )
    return env


def _bazel(*args, capture=False):
    try:
        done = subprocess.run(["bazel", *args], cwd=_ROOT, env=_env(), check=True, text=True,
                              stdout=subprocess.PIPE if capture else None)
    except FileNotFoundError:
        raise RuntimeError("reloadsafe is built with Bazel: run tools/setup.sh in the checkout first") from None
    return done.stdout.strip() if capture else None


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    print(f"[reloadsafe] bazel build //python:package for {_env()['RELOADSAFE_PYTHON']}", file=sys.stderr)
    _bazel("build", "//python:package")
    bin_dir = _bazel("info", "bazel-bin", capture=True)
    tag = "cp%d%d" % sys.version_info[:2]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    wheels = glob.glob(os.path.join(bin_dir, "python", f"reloadsafe-*-{tag}-{tag}-{platform}.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"bazel build //python:package wrote no wheel for {tag}-{platform} in {bin_dir}/python")
    os.makedirs(wheel_directory, exist_ok=True)
    dest = os.path.join(wheel_directory, os.path.basename(wheels[0]))
    shutil.copyfile(wheels[0], dest)
    return os.path.basename(dest)


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("reloadsafe has no source distribution: install it from a checkout (pip install python/)")
