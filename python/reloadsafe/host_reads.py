"""Reads of a tensor's values that no op makes, shown to the read trace.

``Tensor.tolist()`` and ``Tensor.numpy()`` (and ``numpy.asarray(t)``, which
calls it) hand a tensor's values to Python without going through PyTorch's
dispatcher, so a trace sees no op there. A forward that chooses its ops by
such values (Hugging Face's JetMoE sizes its experts' splits with
``tolist()``) then looks, after a correct reload whose new weights route the
tokens otherwise, like a reload that changed the forward's ops. While
``noting_host_reads()`` is active, both methods first call the op
``reloadsafe::host_read`` on the tensor: it computes nothing, and a capture
counts it among the ops that read values (Note [A read of values no op makes]
in conformance/trace/read_trace.h). ``check_reload`` keeps it active while
the protocol runs.

The methods are replaced on ``torch.Tensor`` for that time (each process
thread sees them; outside a trace the op is one dispatch of nothing) and put
back as they were after the outermost use. A tensor subclass that dispatches
in Python (torchao's wrappers, fake tensors) is left alone: the op is called
on plain tensors only.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._loader import _C  # noqa: F401  (registers reloadsafe::host_read)

__all__ = ["noting_host_reads"]

_METHODS = ("tolist", "numpy")
_lock = threading.Lock()
_users = 0
# Each method's entry in torch.Tensor's own dict before the first use
# (None: inherited from the C++ base class, so deleted again afterwards).
_before: dict[str, Any] = {}


def _plain(t: torch.Tensor) -> bool:
    return type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__


def _noting(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def noted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _plain(self):
            torch.ops.reloadsafe.host_read(self)
        return method(self, *args, **kwargs)

    # Run, never traced, by torch.compile: traced into a graph the op, which
    # returns nothing, is dropped as dead code, and the read would go unseen
    # (a compiled forward breaks its graph at tolist() anyway). With
    # capture_scalar_outputs Dynamo does not call this method: it puts one
    # _local_scalar_dense per value into the graph, an op that reads values,
    # so fullgraph=True still compiles and the read is still seen.
    return torch.compiler.disable(noted)


@contextlib.contextmanager
def noting_host_reads() -> Iterator[None]:
    """While active, ``Tensor.tolist()`` and ``Tensor.numpy()`` call
    ``reloadsafe::host_read`` on a plain tensor before reading it. Nests, and
    is safe to enter from several threads."""
    global _users
    with _lock:
        if _users == 0:
            for name in _METHODS:
                _before[name] = torch.Tensor.__dict__.get(name)
                setattr(torch.Tensor, name, _noting(getattr(torch.Tensor, name)))
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for name in _METHODS:
                    if _before[name] is None:
                        delattr(torch.Tensor, name)
                    else:
                        setattr(torch.Tensor, name, _before[name])
