"""The package as installed: built against this torch, its metadata and
plugin entry point, and a documented public API."""
import importlib.metadata
import pathlib
import re

import torch

import reloadsafe

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
LIBTORCH_BZL = pathlib.Path(__file__).resolve().parents[2] / "third_party" / "libtorch" / "libtorch.bzl"


def supported_torch():
    """SUPPORTED_TORCH of the LibTorch rule: ((2, 11), (2, 15))."""
    m = re.search(r"^SUPPORTED_TORCH = \(\((\d+), (\d+)\), \((\d+), (\d+)\)\)$",
                  LIBTORCH_BZL.read_text(), re.M)
    assert m, f"no SUPPORTED_TORCH line in {LIBTORCH_BZL}"
    a, b, c, d = map(int, m.groups())
    return (a, b), (c, d)


OLDEST, NEWEST = supported_torch()
# The requirement pyproject.toml must declare: the rule's range, as pip reads it.
TORCH_RANGE = f"torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"


def _clauses(requirement):
    """("torch", {">=2.11", "<2.16"}) for "torch>=2.11,<2.16": the order of
    the clauses is the metadata writer's (setuptools sorts them)."""
    m = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement)
    assert m, requirement
    return m.group(1), {c.strip() for c in m.group(2).split(",") if c.strip()}


def test_extension_matches_this_torch(record_testsuite_property):
    # The torch tested, for the test summary and the main job's report.
    record_testsuite_property("torch_version", torch.__version__)
    assert torch.__version__.split("+")[0] == reloadsafe._C.TORCH_VERSION
    assert bool(torch._C._GLIBCXX_USE_CXX11_ABI) == reloadsafe._C.GLIBCXX_USE_CXX11_ABI


def test_this_torch_is_in_the_supported_range():
    series = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    assert OLDEST <= series <= NEWEST, f"torch {torch.__version__} is outside {OLDEST} to {NEWEST}"
    assert f'dependencies = ["{TORCH_RANGE}"]' in PYPROJECT.read_text()


def test_metadata_and_pytest_entry_point():
    dist = importlib.metadata.distribution("reloadsafe")
    assert dist.version == reloadsafe.__version__
    assert f'version = "{reloadsafe.__version__}"' in PYPROJECT.read_text()
    assert [_clauses(r) for r in dist.requires or [] if r.startswith("torch")] == [_clauses(TORCH_RANGE)]
    eps = [e for e in dist.entry_points if e.group == "pytest11"]
    assert [e.value for e in eps] == ["reloadsafe.pytest_plugin"]


def test_public_names_exist_and_are_documented():
    for name in reloadsafe.__all__:
        obj = getattr(reloadsafe, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"reloadsafe.{name} has no docstring"
