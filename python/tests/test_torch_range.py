"""The supported torch range and the setuptools build: what setup.py reads
from the Bazel build's files (the range and the C++ standard per torch series
from the LibTorch rule, the sources from extension_sources.bzl), how it
batches the sources into translation units, what it tells
a user whose torch is out of range, how the in-tree backend finds the
environment's torch, the import's refusal of a torch other than the one the
extension was built against, and deprecations from our own code failing the
tests."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
REPO = PYTHON_DIR.parent
BACKEND = PYTHON_DIR / "build_backend" / "reloadsafe_build.py"
SUPPORTED = ((2, 11), (2, 15))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup_py():
    # Its helpers only: setup() runs when the file is run as a script.
    return _load("reloadsafe_setup", PYTHON_DIR / "setup.py")


@pytest.fixture(scope="module")
def backend():
    return _load("reloadsafe_build", BACKEND)


def test_the_range_and_standards_are_the_libtorch_rules(setup_py):
    supported, standards = setup_py.libtorch_table(REPO)
    assert supported == SUPPORTED
    assert [(tuple(first), std) for first, std in standards] == [((2, 14), "c++20"), ((0, 0), "c++17")]


@pytest.mark.parametrize("series, standard", [
    ((2, 11), "c++17"), ((2, 13), "c++17"), ((2, 14), "c++20"), ((2, 15), "c++20"),
])
def test_the_standard_follows_the_torch_series(setup_py, series, standard):
    _, standards = setup_py.libtorch_table(REPO)
    assert setup_py.cxx_standard(series, standards) == standard


def test_a_header_that_demands_a_newer_standard_wins(setup_py):
    _, standards = setup_py.libtorch_table(REPO)
    demands = "#pragma once\n#error C++23 or later compatible compiler is required to use ATen.\n"
    assert setup_py.cxx_standard((2, 15), standards, demands) == "c++23"
    older = "#error C++17 or later compatible compiler is required to use ATen.\n"
    assert setup_py.cxx_standard((2, 15), standards, older) == "c++20"


@pytest.mark.parametrize("version, series", [
    ("2.11.0", (2, 11)), ("2.11.0+cu130", (2, 11)), ("2.14.0", (2, 14)), ("2.15.0+cu132", (2, 15)),
    ("2.15.1", (2, 15)), ("2.15.0a0+git1234", (2, 15)),
])
def test_a_torch_in_the_range_is_accepted(setup_py, version, series):
    assert setup_py.check_torch(version, SUPPORTED) == series


@pytest.mark.parametrize("version", ["2.10.0", "2.16.0", "1.13.1", "3.0.0", "nightly"])
def test_a_torch_outside_the_range_is_refused_with_what_to_install(setup_py, version):
    with pytest.raises(setup_py.BuildError) as e:
        setup_py.check_torch(version, SUPPORTED)
    message = str(e.value)
    assert f"is {version};" in message
    assert "supports torch 2.11 to 2.15" in message
    assert "pip install 'torch>=2.11,<2.16'" in message


def test_the_lists_are_read_as_literals_and_name_existing_files(setup_py):
    lists = setup_py.extension_lists()
    assert set(lists) == {"EXTENSION_SOURCES", "EXTENSION_CUDA_SOURCES", "EXTENSION_HEADERS"}
    every = [p for paths in lists.values() for p in paths]
    assert len(every) == len(set(every)), "a file is listed twice"
    assert all(p.endswith(".cc") for p in lists["EXTENSION_SOURCES"] + lists["EXTENSION_CUDA_SOURCES"])
    assert not any(p.endswith(".cc") for p in lists["EXTENSION_HEADERS"])
    missing = [p for p in every if not (REPO / p).is_file()]
    assert not missing, f"listed in python/extension_sources.bzl but absent: {missing}"
    # The sdist carries the lists' files and the table of the LibTorch rule.
    assert setup_py.sdist_files() == every + ["third_party/libtorch/libtorch.bzl"]


def test_a_value_that_is_not_a_literal_is_refused(setup_py, tmp_path):
    bzl = tmp_path / "sources.bzl"
    bzl.write_text('load("//x:y.bzl", "Z")\nA = ["a.cc"]\nB = glob(["*.cc"])\n')
    assert setup_py.bzl_values(bzl, ["A"]) == {"A": ["a.cc"]}
    with pytest.raises(setup_py.BuildError, match="B must be a plain literal"):
        setup_py.bzl_values(bzl, ["A", "B"])
    with pytest.raises(setup_py.BuildError, match="has no C"):
        setup_py.bzl_values(bzl, ["A", "C"])


def test_the_sources_come_from_the_checkout_or_the_sdist_copy(setup_py, tmp_path):
    assert setup_py.source_root(PYTHON_DIR) == REPO
    unpacked = tmp_path / "reloadsafe-0.1.0"
    (unpacked / "cpp").mkdir(parents=True)
    assert setup_py.source_root(unpacked) == unpacked / "cpp"


def test_the_extension_compiles_what_the_lists_name(setup_py):
    # The one place setuptools takes its sources from; the Bazel side is held
    # to the same lists by //python:extension_sources_test.
    from torch.utils import cpp_extension

    lists = setup_py.extension_lists()
    ext = setup_py.torch_extension(cpp_extension, REPO)
    expected = lists["EXTENSION_SOURCES"]
    if setup_py.cuda_toolkit(cpp_extension):
        expected = expected + lists["EXTENSION_CUDA_SOURCES"]
    assert ext.name == "reloadsafe._C"
    assert ext.sources == [str(REPO / p) for p in expected]
    assert str(REPO) in ext.include_dirs


def _write_sources(root, names, text="// a source\n"):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _unit_sources(unit):
    # The sources a unit compiles: itself, or what a batch file includes.
    path = pathlib.Path(unit)
    if path.name.startswith("unity_"):
        return [line.split('"')[1] for line in path.read_text().splitlines() if line.startswith("#include")]
    return [path.name]


@pytest.mark.parametrize("count, batch, expected", [
    (5, 2, [["s0.cc", "s1.cc"], ["s2.cc", "s3.cc"], ["s4.cc"]]),
    (4, 8, [["s0.cc", "s1.cc", "s2.cc", "s3.cc"]]),
    (3, 1, [["s0.cc"], ["s1.cc"], ["s2.cc"]]),
    (3, 3, [["s0.cc", "s1.cc", "s2.cc"]]),
])
def test_sources_are_compiled_in_consecutive_batches(setup_py, tmp_path, count, batch, expected):
    names = [f"s{i}.cc" for i in range(count)]
    _write_sources(tmp_path, names)
    units = setup_py.unity_batches(names, tmp_path, tmp_path / "unity", batch)
    assert [_unit_sources(u) for u in units] == expected
    # A batch of one is the source itself, not a file that includes it.
    assert all(pathlib.Path(u).parent == tmp_path for u, e in zip(units, expected, strict=True) if len(e) == 1)


def test_a_batch_undefines_the_header_macros_after_each_source(setup_py, tmp_path):
    _write_sources(tmp_path, ["a.cc", "b.cc"])
    (unit,) = setup_py.unity_batches(["a.cc", "b.cc"], tmp_path, tmp_path / "unity", 8)
    lines = pathlib.Path(unit).read_text().splitlines()
    after_a = lines[lines.index('#include "a.cc"') + 1:lines.index('#include "b.cc"')]
    assert after_a == [f"#undef {m}" for m in setup_py.UNITY_SCOPED_MACROS]
    assert "TORCH_ASSERT_ONLY_METHOD_OPERATORS" in setup_py.UNITY_SCOPED_MACROS


def test_a_source_that_defines_ndebug_is_its_own_unit(setup_py, tmp_path):
    names = ["a.cc", "b.cc", "alone.cc", "c.cc"]
    _write_sources(tmp_path, names)
    (tmp_path / "alone.cc").write_text("#ifndef NDEBUG\n#define NDEBUG\n#endif\n#include <vector>\n")
    units = setup_py.unity_batches(names, tmp_path, tmp_path / "unity", 8)
    assert sorted(_unit_sources(u) for u in units) == [["a.cc", "b.cc", "c.cc"], ["alone.cc"]]
    # The repository's read trace is such a source (its note says why).
    assert setup_py.compiles_alone((REPO / "conformance/trace/read_trace.cc").read_text())


def test_every_listed_source_is_compiled_once(setup_py, tmp_path):
    sources = setup_py.extension_lists()["EXTENSION_SOURCES"]
    units = setup_py.unity_batches(sources, REPO, tmp_path, 8)
    compiled: list[str] = []
    for unit in units:
        path = pathlib.Path(unit)
        compiled += _unit_sources(unit) if path.parent == tmp_path else [str(path.relative_to(REPO))]
    assert sorted(compiled) == sorted(sources)
    assert len(units) < len(sources) / 4


def test_a_batch_file_is_rewritten_only_when_its_sources_change(setup_py, tmp_path):
    _write_sources(tmp_path, ["a.cc", "b.cc", "c.cc"])
    (unit,) = setup_py.unity_batches(["a.cc", "b.cc"], tmp_path, tmp_path / "unity", 8)
    os.utime(unit, ns=(1, 1))
    setup_py.unity_batches(["a.cc", "b.cc"], tmp_path, tmp_path / "unity", 8)
    assert os.stat(unit).st_mtime_ns == 1  # ninja sees nothing new
    setup_py.unity_batches(["a.cc", "c.cc"], tmp_path, tmp_path / "unity", 8)
    assert os.stat(unit).st_mtime_ns != 1
    assert '#include "c.cc"' in pathlib.Path(unit).read_text()


@pytest.mark.parametrize("env, sources, jobs, expected", [
    # As many batches as compile jobs, the sources divided among them.
    ({}, 68, 2, 34),
    ({}, 68, 3, 23),
    ({}, 68, 1, 68),
    ({}, 68, 100, 1),
    ({"RELOADSAFE_UNITY_BATCH": ""}, 10, 4, 3),
    # RELOADSAFE_UNITY_BATCH chooses, whatever the jobs.
    ({"RELOADSAFE_UNITY_BATCH": "1"}, 68, 2, 1),
    ({"RELOADSAFE_UNITY_BATCH": "12"}, 68, 2, 12),
])
def test_the_batch_size_divides_the_sources_among_the_compile_jobs(setup_py, env, sources, jobs, expected):
    assert setup_py.unity_batch_size(env, sources, jobs) == expected


def _cgroup(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "200000 100000\n"}, 2),  # cgroup v2, --cpus=2
    ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: rounded up
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu.max": "max 100000\n"}, None),  # no quota
    ({"cpu.max": "garbled\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),  # no cgroup files at all
])
def test_a_cgroup_cpu_quota_is_read_from_v2_or_v1(setup_py, tmp_path, files, expected):
    assert setup_py.cgroup_cpu_limit(_cgroup(tmp_path, files)) == expected


@pytest.mark.parametrize("env, files, expected", [
    ({"MAX_JOBS": "3"}, {"cpu.max": "100000 100000\n"}, 3),  # MAX_JOBS first
    ({}, {"cpu.max": "100000 100000\n"}, 1),  # a quota below the cores
    ({}, {"cpu.max": "max 100000\n"}, None),  # else the cores
    ({"MAX_JOBS": "many"}, {}, None),
    ({"MAX_JOBS": "0"}, {}, None),
])
def test_the_compile_jobs_are_max_jobs_else_the_cores_a_quota_allows(setup_py, tmp_path, env, files, expected):
    cores = len(os.sched_getaffinity(0))
    assert setup_py.compile_jobs(env, _cgroup(tmp_path, files)) == (cores if expected is None else expected)


@pytest.mark.parametrize("value", ["0", "-2", "eight", "2.5"])
def test_a_batch_size_that_is_not_a_positive_number_is_refused(setup_py, value):
    with pytest.raises(setup_py.BuildError, match="RELOADSAFE_UNITY_BATCH=.*positive number"):
        setup_py.unity_batch_size({"RELOADSAFE_UNITY_BATCH": value}, 68, 2)


def test_the_backend_finds_the_environments_torch_outside_the_isolation(backend, monkeypatch):
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    # What pip's isolation sets must not hide the environment's own torch.
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent-isolated-site")
    monkeypatch.delenv("RELOADSAFE_PYTHON", raising=False)
    assert backend.target_python() == sys.executable
    assert backend.environment_torch_site(sys.executable) == site
    path = ["/isolated/site-packages"]
    assert backend.expose_environment_torch(path) == site
    assert backend.expose_environment_torch(path) == site
    assert path == ["/isolated/site-packages", site], "appended once, after the isolated environment"


def _wrapper(tmp_path, *flags):
    """An executable that runs this interpreter with `flags`."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {' '.join(flags)} \"$@\"\n")
    fake.chmod(0o755)
    return str(fake)


