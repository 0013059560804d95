"""check_reload(compare_state=True): after each reload every tensor and host
number the layer reaches is compared with a cold load's, by name; a stale
one is named, a non-idempotent one named as such, and correct layers pass.
compare_forward_state=True does the same after the forward, against a cold
load that ran one forward."""
from typing import Any

import pytest
import torch

import reloadsafe
from reloadsafe import check_reload
from reloadsafe.state import state_differences

import sample_layers as sl


class StaleCopy(torch.nn.Module):
    """A derived copy made once and never refreshed: no address moves."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.kernel: Any = None

    def process_weights_after_loading(self):
        if self.kernel is None:
            self.kernel = type("Kernel", (), {})()
            self.kernel.w_scaled = self.weight * 2.0

    def forward(self, x):
        return torch.mm(x, self.kernel.w_scaled.t())


class HalvesItsScale(torch.nn.Module):
    """Post-processing transforms what the previous pass left."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.register_buffer("k_scale", torch.ones(1))

    def process_weights_after_loading(self):
        self.k_scale.mul_(0.5)

    def forward(self, x):
        return torch.mm(x, self.weight.t()) * self.k_scale


class StaleHostNumber(torch.nn.Module):
    """A scale read as a Python float, set at the first load only."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.k_scale = sl._param(1)
        self._k_scale_float = None

    def process_weights_after_loading(self):
        if self._k_scale_float is None:
            self._k_scale_float = float(self.k_scale)

    def forward(self, x):
        return torch.mm(x, self.weight.t()) * self._k_scale_float


class SparseMask(torch.nn.Module):
    """A sparse buffer (a pruning mask) the forward reads; correct."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        mask = (torch.arange(8 * 16).reshape(8, 16) % 3 == 0).float()
        self.register_buffer("mask", mask.to_sparse(), persistent=False)

    def forward(self, x):
        return torch.mm(x, (self.weight * self.mask.to_dense()).t())


class StaleSparseCopy(SparseMask):
    """A sparse copy of the masked weight made at the first load only."""

    def __init__(self):
        super().__init__()
        self.kernel: Any = None

    def process_weights_after_loading(self):
        if self.kernel is None:
            self.kernel = type("Kernel", (), {})()
            self.kernel.w_sparse = (self.weight * self.mask.to_dense()).to_sparse()

    def forward(self, x):
        return torch.mm(x, self.kernel.w_sparse.to_dense().t())


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))


def _named(report, name):
    return [v for m in report.modes.values() for v in m["violations"] if v["tensor"] == name]


def test_a_stale_derived_tensor_is_named_only_with_compare_state():
    plain = check_reload(StaleCopy, X, reloads=3)
    assert not plain.ok and "kernel.w_scaled" not in plain.flagged, plain.table()
    report = check_reload(StaleCopy, X, reloads=3, compare_state=True)
    found = _named(report, "kernel.w_scaled")
    assert {v["reload"] for v in found} == {1} and len(found) == 2, report.table()  # once per mode
    assert all(v["what"] == "differs from a cold load of the same checkpoint" for v in found)
    assert found[0]["before"] == "cold load float32[8, 16]" and found[0]["after"].startswith("max |diff| ")


def test_post_processing_that_is_not_idempotent_is_named_as_such():
    report = check_reload(HalvesItsScale, X, reloads=3, compare_state=True)
    found = _named(report, "k_scale")
    assert found and all(v["what"].startswith("not idempotent") for v in found), report.table()
    assert "k_scale" in report.flagged


def test_a_stale_host_number_is_named_by_its_attribute():
    plain = check_reload(StaleHostNumber, X, reloads=3)
    assert "_k_scale_float" not in plain.flagged
    report = check_reload(StaleHostNumber, X, reloads=3, compare_state=True)
    found = _named(report, "_k_scale_float")
    assert found and found[0]["before"].startswith("cold load "), report.table()
    assert float(found[0]["after"]) != float(found[0]["before"].split()[-1])


@pytest.mark.parametrize("cls", sl.SAMPLES, ids=lambda c: c.__name__)
def test_correct_layers_pass_with_compare_state(cls):
    x = torch.randn(*cls.input_shape, generator=torch.Generator().manual_seed(0))
    report = check_reload(cls, x, reloads=3, modes=getattr(cls, "modes", reloadsafe.MODES), compare_state=True)
    assert report.ok, report.table()


