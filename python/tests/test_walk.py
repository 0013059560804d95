"""named_tensors: every tensor reachable from a module, by the name you would
use to reach it in Python."""
import collections
import functools
import types
from typing import Any

import pytest
import torch

import reloadsafe


def _names(module, **kw):
    return {nt.name: nt for nt in reloadsafe.named_tensors(module, **kw)}


def _reach(root, name):
    """Evaluates a reported name against the module: the name must lead to the
    very tensor reported (a closure cell's name leads to the cell)."""
    value = eval("root." + name, {"root": root})
    return value.cell_contents if isinstance(value, types.CellType) else value


class Kernel:
    """A kernel object held by a layer (plain object)."""

    def __init__(self, workspace):
        self.workspace = workspace
        self.meta = {"sort": torch.arange(4)}

    def run(self, x):
        return x + self.workspace.sum()


class Slotted:
    __slots__ = ("table", "unset")

    def __init__(self, table):
        self.table = table


Pair = collections.namedtuple("Pair", ["scale", "zero"])


def _layer():
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(4, 4))
    layer.register_buffer("perm", torch.arange(4))
    layer.scale = torch.ones(4)
    layer.cache = [torch.zeros(1), (torch.zeros(2), "not a tensor")]
    layer.tables = {"perm": torch.zeros(3), 7: torch.zeros(5)}
    layer.kernel = functools.partial(torch.mul, torch.full((2,), 2.0), scale=torch.ones(2))
    captured = torch.full((3,), 3.0)
    layer.fn = lambda x: x * captured
    layer.cfg = Kernel(torch.zeros(8))
    layer.bound = layer.cfg.run
    layer.slotted = Slotted(torch.zeros(6))
    layer.pair = Pair(torch.ones(1), torch.zeros(1))

    def with_default(x, bias=torch.ones(2)):  # noqa: B008 - the walk must find a tensor default
        return x + bias

    layer.defaulted = with_default
    inner = torch.nn.Linear(2, 2)
    inner.extra = torch.zeros(9)
    layer.inner = inner
    return layer


EXPECTED = {
    "weight": "parameter",
    "perm": "buffer",
    "inner.weight": "parameter",
    "inner.bias": "parameter",
    "scale": "attribute",
    "cache[0]": "container",
    "cache[1][0]": "container",
    "tables['perm']": "container",
    "tables[7]": "container",
    "kernel.args[0]": "partial",
    "kernel.keywords['scale']": "partial",
    "fn.__closure__[0]": "closure",
    "cfg.workspace": "object",
    "cfg.meta['sort']": "container",
    "slotted.table": "object",
    "pair.scale": "container",
    "pair.zero": "container",
    "defaulted.__defaults__[0]": "closure",
    "inner.extra": "attribute",
}


def test_every_holder_is_found_with_its_kind_and_a_name_that_reaches_it():
    layer = _layer()
    found = _names(layer)
    assert {n: found[n].kind for n in found} == EXPECTED
    for name, nt in found.items():
        assert _reach(layer, name) is nt.tensor, name


def test_declared_is_parameters_and_buffers():
    found = _names(_layer())
    assert {n for n, nt in found.items() if nt.registered} == {"weight", "perm", "inner.weight", "inner.bias"}
    with pytest.deprecated_call(match="registered"):
        assert found["weight"].declared  # the old word, kept for a while


def test_a_tensor_held_twice_is_reported_once_under_its_declared_name():
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(2))
    layer.kernel = functools.partial(torch.add, layer.weight)
    layer.alias = layer.weight
    found = _names(layer)
    assert list(found) == ["weight"]


def test_closure_of_a_bound_method_and_its_object():
    class Op:
        def __init__(self):
            self.w = torch.zeros(2)

        def __call__(self, x):
            return x

    def make():
        t = torch.ones(3)

        def f(x):
            return x + t

        return f

    layer = torch.nn.Module()
    op = Op()
    layer.call = op.__call__
    layer.f = make()
    found = _names(layer)
    assert set(found) == {"call.__self__.w", "f.__closure__[0]"}
    assert found["call.__self__.w"].tensor is op.w


def test_cycles_terminate():
    layer = torch.nn.Module()
    a = {"t": torch.zeros(1)}
    b = [a]
    a["b"] = b
    layer.a = a
    obj: Any = Kernel(torch.zeros(1))  # given an attribute Kernel does not declare
    obj.me = obj
    layer.obj = obj
    layer.selfref = layer  # a module attribute pointing back at the module
    found = _names(layer)
    assert {"a['t']", "obj.workspace", "obj.meta['sort']"} <= set(found)


def test_depth_limit():
    layer = torch.nn.Module()
    layer.deep = [[[[torch.zeros(1)]]]]
    assert "deep[0][0][0][0]" in _names(layer)
    assert _names(layer, max_depth=3) == {}
    assert "deep[0][0][0][0]" in _names(layer, max_depth=4)


def test_ops_modules_and_classes_are_not_walked():
    import math

    layer = torch.nn.Module()
    layer.op = torch.ops.aten.mul.Tensor
    layer.packet = torch.ops.aten.add
    layer.mod = math
    layer.cls = Kernel
    layer.fn = torch.nn.functional.linear
    assert _names(layer) == {}


