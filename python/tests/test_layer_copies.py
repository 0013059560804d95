"""LayerAsBuilt (layer_copies.py): a copy of a layer as built holds every
buffer and attribute as built, new memory for each parameter (every byte
0xFF until a load writes it), and is a layer of its own; the template holds
no parameter's bytes; layers it cannot copy faithfully get no template
(Note [Layers made aside by copying] in conformance/harness/layer_life.h)."""
from __future__ import annotations

import threading

import pytest
import torch

from reloadsafe.layer_copies import LayerAsBuilt, reloads_by_identity


class _LoaderParameter(torch.nn.Parameter):
    """A parameter that takes its loader as a constructor argument, as
    vLLM's do (deepcopy cannot make one)."""

    def __new__(cls, data: torch.Tensor, *, weight_loader):
        return super().__new__(cls, data, requires_grad=False)

    def __init__(self, data: torch.Tensor, *, weight_loader):
        self.weight_loader = weight_loader


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 4))
        self.bias = _LoaderParameter(torch.randn(8), weight_loader=self.load_bias)
        self.tied = self.weight  # the same parameter under a second name
        self.register_buffer("inv_freq", torch.arange(4.0))  # made in __init__, no load writes it
        self.deferred = torch.nn.Parameter(torch.empty(3, device="meta"))  # materialised by a load
        self.settings = {"eps": 1e-6}

    def load_bias(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + self.bias


def test_a_copy_is_the_layer_as_built_with_new_parameter_memory():
    built = Layer()
    before = {n: t.clone() for n, t in built.named_parameters() if not t.is_meta}
    template = LayerAsBuilt.of(built)
    assert template is not None
    copy = template.copy()
    # Every parameter: its class, layout and device, new memory, every byte 0xFF.
    for name, p in built.named_parameters():
        c = copy.get_parameter(name)
        assert type(c) is type(p) and c.shape == p.shape and c.dtype == p.dtype and c.device == p.device, name
        if p.is_meta:
            assert c.is_meta, name  # still for a load to materialise
            continue
        assert c.untyped_storage().data_ptr() != p.untyped_storage().data_ptr(), name
        assert bool((c.detach().view(torch.uint8) == 0xFF).all()), name
    # The same parameter under two names is one parameter in the copy too.
    assert copy.tied is copy.weight
    # A bound loader is the copy's own.
    assert copy.bias.weight_loader.__self__ is copy
    # Buffers and attributes as built; the layer it was made from untouched.
    assert torch.equal(copy.inv_freq, built.inv_freq)
    assert copy.inv_freq.untyped_storage().data_ptr() != built.inv_freq.untyped_storage().data_ptr()
    assert copy.settings == built.settings and copy.settings is not built.settings
    for name, t in before.items():
        assert torch.equal(built.get_parameter(name), t), name
    # Each copy is a layer of its own.
    other = template.copy()
    assert other.weight.untyped_storage().data_ptr() != copy.weight.untyped_storage().data_ptr()


def test_a_copy_on_a_checkpoint_is_made_of_its_tensors_where_they_fit():
    # Note [A copy on its checkpoint]: a parameter whose checkpoint tensor
    # (under any of its names) has its very layout is that tensor; any other
    # gets memory of its own.
    built = Layer()
    template = LayerAsBuilt.of(built)
    assert template is not None
    on = {
        "tied": torch.randn(8, 4),  # the weight's second name
        "bias": torch.randn(8, dtype=torch.float64),  # another dtype
    }
    copy = template.copy(on)
    assert copy.weight.untyped_storage().data_ptr() == on["tied"].untyped_storage().data_ptr()
    assert copy.tied is copy.weight and isinstance(copy.weight, torch.nn.Parameter)
    assert copy.bias.untyped_storage().data_ptr() != on["bias"].untyped_storage().data_ptr()
    assert copy.bias.dtype == torch.float32 and bool((copy.bias.detach().view(torch.uint8) == 0xFF).all())
    # A transposed tensor is not the parameter's layout.
    t = template.copy({"weight": torch.randn(4, 8).t()})
    assert bool((t.weight.detach().view(torch.uint8) == 0xFF).all())


def test_the_template_holds_no_parameters_bytes():
    built = Layer()
    template = LayerAsBuilt.of(built)
    assert template is not None
    held = [p for p in template._template.parameters()]
    assert held and all(p.is_meta for p in held)


def test_a_copy_loads_and_runs_as_a_built_layer():
    torch.manual_seed(0)
    built = Layer()
    template = LayerAsBuilt.of(built)
    assert template is not None
    copy = template.copy()
    ckpt = {"weight": torch.randn(8, 4), "bias": torch.randn(8)}
    with torch.no_grad():
        for layer in (built, copy):
            layer.weight.copy_(ckpt["weight"])
            layer.bias.weight_loader(layer.bias, ckpt["bias"])
    x = torch.randn(2, 4)
    assert torch.equal(built(x), copy(x))


class _MostlyBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("table", torch.randn(1024))


def _compiled_in_place() -> torch.nn.Module:
    layer = Layer()
    layer.compile(backend="eager")
    return layer


def _holding_one_that_reloads_by_identity() -> torch.nn.Module:
    outer = torch.nn.Sequential(Layer())
    reloads_by_identity(outer[0])
    return outer


@pytest.mark.parametrize(
    "make,why",
    [
        (_MostlyBuffers, "its buffers hold most of its bytes: the template would keep them"),
        (lambda: torch.compile(Layer(), backend="eager"), "compiled: a copy would run eagerly"),
        (_compiled_in_place, "compiled in place: a copy would run eagerly"),
        (lambda: reloads_by_identity(Layer()), "it reloads by its identity: a copy would not reload as it does"),
        (_holding_one_that_reloads_by_identity, "a module of it reloads by its identity"),
    ],
    ids=["mostly-buffers", "torch.compile", "module.compile", "reloads-by-identity", "holds-one-by-identity"],
)
def test_no_template_for_a_layer_a_copy_would_not_stand_for(make, why):
    assert LayerAsBuilt.of(make()) is None, why


def test_no_template_for_a_layer_that_cannot_be_copied():
    layer = Layer()
    layer.lock = threading.Lock()  # deepcopy refuses it
    assert LayerAsBuilt.of(layer) is None