def test_sparse_tensors_are_compared_by_the_values_they_stand_for():
    for kw in ({"compare_state": True}, {"compare_forward_state": True}, {"sleep": 2}):
        report = check_reload(SparseMask, X, reloads=2, **kw)
        assert report.ok, (kw, report.table())
    report = check_reload(StaleSparseCopy, X, reloads=2, compare_state=True)
    found = _named(report, "kernel.w_sparse._values")
    assert found and all(v["what"] == "differs from a cold load of the same checkpoint" for v in found), report.table()


def test_only_names_both_layers_have_are_compared_and_undeclared_are_skipped():
    live, cold = torch.nn.Module(), torch.nn.Module()
    live.w = torch.ones(3)
    cold.w = torch.zeros(3)
    live.workspace = torch.ones(2)  # made by a forward: the cold load has none
    live.n, cold.n = 1.5, 2.5
    live.flag, cold.flag = True, False  # flags are not host numbers
    assert [(d.name, d.after) for d in state_differences(live, cold)] == [
        ("w", "max |diff| 1"), ("n", "1.5")]
    assert state_differences(live, cold, skip=["w", "n"]) == []


def test_nan_where_a_cold_load_has_numbers_is_said():
    live, cold = torch.nn.Module(), torch.nn.Module()
    live.w = torch.tensor([1.0, float("nan")])
    cold.w = torch.tensor([1.0, 2.0])
    assert state_differences(live, cold)[0].after == "1 NaN where a cold load has numbers"


class EagerHostNumber(StaleHostNumber):
    """The float refreshed by every post-processing: right in eager mode."""

    def process_weights_after_loading(self):
        self._k_scale_float = float(self.k_scale)


class ConstantHostNumber(StaleHostNumber):
    def process_weights_after_loading(self):
        self._k_scale_float = 0.25


def test_a_host_number_a_reload_changes_is_named_with_host_numbers():
    plain = check_reload(EagerHostNumber, X, reloads=3, compare_state=True)
    assert "_k_scale_float" not in plain.flagged  # it equals a cold load's
    report = check_reload(EagerHostNumber, X, reloads=3, host_numbers=True)
    found = _named(report, "_k_scale_float")
    assert len(found) == 2 and all(v["reload"] == 1 for v in found), report.table()
    assert found[0]["what"].startswith("host number changed since the capture")
    assert float(found[0]["before"]) != float(found[0]["after"])


def test_host_numbers_that_keep_their_value_pass():
    assert check_reload(ConstantHostNumber, X, reloads=3, host_numbers=True).ok


class TilesFromTheFirstForward(torch.nn.Module):
    """A kernel's tile schedule made by the first forward and only read by
    later ones, on a plain object: a sleep discards it and nothing rebuilds it."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.kernel: Any = type("Kernel", (), {"tiles": None})()

    def forward(self, x):
        if self.kernel.tiles is None:
            self.kernel.tiles = torch.arange(4.0, device=x.device)
        return torch.mm(x, self.weight.t()) + self.kernel.tiles.sum()


def test_state_the_first_forward_made_is_named_only_with_compare_forward_state():
    after_sleep = check_reload(TilesFromTheFirstForward, X, reloads=3, sleep=2, compare_state=True)
    assert not after_sleep.ok and "kernel.tiles" not in after_sleep.flagged, after_sleep.table()
    report = check_reload(TilesFromTheFirstForward, X, reloads=3, sleep=2, compare_forward_state=True)
    found = _named(report, "kernel.tiles")
    assert len(found) == 2 and all(v["reload"] == 1 for v in found), report.table()
    assert found[0]["what"].startswith("after the forward, differs from a cold load")
    assert check_reload(TilesFromTheFirstForward, X, reloads=3, compare_forward_state=True).ok


@pytest.mark.parametrize("cls", sl.SAMPLES, ids=lambda c: c.__name__)
def test_correct_layers_pass_with_compare_forward_state(cls):
    x = torch.randn(*cls.input_shape, generator=torch.Generator().manual_seed(0))
    modes = getattr(cls, "modes", reloadsafe.MODES)
    report = check_reload(cls, x, reloads=3, modes=modes, compare_state=True, compare_forward_state=True)
    assert report.ok, report.table()