def test_not_a_module_is_a_type_error():
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got dict"):
        reloadsafe.named_tensors({"weight": torch.zeros(1)})


def test_tensors_are_the_modules_own_objects_not_copies():
    layer = _layer()
    found = _names(layer)
    assert found["weight"].tensor is layer.weight
    assert found["kernel.keywords['scale']"].tensor is layer.kernel.keywords["scale"]


def test_attributes_set_on_a_tensor_are_walked():
    class QuantState:
        def __init__(self):
            self.absmax = torch.ones(4)
            self.nested = types.SimpleNamespace(code=torch.zeros(16))

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(4, 4), requires_grad=False)
    layer.weight.quant_state = QuantState()
    layer.weight.weight_loader = functools.partial(lambda p, t, s: None, s=torch.full((2,), 7.0))
    layer.weight.alias = layer.weight  # a tensor reached twice keeps its declared name
    found = _names(layer)
    assert set(found) == {
        "weight",
        "weight.quant_state.absmax",
        "weight.quant_state.nested.code",
        "weight.weight_loader.keywords['s']",
    }
    for name, nt in found.items():
        assert _reach(layer, name) is nt.tensor, name
    assert found["weight.quant_state.absmax"].kind == "object" and found["weight"].kind == "parameter"


@pytest.mark.parametrize(
    "layout, parts",
    [
        ("coo", ("_indices", "_values")),
        ("csr", ("crow_indices", "col_indices", "values")),
        ("csc", ("ccol_indices", "row_indices", "values")),
        ("bsr", ("crow_indices", "col_indices", "values")),
        ("bsc", ("ccol_indices", "row_indices", "values")),
    ],
)
@pytest.mark.filterwarnings("ignore:Sparse .* support is in beta")
def test_a_sparse_tensor_is_named_by_its_parts(layout, parts):
    dense = torch.eye(4) * torch.arange(1.0, 5.0)
    sparse = {
        "coo": lambda: dense.to_sparse(),
        "csr": lambda: dense.to_sparse_csr(),
        "csc": lambda: dense.to_sparse_csc(),
        "bsr": lambda: dense.to_sparse_bsr((2, 2)),
        "bsc": lambda: dense.to_sparse_bsc((2, 2)),
    }[layout]()
    layer = torch.nn.Module()
    layer.register_buffer("mask", sparse, persistent=False)
    layer.kernel = types.SimpleNamespace(w=sparse)
    found = _names(layer)
    assert set(found) == {f"mask.{p}" for p in parts}, sorted(found)  # reached twice: the declared name
    for p in parts:
        part = found[f"mask.{p}"]
        assert part.kind == "buffer" and part.tensor.layout == torch.strided
        assert part.tensor.data_ptr() == getattr(sparse, p)().data_ptr()  # the part itself, not a copy


def test_a_method_bound_over_a_partial_is_walked():
    layer = torch.nn.Module()
    t = torch.zeros(3)
    layer.fn = types.MethodType(functools.partial(lambda self, x, w: x + w, w=t), layer)
    found = _names(layer)
    assert list(found) == ["fn.__func__.keywords['w']"]
    assert _reach(layer, "fn.__func__.keywords['w']") is t


def _packed(n=4):
    # A TorchBind object (LinearPackedParamsBase) from fbgemm's fp16 packing,
    # which needs no quantized tensor (deprecated from torch 2.15).
    return torch.ops.quantized.linear_prepack_fp16(torch.randn(n, 8), None)


def test_named_objects_finds_torchbind_objects_where_tensors_are_found():
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    layer.packed = _packed()
    layer.kernels = [_packed(), {"k": _packed()}]
    layer.fn = functools.partial(torch.ops.quantized.linear_dynamic_fp16, W_prepack=_packed())
    layer.twice = layer.packed
    sub = torch.nn.Module()
    sub.inner = _packed()
    layer.sub = sub
    objects = reloadsafe.named_objects(layer)
    names = [o.name for o in objects]
    assert names == ["packed", "kernels[0]", "kernels[1]['k']", "fn.keywords['W_prepack']", "sub.inner"]
    for o in objects:
        assert isinstance(o.obj, torch.ScriptObject) and _reach(layer, o.name) is o.obj, o.name
    assert {o.kind for o in objects} == {"attribute", "container", "partial"}
    # Objects are not tensors: named_tensors leaves them out.
    assert list(_names(layer)) == ["weight"]


def test_named_objects_of_not_a_module_is_a_type_error():
    with pytest.raises(TypeError, match="named_objects: expected a torch.nn.Module, got list"):
        reloadsafe.named_objects([_packed()])


def test_shared_object_names_are_what_two_built_layers_both_reach():
    config = types.SimpleNamespace(eps=1e-6, seconds=0.0)
    cached = torch.nn.Linear(2, 2)  # a module-level cache of modules, as vLLM's get_rope keeps

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = config
            self.rope = cached
            self.own = types.SimpleNamespace(scale=1.0)

    a, b = Layer(), Layer()
    shared = reloadsafe.walk.shared_object_names(a, b)
    assert set(shared) == {"config", "rope"}, shared
    assert reloadsafe.walk.shared_object_names(a, a) == []
