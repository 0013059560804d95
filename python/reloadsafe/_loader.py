"""Loads the compiled core, reloadsafe._C, after torch, and checks that it was
built against the torch this interpreter imports."""
from __future__ import annotations

import sys

import torch

# How to rebuild the extension for this interpreter and its torch.
_REBUILD = (f"`{sys.executable} -m pip install --force-reinstall --no-deps <reloadsafe checkout>/python` "
            "(or, in the checkout, RELOADSAFE_PYTHON=<this python> bazel build //python:package)")

try:
    from . import _C
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "reloadsafe's compiled core (reloadsafe._C) could not be loaded: "
        f"{e}. Build it against this interpreter's torch with {_REBUILD} "
        "(see docs/python.md)."
    ) from e

_torch_version = torch.__version__.split("+")[0]
if _torch_version != _C.TORCH_VERSION:
    raise ImportError(
        f"reloadsafe._C was built against torch {_C.TORCH_VERSION} but this interpreter imports "
        f"torch {torch.__version__} from {torch.__file__}: rebuild reloadsafe against this torch "
        f"with {_REBUILD}, or install torch=={_C.TORCH_VERSION}."
    )
if bool(torch._C._GLIBCXX_USE_CXX11_ABI) != _C.GLIBCXX_USE_CXX11_ABI:
    raise ImportError(
        f"reloadsafe._C was built with _GLIBCXX_USE_CXX11_ABI={int(_C.GLIBCXX_USE_CXX11_ABI)} "
        f"but torch uses {int(torch._C._GLIBCXX_USE_CXX11_ABI)}: rebuild reloadsafe against this torch "
        f"with {_REBUILD}."
    )

__all__ = ["_C"]
