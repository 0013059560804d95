"""A suite of reload checks run by `pytest -n 2` (pytest-xdist): the
`reload_check` fixture works in worker processes, each test gets its verdict,
and the failure table reaches the report."""
import os
import pathlib

import pytest

import reloadsafe

pytest.importorskip("xdist", reason="pytest-xdist is not installed (not in this environment: pip install it; the main test environment tools/setup.sh makes has it)")

LAYERS = '''
import torch

class Scaled(torch.nn.Module):
    def __init__(self, rows):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(rows, 32), requires_grad=False)
        self.register_buffer("scale", torch.ones(rows, 1))
    def process_weights_after_loading(self):
        self.scale.copy_(self.weight.abs().amax(1, keepdim=True).clamp_min(1e-6))
    def forward(self, x):
        return torch.mm(x, (self.weight / self.scale).t())

class Rebound(Scaled):
    def process_weights_after_loading(self):
        self.scale = self.weight.abs().amax(1, keepdim=True).clamp_min(1e-6)
'''

TESTS = '''
import os
import pytest
import torch
from layers import Rebound, Scaled

@pytest.mark.parametrize("rows", [8, 16, 24, 32, 40, 48])
def test_scaled(reload_check, rows):
    assert reload_check(lambda: Scaled(rows), torch.randn(4, 32), reloads=3).ok
    print("worker", os.environ["PYTEST_XDIST_WORKER"])

def test_rebound(reload_check):
    reload_check(lambda: Rebound(8), torch.randn(4, 32), reloads=3)
'''


def test_reload_checks_run_in_two_worker_processes(pytester, monkeypatch):
    site = str(pathlib.Path(reloadsafe.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(layers=LAYERS, test_layers=TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-rA", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6, failed=1)
    out = result.stdout.str()
    # Both workers ran checks (the load is spread: 7 tests on 2 workers).
    assert "worker gw0" in out and "worker gw1" in out, out
    # The failing check's table, from its worker.
    assert "does not keep its addresses across reloads" in out
    assert "scale address" in out
