"""The package as installed: built against this torch, its metadata and
plugin entry point, and a documented public API."""
import importlib.metadata
import pathlib

import torch

import reloadsafe

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_extension_matches_this_torch():
    assert reloadsafe._C.TORCH_VERSION == torch.__version__.split("+")[0]
    assert reloadsafe._C.GLIBCXX_USE_CXX11_ABI == bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def test_metadata_and_pytest_entry_point():
    dist = importlib.metadata.distribution("reloadsafe")
    assert dist.version == reloadsafe.__version__
    assert f'version = "{reloadsafe.__version__}"' in PYPROJECT.read_text()
    assert any(r.startswith("torch==2.11") for r in dist.requires or [])
    eps = [e for e in dist.entry_points if e.group == "pytest11"]
    assert [e.value for e in eps] == ["reloadsafe.pytest_plugin"]


def test_public_names_exist_and_are_documented():
    for name in reloadsafe.__all__:
        obj = getattr(reloadsafe, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"reloadsafe.{name} has no docstring"
