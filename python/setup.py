"""setuptools build of the `reloadsafe` package: the Python sources and the
extension module reloadsafe._C, compiled by torch.utils.cpp_extension from the
repository's C++ sources against the torch of the environment it is installed
into (any of 2.11 to 2.15). It needs a C++ compiler (C++17; C++20 for torch
2.14 and newer) and that torch; the build requirements (setuptools, ninja,
the nlohmann-json headers) come from the Python package registry.

    pip install ./python                  # from a checkout
    tools/build_wheel.sh PYTHON OUT_DIR   # sdist, then a wheel for PYTHON's torch

pip runs this file through build_backend/reloadsafe_build.py, which lets it
import the environment's torch from pip's isolated build environment.

What is compiled is python/extension_sources.bzl, the list Bazel's build of
the same module reads (//python:extension_sources_test holds the two
together); the C++ standard per torch series is third_party/libtorch/
libtorch.bzl's table, as in the Bazel build. Both files are read as Python
literals. In a checkout the C++ files are found in the repository; an sdist
carries them (and that table) under cpp/.

Compilation runs in parallel through ninja: MAX_JOBS=N limits the jobs
(torch.utils.cpp_extension reads it). The sources are compiled in batches,
each batch one translation unit that includes its sources (see
unity_batches()), as many batches as compile jobs run at once
(unity_batch_size()); RELOADSAFE_UNITY_BATCH=N sets the batch size instead,
and 1 compiles every source on its own.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import shutil

# setuptools and torch are imported where they are used, so the tests can
# import this file's helpers wherever they run.

HERE = pathlib.Path(__file__).resolve().parent
# Where an sdist keeps the repository's files the build reads, by their paths
# in the repository.
SDIST_TREE = "cpp"
LIBTORCH_BZL = "third_party/libtorch/libtorch.bzl"
EXTENSION_NAME = "reloadsafe._C"
# Added after Python's own flags (-O3 -g), which compile these sources
# (LibTorch's and pybind11's templates) about twice as slowly; -O1 without
# debug information costs little more compile time than -O0 (measured with
# g++ 12 over the listed sources).
OPT_FLAGS = ["-O1", "-g0"]
# Every source includes LibTorch's and pybind11's headers, and parsing them
# is most of a source's compile time: a unity batch parses them once for all
# its sources, so the fewer the batches the less the build's CPU time, down to
# one batch per compile job that runs at once (fewer would leave a core idle).
# Measured 2026-12-06 on two cores (AMD EPYC), the wheel for Python 3.10 and
# torch 2.11, 68 sources, `pip wheel` of the sdist: batches of 8 (10 units)
# 84-105 s, of 17 66 s, of 34 (two units and the one compiled alone) 58 s, of
# 68 (one unit) 65 s. The price is the rebuild after an edit, which compiles
# the edited source's whole batch again.


class BuildError(RuntimeError):
    """A build that cannot go on, with what to do about it."""


def source_root(here: pathlib.Path = HERE) -> pathlib.Path:
    """The folder the repository-relative paths start from: the sdist's copy,
    or the checkout this folder is part of."""
    packed = here / SDIST_TREE
    return packed if packed.is_dir() else here.parent


def bzl_values(path: pathlib.Path, names: list[str]) -> dict:
    """The values of the top-level assignments `names` in a .bzl file, which
    must be Python literals (the file's other statements are not run)."""
    tree = ast.parse(path.read_text(), str(path))
    found = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name in names:
            try:
                found[name] = ast.literal_eval(node.value)
            except ValueError:
                raise BuildError(f"{path}: {name} must be a plain literal") from None
    missing = [n for n in names if n not in found]
    if missing:
        raise BuildError(f"{path} has no {', '.join(missing)}")
    return found


def extension_lists(here: pathlib.Path = HERE) -> dict[str, list[str]]:
    """EXTENSION_SOURCES, EXTENSION_CUDA_SOURCES and EXTENSION_HEADERS of
    extension_sources.bzl."""
    return bzl_values(here / "extension_sources.bzl",
                      ["EXTENSION_SOURCES", "EXTENSION_CUDA_SOURCES", "EXTENSION_HEADERS"])


def libtorch_table(root: pathlib.Path) -> tuple[tuple, list]:
    """(SUPPORTED_TORCH, CXX_STANDARDS) of the Bazel build's LibTorch rule."""
    values = bzl_values(root / LIBTORCH_BZL, ["SUPPORTED_TORCH", "CXX_STANDARDS"])
    return values["SUPPORTED_TORCH"], values["CXX_STANDARDS"]


def torch_series(version: str) -> tuple[int, int] | None:
    """(2, 15) for "2.15.0+cu132" or "2.15.0a0"; None if it does not start
    with two numbers."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_torch(version: str, supported: tuple) -> tuple[int, int]:
    """The series of torch `version`, or BuildError when it is outside
    `supported` ((2, 11), (2, 15))."""
    lo, hi = supported
    series = torch_series(version)
    if series is None or not lo <= series <= hi:
        raise BuildError(
            f"the torch of this environment is {version}; reloadsafe supports torch "
            f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}: install one of those "
            f"(pip install 'torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}') and build again.")
    return series


def cxx_standard(series: tuple[int, int], standards: list, aten_header: str = "") -> str:
    """The -std= value torch `series` needs: the first CXX_STANDARDS entry not
    newer than it, or newer if ATen/ATen.h itself demands it ("#error C++20 or
    later ..."), as third_party/libtorch/libtorch.bzl decides."""
    chosen = next((std for first, std in standards if series >= tuple(first)), None)
    if chosen is None:
        raise BuildError(f"CXX_STANDARDS has no entry for torch {series[0]}.{series[1]}")
    m = re.search(r"^#error C\+\+(\d+) or later", aten_header, re.M)
    if m and int(m.group(1)) > int(chosen[len("c++"):]):
        chosen = "c++" + m.group(1)
    return chosen


CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: pathlib.Path = CGROUP_ROOT) -> int | None:
    """The CPUs a cgroup quota lets this process use, rounded up (a container
    started with --cpus=2 on a machine of 64 cores: 2), or None where no quota
    is set: cgroup v2's cpu.max ("max" or "QUOTA PERIOD"), else cgroup v1's
    cpu/cpu.cfs_quota_us (-1: none) over cpu/cpu.cfs_period_us."""
    try:
        fields = (root / "cpu.max").read_text().split()
    except OSError:
        fields = None
    try:
        if fields is not None:
            if len(fields) != 2 or fields[0] == "max":
                return None
            quota, period = int(fields[0]), int(fields[1])
        else:
            quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
            period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, -(-quota // period))


def compile_jobs(env: dict, cgroup_root: pathlib.Path = CGROUP_ROOT) -> int:
    """How many compiles can run at once: MAX_JOBS from `env` where it is a
    positive integer (torch's cpp_extension hands it to ninja), else the cores
    this process may run on, fewer where a cgroup quota allows fewer."""
    value = env.get("MAX_JOBS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root)
    return max(1, min(cores, limit) if limit else cores)


def unity_batch_size(env: dict, sources: int, jobs: int) -> int:
    """The batch size for `sources` sources compiled `jobs` at once
    (compile_jobs()): RELOADSAFE_UNITY_BATCH from `env` (a positive integer),
    else the sources divided among as many batches as jobs, rounded up."""
    value = env.get("RELOADSAFE_UNITY_BATCH", "")
    if not value:
        return max(1, -(-sources // jobs))
    if not value.isdigit() or int(value) < 1:
        raise BuildError(f"RELOADSAFE_UNITY_BATCH={value!r}: give a positive number of sources per "
                         "translation unit (1 compiles each source on its own)")
    return int(value)


# Macros a source may define before its includes to choose what LibTorch's
# headers declare; undefined after each source of a batch, so they reach no
# other source.
UNITY_SCOPED_MACROS = ["TORCH_ASSERT_ONLY_METHOD_OPERATORS", "TORCH_ASSERT_NO_OPERATORS"]


def compiles_alone(text: str) -> bool:
    """Whether a source must be its own translation unit: one that defines
    NDEBUG before its includes, to see LibTorch's headers as the library was
    built, cannot share headers already read without it."""
    return any(line.strip() == "#define NDEBUG" for line in text.splitlines())


def unity_batches(sources: list[str], root: pathlib.Path, dest: pathlib.Path, batch: int) -> list[str]:
    """The translation units compiling `sources` (paths relative to `root`,
    which is on the include path): a file in `dest` per batch of up to
    `batch` consecutive sources that includes them in order, or the sources
    themselves when `batch` is 1. A source that compiles_alone() is its own
    unit. A batch file is rewritten only when its text changes, so ninja
    rebuilds only the batches whose sources changed (each unit's dependency
    file lists the sources it includes).

    The sources of a batch must compile together: no two may define the same
    name in an anonymous namespace or at file scope, and a macro one defines
    must not change another (UNITY_SCOPED_MACROS are undefined after each).
    tools/pip_install_test.sh, part of the test command, compiles the
    wheel's batches this way; tests/test_torch_range.py checks the batching."""
    if batch == 1:
        return [str(root / s) for s in sources]
    dest.mkdir(parents=True, exist_ok=True)
    groups: list[list[str]] = []
    current: list[str] = []
    for s in sources:
        if compiles_alone((root / s).read_text()):
            groups.append([s])
            continue
        current.append(s)
        if len(current) == batch:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    units = []
    undefs = "".join(f"#undef {m}\n" for m in UNITY_SCOPED_MACROS)
    for i, group in enumerate(groups):
        if len(group) == 1:
            units.append(str(root / group[0]))
            continue
        unit = dest / f"unity_{i:02d}.cc"
        text = "// Generated by python/setup.py: these sources as one translation unit.\n" + "".join(
            f'#include "{s}"\n{undefs}' for s in group)
        if not unit.exists() or unit.read_text() != text:
            unit.write_text(text)
        units.append(str(unit))
    return units


def json_include() -> str:
    """The folder holding nlohmann/json.hpp: the nlohmann-json build
    requirement's."""
    spec = importlib.util.find_spec("nlohmann_json")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("the nlohmann-json package (a build requirement in pyproject.toml) is not "
                         "installed: pip installs it, or install it yourself with "
                         "--no-build-isolation (pip install nlohmann-json)")
    return os.path.join(list(spec.submodule_search_locations)[0], "include")


def stable_copy(include: str, dest: pathlib.Path) -> str:
    """`include` copied to `dest`, with its files' times, and `dest`. pip's
    isolated build environment has a new path on every build; the JSON
    headers' include flag must not, or ninja recompiles every source of an
    in-tree build (pip install ./python) that changed nothing."""
    shutil.copytree(include, dest, dirs_exist_ok=True)
    return str(dest)


def cuda_toolkit(cpp_extension) -> str | None:
    """The CUDA Toolkit whose headers the CUDA host sources compile against,
    when this torch is a CUDA build; None otherwise (those sources are then
    left out, as Bazel leaves them out without a toolkit)."""
    import torch

    home = cpp_extension.CUDA_HOME
    if torch.version.cuda is None or not home:
        return None
    return home if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")) else None


def torch_extension(cpp_extension, root: pathlib.Path):
    """reloadsafe._C as torch.utils.cpp_extension builds it: the listed
    sources, with the CUDA ones and LibTorch's CUDA libraries where a toolkit
    is found."""
    lists = extension_lists()
    sources = lists["EXTENSION_SOURCES"]
    make = cpp_extension.CppExtension
    if cuda_toolkit(cpp_extension):
        sources = sources + lists["EXTENSION_CUDA_SOURCES"]
        make = cpp_extension.CUDAExtension
    return make(
        EXTENSION_NAME,
        sources=[str(root / s) for s in sources],
        include_dirs=[str(root)],
        define_macros=[("AT_PER_OPERATOR_HEADERS", None)],
        # Only the module's init function is exported, as in every PyTorch
        # extension; the C++ standard is added when the torch is checked.
        extra_compile_args={"cxx": ["-fvisibility=hidden", *OPT_FLAGS], "nvcc": []},
        libraries=["dl"],
    )


def torch_build_ext(cpp_extension, root: pathlib.Path) -> type:
    """torch.utils.cpp_extension.BuildExtension that first checks the torch,
    adds the C++ standard it needs and the JSON headers."""

    class TorchBuildExt(cpp_extension.BuildExtension):
        def build_extensions(self) -> None:
            import torch

            try:
                supported, standards = libtorch_table(root)
                series = check_torch(torch.__version__, supported)
                aten = pathlib.Path(torch.__file__).parent / "include" / "ATen" / "ATen.h"
                std = cxx_standard(series, standards, aten.read_text() if aten.exists() else "")
                json = stable_copy(json_include(), pathlib.Path(self.build_temp) / "nlohmann_json")
            except BuildError as e:
                raise SystemExit(f"reloadsafe: {e}") from None
            for ext in self.extensions:
                count = len(ext.sources)
                jobs = compile_jobs(dict(os.environ))
                try:
                    batch = unity_batch_size(dict(os.environ), count, jobs)
                except BuildError as e:
                    raise SystemExit(f"reloadsafe: {e}") from None
                rel = [os.path.relpath(src, root) for src in ext.sources]
                ext.sources = unity_batches(rel, root, pathlib.Path(self.build_temp) / "unity", batch)
                ext.include_dirs.append(json)
                ext.extra_compile_args["cxx"].append(f"-std={std}")
                print(f"[reloadsafe] compiling {EXTENSION_NAME} against torch {torch.__version__} "
                      f"with -std={std}: {count} sources in {len(ext.sources)} translation units of "
                      f"up to {batch} sources for {jobs} compile jobs at once "
                      "(RELOADSAFE_UNITY_BATCH=N sets the sources per unit)", flush=True)
            super().build_extensions()

        def get_source_files(self) -> list[str]:
            # What sdist takes from the extension: nothing here, the C++ files
            # lie outside this folder; sdist_command() copies them.
            return []

    return TorchBuildExt


def no_torch_build_ext(why: Exception) -> type:
    """A build_ext that stops, saying torch is needed, for an environment
    where it cannot be imported (the sdist and metadata need no torch)."""
    from setuptools.command.build_ext import build_ext

    class NoTorchBuildExt(build_ext):
        def run(self) -> None:
            raise SystemExit(
                f"reloadsafe: building {EXTENSION_NAME} needs torch (2.11 to 2.15) importable by the "
                f"Python it is built for ({why}). Install torch there first; `pip install` finds it. "
                "An isolated `python -m build` runs in a fresh environment without torch: set "
                "RELOADSAFE_PYTHON=<the python whose torch to build against>, or pass --no-isolation.")

        def get_source_files(self) -> list[str]:
            return []

    return NoTorchBuildExt


def sdist_files(here: pathlib.Path = HERE) -> list[str]:
    """The repository's files an sdist carries under cpp/: every file of
    extension_sources.bzl and the LibTorch rule's table."""
    lists = extension_lists(here)
    return [*lists["EXTENSION_SOURCES"], *lists["EXTENSION_CUDA_SOURCES"],
            *lists["EXTENSION_HEADERS"], LIBTORCH_BZL]


def sdist_command() -> type:
    """setuptools' sdist, which also copies sdist_files() under cpp/, so a
    wheel builds from the sdist alone."""
    from setuptools.command.sdist import sdist

    class SdistWithCppSources(sdist):
        def make_release_tree(self, base_dir: str, files: list[str]) -> None:
            super().make_release_tree(base_dir, files)
            root = source_root()
            for rel in sdist_files():
                dest = os.path.join(base_dir, SDIST_TREE, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copy2(root / rel, dest)

    return SdistWithCppSources


def main() -> None:
    from setuptools import Extension, setup

    root = source_root()
    try:
        from torch.utils import cpp_extension
    except ImportError as e:
        ext, build_cls = Extension(EXTENSION_NAME, sources=[]), no_torch_build_ext(e)
    else:
        ext, build_cls = torch_extension(cpp_extension, root), torch_build_ext(cpp_extension, root)
    setup(ext_modules=[ext], cmdclass={"build_ext": build_cls, "sdist": sdist_command()})


if __name__ == "__main__":
    main()
