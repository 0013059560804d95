"""Loads the compiled core, reloadsafe._C, after torch, and checks that it was
built against the torch this interpreter imports."""
from __future__ import annotations

import torch

try:
    from . import _C
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "reloadsafe's compiled core (reloadsafe._C) could not be loaded: "
        f"{e}. Build it against this interpreter's torch: `bazel build //python:package` "
        "with RELOADSAFE_PYTHON set to this Python (see README, 'Checking a Python layer')."
    ) from e

_torch_version = torch.__version__.split("+")[0]
if _torch_version != _C.TORCH_VERSION:
    raise ImportError(
        f"reloadsafe._C was built against torch {_C.TORCH_VERSION} but this interpreter imports "
        f"torch {torch.__version__} from {torch.__file__}: install torch=={_C.TORCH_VERSION} or "
        "rebuild reloadsafe against this torch (RELOADSAFE_PYTHON, RELOADSAFE_LIBTORCH)."
    )
if bool(torch._C._GLIBCXX_USE_CXX11_ABI) != _C.GLIBCXX_USE_CXX11_ABI:
    raise ImportError(
        f"reloadsafe._C was built with _GLIBCXX_USE_CXX11_ABI={int(_C.GLIBCXX_USE_CXX11_ABI)} "
        f"but torch uses {int(torch._C._GLIBCXX_USE_CXX11_ABI)}: rebuild reloadsafe against this torch."
    )

__all__ = ["_C"]
