"""check_reload(device_clean=True) on the layers of real_layers.py: every
layer that would run on a GPU passes the probe, and a tensor the layer makes
without a device, that a GPU would not take beside its weights, is named.

What each layer does on a GPU was seen on an H200 (torch 2.11, torchao
0.18): TorchaoInt8InPlace loads, post-processes and runs forward with every
tensor on the GPU (its helper builds an nn.Linear without a device, on the
CPU there, and sets its weight's .data to the CUDA weight: set_data moves
between CPU and CUDA tensors); NestedSubclassInPlace as it was, with its
inner per-row factor made without a device, raised "Expected all tensors to
be on the same device" in its first forward, and runs with the factor made
on the weight's device, as real_layers.py now makes it."""
import warnings

import pytest
import torch

from reloadsafe import ReloadCheckError, check_reload

import real_layers as rl


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    # torch.ao's quantize_dynamic and torchao warn about their own futures on
    # every call; nothing here depends on those warnings.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.ao")
        yield


def _probe(cls, trace=False):
    x = torch.randn(*rl.INPUT_SHAPE, generator=torch.Generator().manual_seed(0))
    return check_reload(cls, x, reloads=1, modes=("normal",), trace=trace, device_clean=True)


@pytest.mark.parametrize("cls", rl.IN_PLACE, ids=lambda c: c.__name__)
def test_every_in_place_layer_is_device_clean_and_passes(cls):
    rl.need(cls)
    report = _probe(cls)
    assert report.ok, report.table()


# QuantizeDynamicRebuilt is left out: torch.ao's quantized Linear prepacks a
# placeholder weight it makes without a device (quantized::linear_prepack,
# no meta kernel), which the probe cannot run; see the test below.
_REBUILT_PROBED = [c for c in rl.REBUILT if c is not rl.QuantizeDynamicRebuilt]


@pytest.mark.parametrize("cls", _REBUILT_PROBED, ids=lambda c: c.__name__)
def test_the_rebuilt_layers_pass_the_probe_and_are_still_flagged_for_what_moved(cls):
    rl.need(cls)
    report = _probe(cls, trace=True)  # the probe raises before the protocol runs if it names a tensor
    assert not report.ok
    assert any(f.startswith(cls.expected) for f in report.flagged), report.table()


def test_a_layer_the_probe_cannot_run_is_said_so_not_called_unclean():
    with pytest.raises(ReloadCheckError, match=r"device-clean probe cannot follow the load or post-processing"):
        _probe(rl.QuantizeDynamicRebuilt)


def _scaled_row_without_a_device(weight, nested):
    """real_layers._scaled for a nested weight as it was: the per-row
    factor of the inner ScaledWeight made without a device."""
    wt = weight.detach().t()
    col = wt.abs().amax(dim=0).clamp_min(1e-8) / 127.0
    q = (wt / col).round().clamp(-127, 127).to(torch.int8).contiguous()
    row = torch.full((wt.shape[0], 1), 0.5)  # no device: a CPU [64, 1] tensor on a GPU
    return rl.ScaledWeight(rl.ScaledWeight(q, row), col * 2.0)


class _NestedRowWithoutADevice(rl.NestedSubclassInPlace):
    def process_weights_after_loading(self):
        new = _scaled_row_without_a_device(self.weight, self.nested)
        if not hasattr(self, "qweight"):
            self.qweight = new
        else:
            rl.refill_in_place(self.qweight, new)


def test_a_nested_factor_made_without_a_device_is_named():
    x = torch.randn(*rl.INPUT_SHAPE, generator=torch.Generator().manual_seed(0))
    assert check_reload(_NestedRowWithoutADevice, x, reloads=1, modes=("normal",), trace=False).ok  # fine on a CPU
    with pytest.raises(
        ReloadCheckError,
        match=r"_NestedRowWithoutADevice is not device-clean: after the load or post-processing .*"
        r"'qweight\.qdata\.scale' is on meta \(float32\[64, 1\]\)",
    ):
        _probe(_NestedRowWithoutADevice)
