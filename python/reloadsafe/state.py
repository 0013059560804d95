"""A reloaded layer's state against a cold load's, by name.

A reload is right when the layer afterwards holds what a fresh cold load of
the same checkpoint holds. The forward comparison says *whether* it does;
this module says *which* tensor or host number does not: every tensor
``named_tensors`` reaches and every ``int``/``float`` ``named_numbers``
reaches, in both layers, compared by name. ``check_reload(...,
compare_state=True)`` runs it after every reload and reports each name that
differs, at the first reload where it differs, as

- ``not idempotent``: loading the same checkpoint twice into a fresh layer
  already gives a value other than one load does (a scale halved again, a
  swap applied to what the previous pass swapped, a conversion guarded by a
  flag nothing clears);
- ``differs from a cold load``: otherwise (a derived tensor or host number
  left from an earlier checkpoint, padding that keeps an earlier pass's
  values, a buffer the reload machinery overwrote).

Only names both layers have are compared: state the forward makes (a
workspace, a lazily built cache) exists in the live layer only and is not
compared. Names in ``skip`` (``check_reload``'s ``undeclared``) are not
compared either.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ._loader import _C
from .reference import direct_reload
from .sleep import cache_tensors, caches_emptied
from .walk import named_numbers, named_tensors

__all__ = ["BakedNumbers", "ReloadPeak", "StateComparison", "StateDifference", "footprint_over_cold", "state_differences"]

# Floating values closer than this (relative and absolute) are equal: the
# same arithmetic on the same checkpoint, in another order, may round apart.
_RTOL = 1e-5
_ATOL = 1e-6


@dataclasses.dataclass(frozen=True)
class StateDifference:
    """One name whose value in ``live`` is not ``cold``'s: ``before`` is
    the cold load's (a number, or a tensor's layout), ``after`` the live
    layer's (a number, or how far the tensor is off)."""

    name: str
    before: str
    after: str


