"""README's pytest example ("Check a layer from pytest"), run as a user would paste it:
the FP8-style layer and its test pass, and the obvious wrong
post-processing fails with the table."""
import os
import pathlib
import re

import reloadsafe

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _files():
    """The README's Python blocks that start with a file name comment."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S):
        first = block.splitlines()[0]
        m = re.fullmatch(r"# (\w+\.py)", first.strip())
        if m:
            files[m.group(1)] = block
    return files


def test_readme_example_passes_and_its_wrong_variant_fails(pytester, monkeypatch):
    files = _files()
    assert set(files) == {"fp8_linear.py", "test_fp8_linear.py"}
    for name, text in files.items():
        pytester.path.joinpath(name).write_text(text)
    pytester.makepyfile(
        test_wrong='''
import torch
from fp8_linear import Fp8Linear

class Rebinding(Fp8Linear):
    def process_weights_after_loading(self):
        w = self.weight.float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 448.0
        self.weight = torch.nn.Parameter((w / scale).to(torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale = scale

def test_rebinding(reload_check):
    reload_check(Rebinding, torch.randn(8, 64), reloads=3)
'''
    )
    site = str(pathlib.Path(reloadsafe.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "test_fp8_linear.py ." in out or "1 passed" in out
    assert "Rebinding [normal] reload 1: weight address" in out
    assert "weight_scale address" in out
