"""ReloadReport: what ``check_reload`` found for one layer, for people (a
table), machines (the C++ harness's JSON) and pytest (``raise_for_violations``)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._loader import _C
from .errors import ReloadViolation

__all__ = ["ReloadReport"]


class ReloadReport:
    """What ``check_reload`` found, for one layer.

    ``ok`` is the verdict; ``table()`` is for people (the C++ harness's
    table, with every violation by name and, for a traced read, op and
    argument); ``json()`` is for machines (the C++ harness's JSON schema);
    ``modes`` has the details per mode as plain dicts.
    """

    def __init__(self, report: Any, options: Any, notes: Sequence[str] = ()) -> None:
        self._report = report
        self._options = options
        self.notes: list[str] = list(notes)

    @property
    def name(self) -> str:
        return self._report.name

    @property
    def ok(self) -> bool:
        """True when every declared mode is clean (for a negative control:
        when the expected violation was flagged)."""
        return bool(self._report.ok())

    def json(self) -> str:
        """The report in the C++ harness's JSON schema (one backend)."""
        return _C.to_json([self._report], self._options)

    def to_dict(self) -> dict[str, Any]:
        """``json()`` parsed: this layer's entry (name, ok, and per mode the
        violations, warnings, flagged names, read counts and memory)."""
        return json.loads(self.json())["backends"][0]

    def table(self) -> str:
        """The verdict table with every listed violation and warning, then
        the notes of a failed check (``notes``: a tensor a load left in
        another layout than the checkpoint's; the names a value failure's
        culprit has, which ``check_reload`` looks up itself)."""
        table = _C.to_table([self._report])
        return table + "".join(f"  {note}\n" for note in self.notes)

    @property
    def modes(self) -> dict[str, dict[str, Any]]:
        """Per mode ("normal", "direct"): the JSON entry of that mode."""
        return self.to_dict()["modes"]

    @property
    def flagged(self) -> list[str]:
        """Every distinct tensor name and traced read flagged, in any mode."""
        out: list[str] = []
        for m in self._report.modes:
            out += [f for f in m.flagged if f not in out]
        return out

    @property
    def errors(self) -> list[str]:
        return [m.error for m in self._report.modes if m.error]

    def raise_for_violations(self) -> ReloadReport:
        """Raises ``ReloadViolation`` with the table unless ``ok``."""
        if not self.ok:
            raise ReloadViolation(self.table(), self)
        return self

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<ReloadReport {self.name!r} ok={self.ok}>"
