"""The pytest plugin: `reload_check` is available without imports, passes a
layer that keeps its addresses, and fails one that does not with the
violation table (shown here as a user would see it)."""

import os
import pathlib

import reloadsafe

LAYERS = '''
import torch

class Good(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(16, 64), requires_grad=False)
    def process_weights_after_loading(self):
        if not hasattr(self, "col_scale"):
            self.col_scale = torch.empty(64)
        self.col_scale.copy_(self.weight.abs().amax(0).clamp_min(1e-6))
    def forward(self, x):
        return torch.mm(x, (self.weight / self.col_scale).t())

class Bad(Good):
    def process_weights_after_loading(self):
        self.col_scale = self.weight.abs().amax(0).clamp_min(1e-6)   # a new tensor every load
'''


def test_fixture_passes_and_fails_with_the_table(pytester, monkeypatch):
    # The child pytest finds reloadsafe (and its pytest11 entry point) where
    # this one did, whatever the working directory.
    site = str(pathlib.Path(reloadsafe.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(layers=LAYERS)
    pytester.makepyfile(
        test_layers='''
import torch
from layers import Bad, Good

def test_good(reload_check):
    report = reload_check(Good, torch.randn(8, 64), reloads=3)
    assert report.ok

def test_bad(reload_check):
    reload_check(Bad, torch.randn(8, 64), reloads=3)
'''
    )
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    print(out)  # the failure as a user sees it (pytest -s shows it)
    assert "reloadsafe: Bad does not keep its addresses across reloads" in out
    assert "col_scale" in out
    assert "aten::div" in out  # the traced read that moved
    # The table, not a Python traceback into reloadsafe.
    assert "reloadsafe/check.py" not in out and "reloadsafe/layer_subject.py" not in out


def test_a_usage_error_under_pytest_is_its_message_alone(pytester, monkeypatch):
    site = str(pathlib.Path(reloadsafe.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(
        test_usage='''
import torch
import reloadsafe

def test_not_a_module():
    reloadsafe.check_reload(42, torch.randn(2))
'''
    )
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "test_not_a_module" in line and "___" in line)
    end = next(i for i, line in enumerate(lines) if "short test summary" in line)
    failure = [line for line in lines[start + 1:end] if line.strip()]
    assert len(failure) <= 3, out
    assert "ReloadCheckError: check_reload: `layer` must be a torch.nn.Module" in out
    assert "Checks that reloading weights" not in out  # no docstring, no internal frame
