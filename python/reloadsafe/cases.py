"""The conformance case runner (golden/FORMAT.md) on case lines and files.

A Python implementation of the utilities can be checked against the reference
by running the same case file through both and comparing the result lines:

    >>> import reloadsafe
    >>> reloadsafe.evaluate_case('{"id": "E2", "op": "extent", "shape": [4, 4], "stride": [1, 4]}')
    {'id': 'E2', 'extent': 16}
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from ._loader import _C

__all__ = ["evaluate_case", "run_cases", "MAX_CASE_STORAGE_BYTES"]

#: The most bytes of CPU storage one case may ask for (all its storages together).
MAX_CASE_STORAGE_BYTES: int = _C.MAX_CASE_STORAGE_BYTES


def evaluate_case(case: str | dict[str, Any]) -> dict[str, Any]:
    """Evaluates one case (a JSON line, or the case as a dict) with the C++
    reference and returns its result: the case's ``id`` and either the
    operation's outputs or ``error``. Never raises for a bad case: the error
    is in the result."""
    line = case if isinstance(case, str) else json.dumps(case)
    return json.loads(_C.evaluate_case(line))


def run_cases(source: str | os.PathLike | Iterable[str]) -> list[dict[str, Any]]:
    """Evaluates every case of a case file (a path) or of an iterable of case
    lines, in order, and returns one result per case. Blank lines are not
    cases and yield nothing, as in ``bazel run //conformance:cases``."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as f:
            lines = f.read().splitlines()
    else:
        lines = list(source)
    return [json.loads(_C.evaluate_case(line)) for line in lines if _C.is_case_line(line)]
