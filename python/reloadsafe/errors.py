"""Exceptions of the reloadsafe package."""
from __future__ import annotations

__all__ = ["ReloadCheckError", "ReloadViolation"]


class ReloadCheckError(ValueError):
    """``check_reload`` was given something it cannot check (not a module, a
    forward that raises, no parameters, a load that changes shapes, ...). The
    message names what to fix."""


class ReloadViolation(AssertionError):
    """A reload broke a promise a captured CUDA graph relies on. ``report``
    holds the full report; the message is its table."""

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report