def _layout(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _tensor_difference(live: torch.Tensor, cold: torch.Tensor) -> str | None:
    """How ``live`` differs from ``cold`` in layout or value, or None."""
    if live.shape != cold.shape or live.dtype != cold.dtype:
        return _layout(live)
    a = live.detach().to("cpu")
    b = cold.detach().to("cpu")
    if a.is_floating_point() or a.is_complex():
        if torch.allclose(a, b, rtol=_RTOL, atol=_ATOL, equal_nan=True):
            return None
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        nan = a64.isnan() ^ b64.isnan()
        if bool(nan.any()):
            return f"{int(nan.sum())} NaN where a cold load has numbers"
        return f"max |diff| {float((a64 - b64).abs().max()):.4g}"
    if torch.equal(a, b):
        return None
    return f"{int((a != b).sum())} of {a.numel()} elements differ"


def state_differences(
    live: torch.nn.Module,
    cold: torch.nn.Module,
    skip: Iterable[str] = (),
    live_extra: Sequence[tuple[str, torch.Tensor]] = (),
    cold_extra: Sequence[tuple[str, torch.Tensor]] = (),
) -> list[StateDifference]:
    """Every name ``live`` and ``cold`` both reach (tensors, then host
    numbers) whose value differs, in the order ``named_tensors`` and
    ``named_numbers`` give them. ``live_extra`` and ``cold_extra`` are more
    named tensors of each side (a module cache's)."""
    skipped = set(skip)
    out: list[StateDifference] = []
    cold_tensors = {n.name: n.tensor for n in named_tensors(cold)}
    cold_tensors.update(dict(cold_extra))
    for name, t in [(n.name, n.tensor) for n in named_tensors(live)] + list(live_extra):
        other = cold_tensors.get(name)
        if other is None or name in skipped or t.numel() == 0 or t.is_meta:
            continue
        diff = _tensor_difference(t, other)
        if diff is not None:
            out.append(StateDifference(name, f"cold load {_layout(other)}", diff))
    cold_numbers = dict(named_numbers(cold))
    for name, value in named_numbers(live):
        if name in skipped or name not in cold_numbers:
            continue
        other = cold_numbers[name]
        if not math.isclose(value, other, rel_tol=_RTOL, abs_tol=_ATOL) and not (
            math.isnan(value) and math.isnan(other)
        ):
            out.append(StateDifference(name, f"cold load {other!r}", repr(value)))
    return out


class StateComparison:
    """``check_reload(..., compare_state=True)``: after every reload, the
    live layer against a cold load of the same checkpoint (made aside, as a
    plain load, outside the direct-reload mode), by name. ``subject`` is
    check.py's layer subject (``cold_loaded``, ``new_layer``,
    ``load_and_process``). Findings are kept per mode, each name at the
    first reload where it differs, and added to the report at the end."""

    def __init__(self, subject: Any, skip: Iterable[str]) -> None:
        self.subject = subject
        self.skip = set(skip)
        self.findings: list[tuple[str, int, str, str, str, str]] = []
        self._reload = 0
        self._mode = ""
        self._named: set[str] = set()
        self._not_idempotent: set[str] | None = None

    def cold_loaded(self) -> None:
        """A mode starts (its cold load)."""
        self._reload = 0
        self._named = set()

    def reloaded(self, mode: str, live: torch.nn.Module, ckpt: Mapping[str, torch.Tensor]) -> None:
        self._reload += 1
        self._mode = mode
        caches = self.subject.module_caches
        with direct_reload(False):
            cold, cold_caches = self.subject.aside_loaded(ckpt)
            differences = state_differences(
                live, cold, self.skip, cache_tensors(caches), cache_tensors(cold_caches))
            if differences and self._not_idempotent is None:
                self._not_idempotent = self._twice(ckpt, cold, cold_caches)
        for d in differences:
            if d.name in self._named:
                continue
            self._named.add(d.name)
            what = (
                "not idempotent: loading the same checkpoint twice gives another value than loading it once"
                if self._not_idempotent and d.name in self._not_idempotent
                else "differs from a cold load of the same checkpoint"
            )
            self.findings.append((mode, self._reload, d.name, what, d.before, d.after))

    def _twice(self, ckpt: Mapping[str, torch.Tensor], cold: torch.nn.Module, cold_caches: Any) -> set[str]:
        """The names a fresh layer that loads ``ckpt`` twice holds otherwise
        than one that loads it once."""
        with caches_emptied(self.subject.module_caches) as twice_caches:
            layer = self.subject.new_layer()
            self.subject.load_and_process(layer, ckpt)
            layer.eval()
            self.subject.load_and_process(layer, ckpt)
        return {
            d.name
            for d in state_differences(
                layer, cold, self.skip, cache_tensors(twice_caches), cache_tensors(cold_caches))
        }

    def add_to(self, report: Any) -> None:
        """Adds the findings to the protocol's report, as violations of
        their mode and reload."""
        for mode, reload, name, what, before, after in self.findings:
            _C.add_violation(report, mode, reload, name, what, before, after, "")


class BakedNumbers:
    """``check_reload(..., host_numbers=True)``: the host numbers (``int``,
    ``float``) the layer reaches keep the values they had when the forward
    was captured. A CUDA graph bakes a number a kernel takes as an argument
    into its launch: a reload that changes one (an FP8 scale refreshed as a
    Python float, right in eager mode) leaves the graph computing with the
    old value. Each name that changes is a violation at the first reload
    where it does, named by its attribute."""

    def __init__(self, skip: Iterable[str]) -> None:
        self.skip = set(skip)
        self.findings: list[tuple[str, int, str, str, str, str]] = []
        self._captured: dict[str, int | float] | None = None
        self._reload = 0
        self._named: set[str] = set()

    def cold_loaded(self) -> None:
        self._captured = None
        self._reload = 0
        self._named = set()

    def captured(self, live: torch.nn.Module) -> None:
        """The protocol takes its baseline (the first walk after the
        warm-up): the numbers then are the captured ones."""
        if self._captured is None:
            self._captured = dict(named_numbers(live))

    def reloaded(self, mode: str, live: torch.nn.Module) -> None:
        self._reload += 1
        if self._captured is None:
            return
        for name, value in named_numbers(live):
            old = self._captured.get(name)
            if old is None or name in self.skip or name in self._named or old == value:
                continue
            if isinstance(old, float) and math.isnan(old) and isinstance(value, float) and math.isnan(value):
                continue
            self._named.add(name)
            self.findings.append((mode, self._reload, name,
                                  "host number changed since the capture (a captured graph keeps the old value)",
                                  repr(old), repr(value)))

    def add_to(self, report: Any) -> None:
        for mode, reload, name, what, before, after in self.findings:
            _C.add_violation(report, mode, reload, name, what, before, after, "")


def footprint_over_cold(report: Any, tolerance_bytes: int, checkpoint_bytes: int) -> None:
    """``check_reload(..., cold_footprint_tolerance_bytes=N)``: the live
    tensor bytes after every reload (the protocol's ``memory_bytes``) may
    exceed the cold load's (its first entry, taken after the warm-up and
    the capture) by at most ``N``. The protocol's own rule (no growth after
    the first reload) passes a layer that keeps one extra copy from the first
    reload on; this one does not. Violation ``memory``, at the first reload
    over, per mode. ``checkpoint_bytes``: what the reload's checkpoint
    itself holds where the census counts it (on the CPU), alive when a
    reload is measured and not when the cold load is."""
    for m in report.modes:
        sizes = list(m.memory_bytes)
        mode = m.mode  # "normal" or "direct"
        for r, size in enumerate(sizes[1:], start=1):
            size -= checkpoint_bytes
            if size - sizes[0] > tolerance_bytes:
                _C.add_violation(report, mode, r, "memory",
                                 f"footprint after reload {r} exceeds the cold load's by {size - sizes[0]} bytes",
                                 f"{sizes[0]} B after the cold load", f"{size} B after reload {r}", "")
                break


class ReloadPeak:
    """``check_reload(..., reload_peak_budget_bytes=N)``: during a reload
    (its load and post-processing), live tensor storages may hold at most
    ``N`` bytes more than they did just before it. A reload that stages a
    second copy of every weight before it frees the first (TensorRT-LLM
    #14330) needs twice the weights' memory for a moment, which is an
    out-of-memory on a full GPU. Violation ``memory``, at the first reload
    over, per mode, with the peak."""

    def __init__(self, budget_bytes: int, device: torch.device) -> None:
        self.budget = budget_bytes
        self.device = device
        self.findings: list[tuple[str, int, str, str, str, str]] = []
        self._reload = 0
        self._over = False
        self._before: int | None = None

    def cold_loaded(self) -> None:
        self._reload = 0
        self._over = False

    def starting(self) -> None:
        self._before = _C.live_tensor_bytes(self.device)
        _C.take_peak_tensor_bytes(self.device)  # the peak starts from here

    def done(self, mode: str) -> None:
        self._reload += 1
        peak = _C.take_peak_tensor_bytes(self.device)
        if self._over or peak is None or self._before is None:
            return
        extra = peak - self._before
        if extra > self.budget:
            self._over = True
            self.findings.append((mode, self._reload, "memory",
                                  f"peak during reload {self._reload} is {extra} bytes above the bytes live "
                                  f"before it, over the budget of {self.budget}",
                                  f"{self._before} B before the reload", f"{peak} B at its peak"))

    def add_to(self, report: Any) -> None:
        for mode, reload, name, what, before, after in self.findings:
            _C.add_violation(report, mode, reload, name, what, before, after, "")
