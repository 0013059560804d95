"""reloadsafe: check that a PyTorch layer's weight reloads keep every address
a captured CUDA graph reads.

The compiled core (``reloadsafe._C``) is built from the C++ reference against
the torch this interpreter imports; tensors cross without copies.

- ``check_reload(layer_factory, example_input, ...)``: the C++ harness's
  reload protocol on a Python layer (addresses of every reachable tensor,
  traced reads at the captured addresses, forward == fresh cold load, memory;
  a CUDA-graph capture and replay on CUDA); returns a ``ReloadReport``.
- ``check_ranks(check, world_size)``: ``check_reload`` on every rank of a
  torch.distributed world on the CPU (gloo); one ``RanksReport`` with each
  rank's verdict.
- ``trace()``: a context manager recording which tensors the code in its
  block hands to operators (external/internal, data pointers, layouts).
- ``named_tensors(module)``: every tensor reachable from a module, by name
  (parameters, buffers, attributes, containers, partials, closures, objects;
  a tensor subclass's inner tensors, ``weight.qdata``); ``named_objects``:
  the TorchScript custom-class objects (packed weights) it reaches.
- ``in_own_storage``, ``storage_view``, ``extent``, ``checked_extent``: the
  C++ reference utilities on Python tensors.
- ``SafetensorsLoader``, ``load_safetensors_``: safetensors files loaded into
  existing tensors at their addresses (the C++ loader, utils/file_loader.h).
- ``evaluate_case``, ``run_cases``: the conformance case runner
  (golden/FORMAT.md), to check a Python implementation against the reference.
- the pytest plugin (``reloadsafe.pytest_plugin``, registered under
  ``pytest11``) provides the ``reload_check`` fixture.
"""
from __future__ import annotations

from ._loader import _C  # noqa: F401  (loads torch first, checks the build)
from .cases import MAX_CASE_STORAGE_BYTES, evaluate_case, run_cases
from .check import MODES, ReloadReport, check_reload
from .errors import ReloadCheckError, ReloadViolation
from .file_loader import SafetensorsLoader, load_safetensors_
from .loading import CheckpointDrawer, default_weight_loader, draw_checkpoint, load_checkpoint
from .ranks import RanksReport, check_ranks
from .reference import (
    checked_extent,
    direct_reload,
    direct_reload_enabled,
    extent,
    in_own_storage,
    storage_view,
)
from .trace import ObjectRead, OpCall, TensorRead, Trace, trace
from .walk import NamedObject, NamedTensor, named_objects, named_tensors

__version__ = "0.1.0"

__all__ = [
    "MAX_CASE_STORAGE_BYTES",
    "CheckpointDrawer",
    "MODES",
    "NamedObject",
    "NamedTensor",
    "ObjectRead",
    "OpCall",
    "RanksReport",
    "ReloadCheckError",
    "ReloadReport",
    "ReloadViolation",
    "SafetensorsLoader",
    "TensorRead",
    "Trace",
    "check_ranks",
    "check_reload",
    "default_weight_loader",
    "draw_checkpoint",
    "load_checkpoint",
    "load_safetensors_",
    "trace",
    "checked_extent",
    "direct_reload",
    "direct_reload_enabled",
    "evaluate_case",
    "extent",
    "in_own_storage",
    "named_objects",
    "named_tensors",
    "run_cases",
    "storage_view",
]
