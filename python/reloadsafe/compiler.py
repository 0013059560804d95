"""torch.compile inside a traced forward.

A function or module compiled with ``torch.compile`` compiles again the first
time it runs under a trace: Dynamo's guards include the thread's dispatch
keys, and a trace switches its own key on. What the compiler runs then
(Dynamo's bytecode analysis, AOTAutograd and Inductor on fake tensors, with
symbolic sizes under ``dynamic=True``) is not the forward's work, and a
captured graph holds none of it. ``watch_compilations()`` marks every
compilation as an untraced stretch (Note [Code that is not the forward's
work] in conformance/trace/read_trace.h), through Dynamo's compile callbacks:
the trace records what the compiled code runs, and what the compiler made
and keeps (a constant) counts as state that existed before the forward, as
a weight does.

Dynamo compiles under one process-wide lock and runs its start and end
callbacks on the compiling thread, so the stretch is that thread's.

Note [A compiled graph's first call]
AOTAutograd runs the first call of each graph it compiled under a dispatch
mode that checks whether custom ops alias their inputs
(``torch._functorch.config.check_custom_op_aliasing``); every later call
runs without it. A forward that compiles a graph during a check (a
recompilation for new sizes, a graph break whose resumed code Dynamo
compiles anew) makes that first call inside the trace, where the mode is a
Python dispatch: the trace sees each of the graph's ops twice (once as the
mode runs it, one level deeper), which no later call does, so a capture
taken then differs from every retrace after it (Qwen4-Exp compiled with
aot_eager: "op sequence changed" at each reload). A captured graph replays
what the later calls run. ``first_calls_as_later_ones()`` switches the
check off while a check or trace runs, so that a graph's first call inside
it runs as every later one; the first call of a graph after the block is
still checked. Torch 2.14 and newer keep a patched setting to the patching
thread; on 2.11 it is the process's, other threads' first calls included.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ._loader import _C

__all__ = ["first_calls_as_later_ones", "watch_compilations"]

def _start(_args: Any) -> None:
    _C.begin_untraced()


def _end(_args: Any) -> None:
    _C.end_untraced()


def watch_compilations() -> None:
    """Marks torch.compile's compilations as untraced stretches from now on
    (idempotent; ``torch._dynamo.reset()`` drops every callback, so each
    trace and check asks again). Only where Dynamo is already imported: code
    that compiles has imported it (``torch.compile`` does), and a process
    that never compiles pays nothing."""
    if "torch._dynamo" not in sys.modules:
        return
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without compile callbacks: nothing to mark
        return
    if _start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_start)
    if _end not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_end)


@contextlib.contextmanager
def first_calls_as_later_ones() -> Iterator[None]:
    """While active, a compiled graph's first call runs as its later ones do
    (Note [A compiled graph's first call]). Nests; a torch without that
    check is left as it is."""
    import torch._functorch.config as config

    if not getattr(config, "check_custom_op_aliasing", False):
        yield
        return
    with config.patch(check_custom_op_aliasing=False):
        yield
