"""check_reload(reload_peak_budget_bytes=N): what a reload holds at its peak,
above what was live before it. A reload that stages a second copy of the
weight before the first is freed needs the weight's bytes again."""
from typing import Any

import pytest
import torch

from reloadsafe import ReloadCheckError, check_reload

X = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
WEIGHT_BYTES = 64 * 64 * 4


class StagesACopy(torch.nn.Module):
    """Post-processing builds the new weight in a staging tensor, then
    copies it in place: for a moment the weight is held twice."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(64, 64), requires_grad=False)

    def process_weights_after_loading(self):
        staging: Any = self.weight * 0.5
        self.weight.copy_(staging)

    def forward(self, x):
        return torch.mm(x, self.weight.t())


class InPlace(StagesACopy):
    def process_weights_after_loading(self):
        self.weight.mul_(0.5)


def _memory(report):
    return [v for m in report.modes.values() for v in m["violations"] if v["tensor"] == "memory"]


def test_a_staged_copy_is_over_a_budget_smaller_than_the_weight():
    assert check_reload(StagesACopy, X, reloads=3).ok
    report = check_reload(StagesACopy, X, reloads=3, reload_peak_budget_bytes=WEIGHT_BYTES // 2)
    found = _memory(report)
    assert [v["reload"] for v in found] == [1, 1], report.table()
    extra = int(found[0]["what"].split(" is ")[1].split()[0])
    assert WEIGHT_BYTES <= extra <= WEIGHT_BYTES + 1024, found[0]  # the staged copy, and a scalar or two
    assert check_reload(StagesACopy, X, reloads=3, reload_peak_budget_bytes=WEIGHT_BYTES + 1024).ok


def test_an_in_place_reload_stays_within_a_small_budget():
    report = check_reload(InPlace, X, reloads=3, reload_peak_budget_bytes=WEIGHT_BYTES // 2)
    assert report.ok, report.table()


def test_the_budget_is_a_whole_number():
    with pytest.raises(ReloadCheckError, match="reload_peak_budget_bytes must be an int"):
        check_reload(InPlace, X, reloads=1, reload_peak_budget_bytes="1MB")
