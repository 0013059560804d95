"""check_reload(recreate_parameters=True): before each reload's load the
parameters hold a sentinel, as layerwise reload's re-created (uninitialised)
parameters do; padding that only construction zeroed shows."""
import pytest
import torch

import reloadsafe
from reloadsafe import check_reload

import sample_layers as sl

X = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))


def _real_columns(p, loaded):
    p.data[:, :12].copy_(loaded[:, :12])


class PadFromConstruction(torch.nn.Module):
    """[8, 16] storage for a [8, 12] weight; the loader writes the real
    columns and the forward multiplies the pad by zeros: NaN * 0 is NaN."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(8, 16), requires_grad=False)
        self.weight.weight_loader = _real_columns

    def forward(self, x):
        return torch.mm(torch.nn.functional.pad(x, (0, 4)), self.weight.t())


class PadZeroedEveryLoad(PadFromConstruction):
    def process_weights_after_loading(self):
        self.weight[:, 12:].zero_()


def test_padding_only_construction_zeroed_shows_with_recreated_parameters():
    assert check_reload(PadFromConstruction, X, reloads=3).ok
    report = check_reload(PadFromConstruction, X, reloads=3, recreate_parameters=True, compare_state=True)
    assert {"forward", "replay", "weight"} <= set(report.flagged), report.table()
    found = [v for v in report.modes["normal"]["violations"] if v["tensor"] == "weight"]
    assert found[0]["after"] == "32 NaN where a cold load has numbers", found


def test_padding_zeroed_on_every_load_passes():
    assert check_reload(PadZeroedEveryLoad, X, reloads=3, recreate_parameters=True, compare_state=True).ok


@pytest.mark.parametrize("cls", sl.SAMPLES, ids=lambda c: c.__name__)
def test_correct_layers_pass_with_recreated_parameters(cls):
    x = torch.randn(*cls.input_shape, generator=torch.Generator().manual_seed(0))
    modes = getattr(cls, "modes", reloadsafe.MODES)
    report = check_reload(cls, x, reloads=3, modes=modes, recreate_parameters=True, compare_state=True)
    assert report.ok, report.table()
