"""reloadsafe.trace(): which tensors Python code hands to operators, through
the C++ ReadTrace."""
import threading

import pytest
import torch

import reloadsafe

import sample_layers as sl


def test_external_reads_are_the_callers_tensors_with_their_layout():
    a = torch.randn(4, 8)
    b = torch.randn(16, 8)
    with reloadsafe.trace() as t:
        torch.mm(a, b.t())
    names = [op.name for op in t.ops]
    assert "aten::mm" in names
    mm = next(op for op in t.ops if op.name == "aten::mm")
    self_read, mat2 = mm.reads[0], mm.reads[1]
    assert self_read.external and self_read.data_ptr == a.data_ptr()
    assert self_read.sizes == (4, 8) and self_read.strides == (8, 1) and self_read.dtype == torch.float32
    assert self_read.device == torch.device("cpu") and self_read.arg_name == "self"
    # b.t() is a view of an external storage: external, with the view's layout.
    assert mat2.external and mat2.data_ptr == b.data_ptr() and mat2.strides == (1, 8)
    assert mat2.where == "aten::mm arg 1 (mat2)"
    assert "stride [1, 8]" in mat2.layout


def test_tensors_made_inside_are_internal_and_byte_offsets_count():
    w = torch.randn(10)
    with reloadsafe.trace(nested=False) as t:
        y = w[3:] * 2
        torch.add(y, y)
    mul = next(op for op in t.ops if op.name.startswith("aten::mul"))
    assert mul.reads[0].external and mul.reads[0].byte_offset == 12
    assert mul.reads[0].data_ptr == w.data_ptr() + 12
    add = next(op for op in t.ops if op.name.startswith("aten::add"))
    assert all(not r.external for r in add.reads)
    # The slice (an op too) reads w at its start, the mul through the view.
    assert [(r.op, r.data_ptr - w.data_ptr()) for r in t.external_reads()] == [("aten::slice.Tensor", 0), ("aten::mul.Tensor", 12)]


def test_in_place_and_out_reads_are_marked_written():
    w = torch.zeros(4)
    out = torch.empty(4)
    with reloadsafe.trace(nested=False) as t:
        w.add_(1)
        torch.mul(w, 2, out=out)
    add = next(op for op in t.ops if op.name.startswith("aten::add_"))
    assert add.reads[0].written
    mul = next(op for op in t.ops if op.name.startswith("aten::mul"))
    assert [r.written for r in mul.reads if r.arg_name == "out"] == [True]


def test_custom_op_from_torch_library_is_seen():
    @torch.library.custom_op("reloadsafe_test::scale", mutates_args=())
    def scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * s

    x, s = torch.randn(3), torch.randn(3)
    with reloadsafe.trace() as t:
        torch.ops.reloadsafe_test.scale(x, s)
    op = next(op for op in t.ops if op.name.startswith("reloadsafe_test::scale"))
    assert [r.data_ptr for r in op.reads] == [x.data_ptr(), s.data_ptr()]
    # Its implementation's ops are recorded one level deeper.
    assert any(o.depth > 0 and o.name.startswith("aten::mul") for o in t.ops)


def test_named_reads_name_module_tensors_and_leave_outside_ones_unnamed():
    layer = sl.OutsideKernel()
    layer.process_weights_after_loading()
    inside = sl.KernelOwner()
    inside.process_weights_after_loading()
    x = torch.randn(8, 64)
    with reloadsafe.trace() as t:
        layer(x)
    assert [(r.where, n) for r, n in t.named_reads(layer) if r.depth == 0 and r.data_ptr != x.data_ptr()] == [
        ("aten::mm arg 1 (mat2)", None)
    ]
    assert "undeclared" in t.format(layer)
    with reloadsafe.trace() as t:
        inside(x)
    named = {n for r, n in t.named_reads(inside)}
    assert {"weight", "col_scale"} <= named


def test_another_threads_ops_are_not_recorded():
    a = torch.randn(64, 64)
    done = threading.Event()

    def work():
        for _ in range(50):
            torch.mm(a, a)
        done.set()

    with reloadsafe.trace() as t:
        th = threading.Thread(target=work)
        th.start()
        th.join()
        torch.relu(a)
    assert done.is_set()
    assert [op.name for op in t.ops if op.depth == 0] == ["aten::relu"]


def test_a_block_that_raises_stops_the_trace():
    with pytest.raises(ValueError), reloadsafe.trace() as t:
        torch.neg(torch.ones(2))
        raise ValueError("boom")
    n = len(t.ops)
    torch.neg(torch.ones(2))
    assert len(t.ops) == n


def test_results_only_after_the_block_and_a_trace_is_entered_once():
    tr = reloadsafe.trace()
    with pytest.raises(RuntimeError, match="once the with block has ended"):
        _ = tr.ops
    with tr:
        pass
    with pytest.raises(RuntimeError, match="entered once"), tr:
        pass


def test_a_trace_inside_another_records_in_both():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with reloadsafe.trace(nested=False) as outer:
        torch.mm(a, b)
        with reloadsafe.trace(nested=False) as inner:
            torch.add(a, b)
        torch.relu(a)
    assert [op.name for op in inner.ops] == ["aten::add.Tensor"]
    assert [op.name for op in outer.ops] == ["aten::mm", "aten::add.Tensor", "aten::relu"]


def test_an_opaque_object_argument_is_an_object_read():
    # fbgemm's fp16 packing: a LinearPackedParamsBase without a quantized
    # tensor (creating qint8 tensors is deprecated from torch 2.15).
    packed = torch.ops.quantized.linear_prepack_fp16(torch.randn(16, 8), None)
    layer = torch.nn.Module()
    layer.packed = packed
    x = torch.randn(2, 8)
    with reloadsafe.trace() as t:
        torch.ops.quantized.linear_dynamic_fp16(x, packed)
    op = next(op for op in t.ops if op.name.startswith("quantized::linear_dynamic_fp16"))
    assert [(o.arg, o.arg_name) for o in op.objects] == [(1, "W_prepack")]
    assert op.objects[0].identity == reloadsafe._C.object_identity(packed)
    assert "LinearPackedParamsBase" in op.objects[0].class_name
    assert t.object_reads() == list(op.objects)
    assert [(o.where, n) for o, n in t.named_object_reads(layer)] == [("quantized::linear_dynamic_fp16 arg 1 (W_prepack)", "packed")]
    assert "packed" in t.format(layer) and "LinearPackedParamsBase" in t.format(layer)


def test_reads_of_tensors_without_storage_are_named_without_touching_them():
    layer = torch.nn.Module()
    layer.register_buffer("m", torch.randn(4, 4).to_mkldnn())
    layer.s = torch.randn(4, 4).to_sparse()
    layer.w = torch.randn(4, 4)
    layer.empty = torch.empty(0)
    with reloadsafe.trace() as t:
        layer.m.to_dense()
        torch.mm(layer.w, layer.w)
    named = dict((r.where, n) for r, n in t.named_reads(layer))
    assert named["aten::mm arg 0 (self)"] == "w"
    assert t.format(layer)  # mkldnn, sparse and empty tensors in the module: no error
