"""A layer's state against another's, by name.

A reload is right when the layer afterwards holds what a fresh cold load of
the same checkpoint holds. The forward comparison says *whether* it does;
the state comparison says *which* tensor or host number does not: every
tensor ``named_tensors`` reaches and every ``int``/``float``
``named_numbers`` reaches, in both layers, compared by name.

``check_reload(..., compare_state=True)`` and ``host_numbers=True`` are the
C++ protocol's steps (``conformance/harness/layer_state.h``, run by
``protocol.cc`` after every reload); the Python subject in layer_subject.py hands it
the names. ``state_differences`` here is the same comparison on two modules,
for tests and for an author who wants to look at one reload by hand.

Only names both layers have are compared: state the forward makes (a
workspace, a lazily built cache) exists in the live layer only and is not
compared. Floating values within rtol 1e-5 and atol 1e-6 are equal (the same
arithmetic in another order), and NaN equals NaN.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ._loader import _C
from .walk import named_numbers, named_tensors

__all__ = ["StateDifference", "state_differences"]


@dataclasses.dataclass(frozen=True)
class StateDifference:
    """One name whose value in ``live`` is not ``cold``'s: ``before`` is
    the cold side's (a number, or a tensor's layout), ``after`` the live
    side's (a number, or how far the tensor is off)."""

    name: str
    before: str
    after: str


class _Held(_C.SubjectLayer):
    """A module as the protocol names what a layer holds (the walk's names),
    for ``_C.layer_state``: the one place a layer's state is assembled."""

    def __init__(self, module: torch.nn.Module) -> None:
        _C.SubjectLayer.__init__(self)
        self.module = module

    def named_tensors(self) -> list[Any]:
        return [_C.NamedTensor(n.name, n.tensor, True) for n in named_tensors(self.module)]

    def named_numbers(self) -> list[Any]:
        return [_C.NamedNumber(n, float(v), isinstance(v, int)) for n, v in named_numbers(self.module)]


def _state(module: torch.nn.Module, skip: set[str], extra: Sequence[tuple[str, torch.Tensor]]) -> Any:
    caches = [_C.NamedTensor(n, t, True) for n, t in extra]
    return _C.layer_state(_Held(module), caches, sorted(skip))


def state_differences(
    live: torch.nn.Module,
    cold: torch.nn.Module,
    skip: Iterable[str] = (),
    live_extra: Sequence[tuple[str, torch.Tensor]] = (),
    cold_extra: Sequence[tuple[str, torch.Tensor]] = (),
) -> list[StateDifference]:
    """Every name ``live`` and ``cold`` both reach (tensors, then host
    numbers) whose value differs, in the order ``named_tensors`` and
    ``named_numbers`` give them; names in ``skip`` are not compared.
    ``live_extra`` and ``cold_extra`` are more named tensors of each side (a
    module cache's)."""
    skipped = set(skip)
    return [
        StateDifference(d.name, d.before, d.after)
        for d in _C.state_differences(_state(live, skipped, live_extra), _state(cold, skipped, cold_extra))
    ]
