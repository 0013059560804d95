"""The harness steps as ``check_reload``'s keywords, from the C++ step table.

A harness step (a sleep before every reload, a comparison with a cold load,
a memory bound) is one object of the C++ protocol, listed once in its step
table (``conformance/harness/step_table.cc``; ``_C.step_table()``). Its
Python keyword, the keyword's default and check, and its line in
``check_reload``'s docstring come from that table here: a step added there
is a keyword here, with nothing to write in Python.
"""
from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._loader import _C
from .errors import ReloadCheckError

__all__ = ["STEPS", "reload_steps", "steps_doc", "step_parameters"]

#: Every step of the C++ step table, by name, in the order their hooks run.
STEPS: dict[str, Any] = {spec.name: spec for spec in _C.step_table()}

OwnSleep = Callable[[torch.nn.Module], None]


def _levels(spec: Any) -> tuple[int, ...]:
    return tuple(range(1, spec.max_level + 1))


def reload_steps(values: Mapping[str, Any]) -> tuple[Any, OwnSleep | None]:
    """The ``_C.ReloadSteps`` that ``check_reload``'s step keywords ask for,
    and the engine's own sleep where ``sleep`` is a function. A step left at
    its default (``None``, ``False``) is not taken. An unknown keyword is a
    ``TypeError``, as Python's own; a value its step cannot take a
    ``ReloadCheckError`` saying what it takes."""
    steps = _C.ReloadSteps()
    own_sleep: OwnSleep | None = None
    for name, value in values.items():
        spec = STEPS.get(name)
        if spec is None:
            raise TypeError(
                f"check_reload() got an unexpected keyword argument '{name}' (the harness steps are "
                f"{', '.join(STEPS)})")
        if value is None or value is False:
            continue
        if spec.takes == "switch":
            if value is not True:
                raise ReloadCheckError(f"check_reload: {name} is a switch: pass True or False, got {value!r}")
            steps.set(name, 1)
        elif spec.takes == "level":
            if name == "sleep" and callable(value):
                own_sleep = value  # the step runs; the engine's own sleep takes it
                steps.set(name, spec.max_level)
                continue
            if isinstance(value, bool) or value not in _levels(spec):
                extra = (", a function (layer) -> None that is the engine's own sleep and wake"
                         if name == "sleep" else "")
                raise ReloadCheckError(
                    f"check_reload: {name} must be one of {_levels(spec)}{extra}, or None; got {value!r}")
            steps.set(name, int(value))
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ReloadCheckError(
                    f"check_reload: {name} must be an int, got {type(value).__name__} {value!r}: pass a "
                    f"whole number of bytes, e.g. {name}=4096")
            if value < 0:
                raise ReloadCheckError(f"check_reload: {name} must be at least 0, got {value}")
            steps.set(name, int(value))
    _C.check_steps(steps)
    return steps, own_sleep


def step_parameters() -> list[inspect.Parameter]:
    """The step keywords as ``check_reload``'s signature shows them, each
    keyword-only with its default (``False`` for a switch, else ``None``)."""
    out = []
    for name, spec in STEPS.items():
        if spec.takes == "switch":
            default, annotation = False, "bool"
        elif spec.takes == "level":
            default, annotation = None, "int | Callable[[torch.nn.Module], None] | None"
        else:
            default, annotation = None, "int | None"
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                     annotation=annotation))
    return out


def steps_doc() -> str:
    """The step keywords' part of ``check_reload``'s docstring."""
    lines = ["Harness steps, each off by default (docs/harness-steps.md):", ""]
    for name, spec in STEPS.items():
        value = {"switch": "True", "level": spec.value, "bytes": "N"}[spec.takes]
        lines.append(f"- ``{name}={value}`` ({spec.kind}): {spec.help}")
        if name == "sleep":
            lines.append("  ``sleep`` may also be a function ``(layer) -> None``, the engine's own sleep "
                         "and wake, run in place of the emulation.")
    return "\n".join(lines)
