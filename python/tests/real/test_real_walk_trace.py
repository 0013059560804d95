"""named_tensors, named_objects and the read trace on real subclass weights
and packed objects: inner tensors by their flattened names, never the
wrapper; TorchBind objects by name, class and identity; nothing touches a
wrapper's storage."""
import types
import warnings

import pytest
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import reloadsafe
from reloadsafe import _C

import real_layers as rl


def _reach(root, name):
    value = eval("root." + name, {"root": root})
    return value.cell_contents if isinstance(value, types.CellType) else value


def _loaded(cls, seed=1):
    layer = cls()
    ckpt = reloadsafe.draw_checkpoint(reloadsafe.loading.checkpoint_layouts(layer), seed)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reloadsafe.load_checkpoint(layer, ckpt)
        layer.process_weights_after_loading()
    return layer


def _assert_no_wrapper_and_names_reach(layer):
    found = reloadsafe.named_tensors(layer)
    for nt in found:
        assert not is_traceable_wrapper_subclass(nt.tensor), nt.name
        assert _reach(layer, nt.name) is nt.tensor, nt.name
    return {nt.name: nt for nt in found}


def test_torchao_int8_weight_is_walked_into_its_inner_tensors():
    pytest.importorskip("torchao")
    layer = _loaded(rl.TorchaoInt8InPlace)
    found = _assert_no_wrapper_and_names_reach(layer)
    assert {"qweight.qdata", "qweight.scale", "qweight.zero_point"} <= set(found)
    assert "qweight" not in found
    assert found["qweight.qdata"].tensor.dtype == torch.int8
    assert found["qweight.qdata"].kind == "parameter"  # the wrapper's kind


def test_plain_and_nested_dispatch_subclasses_are_walked_to_their_leaves():
    found = _assert_no_wrapper_and_names_reach(_loaded(rl.DispatchSubclassInPlace))
    assert {"qweight.qdata", "qweight.scale"} <= set(found) and "qweight" not in found
    found = _assert_no_wrapper_and_names_reach(_loaded(rl.NestedSubclassInPlace))
    assert {"qweight.qdata.qdata", "qweight.qdata.scale", "qweight.scale"} <= set(found)
    assert "qweight" not in found and "qweight.qdata" not in found


def test_bitsandbytes_quant_state_tensors_are_found():
    pytest.importorskip("bitsandbytes")
    found = _assert_no_wrapper_and_names_reach(_loaded(rl.BnbLinear4bitInPlace))
    assert {"lin.weight", "lin.quant_state.absmax", "lin.quant_state.code"} <= set(found)


@pytest.mark.parametrize("cls", [rl.DispatchSubclassInPlace, rl.NestedSubclassInPlace], ids=lambda c: c.__name__)
def test_trace_names_the_inner_reads_and_never_touches_the_wrapper(cls):
    layer = _loaded(cls)
    with reloadsafe.trace() as t:
        layer(torch.randn(*rl.INPUT_SHAPE))
    wrapper_reads = [r for r in t.reads() if r.subclass]
    assert wrapper_reads, "the mm's wrapper argument is recorded as a subclass read"
    for r in wrapper_reads:
        assert r.storage == 0 and r.storage_data_ptr == 0 and r.data_ptr == 0, r
    names = {n for _, n in t.named_reads(layer) if n is not None}
    leaves = {"qweight.qdata", "qweight.scale"} if cls is rl.DispatchSubclassInPlace else {
        "qweight.qdata.qdata", "qweight.qdata.scale", "qweight.scale"}
    assert leaves <= names, (names, t.format(layer))
    table = t.format(layer)  # raised "invalid python storage" before
    assert "qweight.scale" in table and "subclass" in table
    wrapper_depth = min(r.depth for r in wrapper_reads)
    inner = [r for r, n in t.named_reads(layer) if n in leaves]
    assert all(r.depth > wrapper_depth for r in inner), "inner reads sit below the op on the wrapper"


@pytest.mark.parametrize("cls", [rl.DispatchSubclassInPlace, rl.NestedSubclassInPlace], ids=lambda c: c.__name__)
def test_a_trace_without_nested_ops_leaves_the_subclass_inner_reads_out(cls):
    layer = _loaded(cls)
    with reloadsafe.trace(nested=False) as t:
        layer(torch.randn(*rl.INPUT_SHAPE))
    assert all(op.depth == 0 for op in t.ops)
    names = {n for _, n in t.named_reads(layer) if n is not None}
    assert not any(n.startswith("qweight.") for n in names), names


def test_trace_of_a_torchao_layer_formats_with_inner_names():
    pytest.importorskip("torchao")
    layer = _loaded(rl.TorchaoInt8InPlace)
    with reloadsafe.trace() as t:
        layer(torch.randn(*rl.INPUT_SHAPE))
    names = {n for _, n in t.named_reads(layer) if n is not None}
    assert {"qweight.qdata", "qweight.scale"} <= names, t.format(layer)
    assert "undeclared" not in t.format(layer)


def test_packed_fbgemm_objects_are_named_and_traced_by_identity():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = _loaded(rl.QuantizeDynamicRebuilt)
    objects = reloadsafe.named_objects(layer)
    assert [o.name for o in objects] == ["q._packed_params._packed_params"]
    obj = objects[0].obj
    assert isinstance(obj, torch.ScriptObject) and _reach(layer, objects[0].name) is obj
    assert not any(isinstance(nt.tensor, torch.ScriptObject) for nt in reloadsafe.named_tensors(layer))
    with reloadsafe.trace() as t:
        layer(torch.randn(*rl.INPUT_SHAPE))
    reads = [(o, n) for o, n in t.named_object_reads(layer) if o.op.startswith("quantized::linear_dynamic")]
    assert reads, t.format(layer)
    o, name = reads[0]
    assert name == "q._packed_params._packed_params"
    assert "LinearPackedParamsBase" in o.class_name and o.arg == 1
    assert o.identity == _C.object_identity(obj) != 0
    assert o.where.startswith(f"{rl.LINEAR_DYNAMIC} arg 1")
    assert "q._packed_params._packed_params" in t.format(layer)


def test_a_repacked_object_has_another_identity():
    a = _loaded(rl.FbgemmPrepackRebuilt)
    first = a.packed
    a.process_weights_after_loading()
    assert _C.object_identity(a.packed) != _C.object_identity(first)
    assert _C.object_identity(a.packed) == _C.object_identity(a.packed)
