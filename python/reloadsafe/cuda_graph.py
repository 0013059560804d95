"""The CUDA part of ``check_reload``: the forward captured with
``torch.cuda.graph``, replayed after every reload.

A captured graph replays the kernels it recorded with the addresses it
recorded. After each reload the graph's output is poisoned (NaN, or a
sentinel for integer outputs), the graph replayed, and its output compared
with the forward of a fresh cold load of the same checkpoint: a kernel that
reads an address the reload abandoned shows as a wrong (or still poisoned)
output. This also catches reads the trace cannot see (a kernel launched
without the dispatcher, e.g. a raw Triton launch).
"""
from __future__ import annotations

from typing import Any

import torch

from ._loader import _C
from .reference import direct_reload


def _poison(out: torch.Tensor) -> None:
    if out.dtype.is_floating_point or out.dtype.is_complex:
        out.fill_(float("nan"))
    elif out.dtype == torch.bool:
        out.logical_not_()
    else:
        out.fill_(torch.iinfo(out.dtype).max)


def _differs(out: torch.Tensor, expected: torch.Tensor) -> str:
    if out.shape != expected.shape or out.dtype != expected.dtype:
        return f"{out.dtype}{list(out.shape)} vs fresh {expected.dtype}{list(expected.shape)}"
    if torch.equal(out, expected):
        return ""
    if out.dtype.is_floating_point:
        diff = (out.float() - expected.float()).abs()
        nan = int(torch.isnan(out).sum())
        return f"max |diff| {float(diff.nan_to_num(float('inf')).max()):.3g}" + (f", {nan} NaN (poison left)" if nan else "")
    return f"{int((out != expected).sum())} elements differ"


def graph_replay_check(subject: Any, report: Any, reloads: int, seed: int) -> None:
    """Adds to ``report`` a violation "cuda graph replay" for each reload
    after which the replayed graph's output differs from a fresh cold load."""
    for mode in subject.modes:
        try:
            _one_mode(subject, report, mode, reloads, seed)
        except Exception as e:  # a capture or replay that fails is a finding too
            _C.add_violation(report, mode, 0, "cuda graph", "error", "", f"{type(e).__name__}: {e}", "")


def _one_mode(subject: Any, report: Any, mode: str, reloads: int, seed: int) -> None:
    layer = subject.cold_loaded(subject.draw_checkpoint(seed))
    x = subject.draw_input(seed)
    # Warm up on a side stream, as torch.cuda.graph's documentation asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        subject.run_forward(layer, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = subject.run_forward(layer, x)
    for i in range(1, reloads + 1):
        ckpt = subject.draw_checkpoint(seed + i)
        with direct_reload(mode == "direct"):
            subject.load_and_process(layer, ckpt)
        _poison(out)
        graph.replay()
        torch.cuda.synchronize()
        expected = subject.cold_forward(ckpt, x)
        why = _differs(out, expected)
        if why:
            _C.add_violation(report, mode, i, "cuda graph replay", "output", "fresh cold load", why, "")
    del graph
