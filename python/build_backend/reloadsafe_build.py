"""In-tree build backend (PEP 517) of the reloadsafe package: lets
`pip install <clone>/python` build the wheel with Bazel, against the torch of
the environment pip installs into.

The extension module must be compiled from the repository's C++ sources
against that torch (any of 2.11 to 2.15, third_party/libtorch/libtorch.bzl);
Bazel does that (python/BUILD.bazel). This backend:

1. asks pip's interpreter (outside pip's isolated build environment) which
   torch it has, and stops with one line saying what to install when it has
   none or one outside the supported range;
2. checks what the Bazel build needs from the machine (Bazel and the Debian
   packages it reads: tools/setup.sh is not needed) and, when something is
   missing, stops with the one command that installs it;
3. runs `bazel build //python:package` with RELOADSAFE_PYTHON set to that
   interpreter (so the extension is built for it and against its torch, with
   the C++ standard that torch needs), in output folders of its own per torch
   series, so installing into environments with different torches does not
   rebuild the checkout's other builds; and hands pip the wheel Bazel wrote.

Only the standard library is used; there is no source distribution.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBTORCH_BZL = os.path.join(_ROOT, "third_party", "libtorch", "libtorch.bzl")

# What //python:package needs from the machine besides Bazel's own shims:
# (Debian package, how to tell it is installed).
_DEBIAN_NEEDS = [
    ("bazel-bootstrap", lambda: shutil.which("bazel") is not None),
    ("bazel-rules-java", lambda: os.path.isdir("/usr/share/bazel/rules/java")),
    ("g++", lambda: shutil.which("g++") is not None and shutil.which("gcc") is not None),
    ("nlohmann-json3-dev", lambda: os.path.exists("/usr/include/nlohmann/json.hpp")),
]

# The Bazel server a pip install starts exits this long after the build.
_SERVER_IDLE_SECONDS = 300


class BuildError(RuntimeError):
    """A build that cannot start or finish, with what to do about it."""


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


def supported_torch(text=None):
    """((2, 11), (2, 15)): SUPPORTED_TORCH of the LibTorch rule, the one place
    the range is written."""
    if text is None:
        with open(_LIBTORCH_BZL) as f:
            text = f.read()
    m = re.search(r"^SUPPORTED_TORCH = \(\((\d+), (\d+)\), \((\d+), (\d+)\)\)$", text, re.M)
    if not m:
        raise BuildError(f"{_LIBTORCH_BZL} has no SUPPORTED_TORCH line")
    a, b, c, d = map(int, m.groups())
    return (a, b), (c, d)


def target_torch(python, env):
    """The torch version installed for interpreter `python` ("2.15.0+cu132"),
    or None; read from its metadata, without importing torch."""
    probe = ("import importlib.metadata as m\ntry:\n    print(m.version('torch'))\n"
             "except m.PackageNotFoundError:\n    pass\n")
    done = subprocess.run([python, "-c", probe], env=env, text=True, capture_output=True)
    if done.returncode != 0:
        raise BuildError(f"could not ask {python} for its torch: {done.stderr.strip()}")
    return done.stdout.strip() or None


def check_torch(version, python, supported):
    """The torch series (2, 15) of `version`, or BuildError saying what to
    install into the environment of `python`."""
    (lo, hi) = supported
    wanted = f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}"
    span = f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"
    if version is None:
        raise BuildError(f"reloadsafe is built against the torch of the environment it is installed "
                         f"into, and {python} has none: install one first ({python} -m pip install "
                         f"'{wanted}'), then install reloadsafe again.")
    m = re.match(r"(\d+)\.(\d+)", version)
    series = (int(m.group(1)), int(m.group(2))) if m else None
    if series is None or not lo <= series <= hi:
        raise BuildError(f"the torch of {python} is {version}; reloadsafe supports torch {span}: "
                         f"install one of those there ({python} -m pip install '{wanted}').")
    return series


def missing_debian_packages(needs=None):
    """The Debian packages of `needs` (default: what the build needs) whose
    files are absent."""
    return [name for name, present in (_DEBIAN_NEEDS if needs is None else needs) if not present()]


def python_headers_missing(python, env):
    """True when interpreter `python` has no Python.h (python3-dev)."""
    probe = "import sysconfig, os; print(os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
    done = subprocess.run([python, "-c", probe], env=env, text=True, capture_output=True)
    return done.stdout.strip() != "True"


def check_machine(python, env):
    """BuildError with the one command that installs what the build lacks."""
    missing = missing_debian_packages()
    if python_headers_missing(python, env):
        missing.append("python{}.{}-dev".format(*sys.version_info[:2]))
    if missing:
        sudo = "" if os.geteuid() == 0 else "sudo "
        raise BuildError("building reloadsafe needs Debian packages that are missing: install them with\n"
                         f"  {sudo}apt-get install -y --no-install-recommends {' '.join(missing)}\n"
                         "then run pip again.")


def bazel_flags(series):
    """Flags of every Bazel command of the build: its own output folders per
    torch series (pip-torch2.15), apart from the checkout's default ones."""
    return [f"--platform_suffix=pip-torch{series[0]}.{series[1]}"]


def _bazel(args, env, capture=False):
    cmd = ["bazel", f"--max_idle_secs={_SERVER_IDLE_SECONDS}", *args]
    try:
        done = subprocess.run(cmd, cwd=_ROOT, env=env, text=True,
                              stdout=subprocess.PIPE if capture else None)
    except FileNotFoundError:
        raise BuildError("bazel is not on PATH: install it with "
                         "`sudo apt-get install -y --no-install-recommends bazel-bootstrap`") from None
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed (exit {done.returncode}); its output is above")
    return done.stdout.strip() if capture else None


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    env = _env()
    python = env["RELOADSAFE_PYTHON"]
    try:
        version = target_torch(python, env)
        series = check_torch(version, python, supported_torch())
        check_machine(python, env)
        flags = bazel_flags(series)
        print(f"[reloadsafe] bazel build //python:package for {python} (torch {version})", file=sys.stderr)
        _bazel(["build", *flags, "//python:package"], env)
        bin_dir = _bazel(["info", *flags, "bazel-bin"], env, capture=True)
    except BuildError as e:
        # One message, without a traceback through pip's hook runner.
        print(f"\nreloadsafe: {e}\n", file=sys.stderr)
        raise SystemExit(1) from None
    tag = "cp{}{}".format(*sys.version_info[:2])
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
