"""pytest plugin of reloadsafe: the ``reload_check`` fixture.

Registered under the ``pytest11`` entry point, so it is active wherever
reloadsafe is installed (``-p no:reloadsafe.pytest_plugin`` turns it off)::

    def test_my_layer_reloads(reload_check):
        reload_check(MyLayer, torch.randn(8, 64))

``reload_check`` takes ``check_reload``'s arguments, returns the report when
it is ok, and otherwise fails the test with the violation table (no Python
traceback: the table says which tensor or read moved, before and after).
"""
from __future__ import annotations

from typing import Any, Callable

import pytest


@pytest.fixture
def reload_check() -> Callable[..., Any]:
    """``reload_check(layer, example_input, **check_reload_kwargs)``: runs
    ``reloadsafe.check_reload`` and fails the test with the violation table
    unless the report is ok."""
    from .check import check_reload

    def run(*args: Any, **kwargs: Any) -> Any:
        report = check_reload(*args, **kwargs)
        if not report.ok:
            pytest.fail(f"reloadsafe: {report.name} does not keep its addresses across reloads\n\n"
                        f"{report.table()}", pytrace=False)
        return report

    return run
