"""pytest plugin of reloadsafe: the ``reload_check`` fixture.

Registered under the ``pytest11`` entry point, so it is active wherever
reloadsafe is installed (``-p no:reloadsafe.pytest_plugin`` turns it off)::

    def test_my_layer_reloads(reload_check):
        reload_check(MyLayer, torch.randn(8, 64))

``reload_check`` takes ``check_reload``'s arguments, returns the report when
it is ok, and otherwise fails the test with the violation table (no Python
traceback: the table says which tensor or read moved, before and after).

A usage error (``ReloadCheckError`` raised by reloadsafe itself, with no
exception of the layer's behind it) fails a test with its message alone,
wherever ``check_reload`` was called from: reloadsafe's frames, its long
docstring among them, say nothing the message does not. An error caused by
the layer's own code (its forward raised) keeps pytest's traceback, which
shows the layer's lines.
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from .errors import ReloadCheckError


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    excinfo = call.excinfo
    if (report.failed and excinfo is not None and isinstance(excinfo.value, ReloadCheckError)
            and excinfo.value.__cause__ is None):
        report.longrepr = f"{type(excinfo.value).__name__}: {excinfo.value}"