def test_an_interpreter_without_torch_has_no_torch_site(backend, tmp_path, monkeypatch):
    # -I -S: neither site-packages nor PYTHONPATH, so no torch.
    fake = _wrapper(tmp_path, "-I", "-S")
    assert backend.environment_torch_site(fake) is None
    monkeypatch.setenv("RELOADSAFE_PYTHON", fake)
    assert backend.target_python() == fake
    assert backend.expose_environment_torch([]) is None


def test_another_python_version_is_refused(backend, tmp_path):
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\necho 2.7\necho /somewhere/site-packages\n")
    other.chmod(0o755)
    with pytest.raises(SystemExit, match=r"is Python 2.7 but the build runs on Python \d+\.\d+"):
        backend.environment_torch_site(str(other))


def test_import_refuses_another_torch_and_says_how_to_rebuild():
    # The extension records the torch it was compiled against; an interpreter
    # whose torch reports another version must not load it.
    code = ("import torch\ntorch.__version__ = '2.99.0'\n"
            "try:\n    import reloadsafe\nexcept ImportError as e:\n    print(e)\n"
            "else:\n    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "was built against torch" in out
    assert "imports torch 2.99.0" in out
    assert f"{sys.executable} -m pip install --force-reinstall --no-deps <reloadsafe checkout>/python" in out


def test_a_deprecation_warned_from_our_code_fails_the_test():
    # python/pyproject.toml turns deprecations attributed to reloadsafe's and
    # the tests' own modules into errors: a newer torch that deprecates what
    # we call (quantized tensor creation in 2.15) must fail the tests, not
    # print a warning.
    # stacklevel=1 (the default): the warnings must be attributed to this
    # module, which the filters match; a caller's module would not be.
    with pytest.raises(UserWarning, match="deprecated"):
        warnings.warn("torch.quantize_per_tensor is deprecated", UserWarning, stacklevel=1)
    with pytest.raises(DeprecationWarning):
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
