"""load_checkpoint: a weight_loader that raises is reported with the name of
the parameter it was loading and the layouts on both sides."""
import pytest
import torch

import reloadsafe
from reloadsafe import ReloadCheckError


def _refusing_loader(param, loaded):
    raise ValueError("shard_dim=0 is not a valid data dimension for a 3D tensor")


def test_a_raising_weight_loader_is_named_with_both_layouts():
    layer = torch.nn.Module()
    layer.w13 = torch.nn.Parameter(torch.zeros(2, 4, 8), requires_grad=False)
    layer.w13.weight_loader = _refusing_loader
    with pytest.raises(ReloadCheckError) as e:
        reloadsafe.load_checkpoint(layer, {"w13": torch.ones(2, 4, 8)})
    msg = str(e.value)
    assert "the weight_loader of 'w13' raised ValueError: shard_dim=0" in msg
    assert "float32[2, 4, 8]" in msg
    assert isinstance(e.value.__cause__, ValueError)


def test_a_loader_that_reports_a_check_error_is_not_rewrapped():
    def loader(param, loaded):
        raise ReloadCheckError("already says what to fix")

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    layer.weight.weight_loader = loader
    with pytest.raises(ReloadCheckError, match="^already says what to fix$"):
        reloadsafe.load_checkpoint(layer, {"weight": torch.ones(3)})
