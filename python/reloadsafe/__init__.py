"""reloadsafe: check that a PyTorch layer's weight reloads keep every address
a captured CUDA graph reads.

The compiled core (``reloadsafe._C``) is built from the C++ reference against
the torch this interpreter imports; tensors cross without copies.

- ``named_tensors(module)``: every tensor reachable from a module, by name
  (parameters, buffers, attributes, containers, partials, closures, objects).
- ``in_own_storage``, ``storage_view``, ``extent``, ``checked_extent``: the
  C++ reference utilities on Python tensors.
- ``evaluate_case``, ``run_cases``: the conformance case runner
  (golden/FORMAT.md), to check a Python implementation against the reference.
- the pytest plugin (``reloadsafe.pytest_plugin``, registered under
  ``pytest11``) provides the ``reload_check`` fixture.
"""
from __future__ import annotations

from ._loader import _C  # noqa: F401  (loads torch first, checks the build)
from .cases import MAX_CASE_STORAGE_BYTES, evaluate_case, run_cases
from .reference import checked_extent, direct_reload, direct_reload_enabled, extent, in_own_storage, storage_view
from .walk import NamedTensor, named_tensors

__version__ = "0.1.0"

__all__ = [
    "MAX_CASE_STORAGE_BYTES",
    "NamedTensor",
    "checked_extent",
    "direct_reload",
    "direct_reload_enabled",
    "evaluate_case",
    "extent",
    "in_own_storage",
    "named_tensors",
    "run_cases",
    "storage_view",
]
