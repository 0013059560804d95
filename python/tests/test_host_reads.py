"""host_reads.py: a forward that chooses its ops by values it reads with
tolist() or numpy(), which reach Python without an op (as Hugging Face's
JetMoE sizes its experts' splits), passes a correct reload; without the note
the same check flags the op sequence. The methods are put back afterwards."""
import contextlib
import threading

import pytest
import torch

import reloadsafe
import reloadsafe.check as check_module
from reloadsafe import check_reload
from reloadsafe.host_reads import noting_host_reads

EXPERTS, ROWS, DIM = 4, 3, 8


class CountedExperts(torch.nn.Module):
    """Each row goes to the expert its gate scores highest; the rows are
    split by the experts' counts, read on the host, and an expert that got
    no row runs no matmul: which ops run follows the weights. The experts
    are visited in order, so the reads before the first op that changes are
    the capture's."""

    def __init__(self, read: str = "tolist") -> None:
        super().__init__()
        self.read = read
        self.gate = torch.nn.Parameter(torch.empty(DIM, EXPERTS), requires_grad=False)
        self.experts = torch.nn.Parameter(torch.empty(EXPERTS, DIM, DIM), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = (x @ self.gate).argmax(dim=1)
        counts = torch.stack([(choice == e).sum() for e in range(EXPERTS)])  # no op reads a value
        sizes = counts.tolist() if self.read == "tolist" else [int(n) for n in counts.numpy()]
        parts = x[choice.argsort(stable=True)].split(sizes)
        return torch.cat([p @ self.experts[e] if sizes[e] else p.new_zeros(0, DIM) for e, p in enumerate(parts)])


def _check(read: str):
    if read == "numpy":
        pytest.importorskip("numpy", reason="Tensor.numpy() needs numpy, not in this environment")
    x = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(0))
    return check_reload(lambda: CountedExperts(read), x, reloads=4)


def _messages(report):
    return [w["message"] for m in report.modes.values() for w in m["warnings"]]


@pytest.mark.parametrize("read", ["tolist", "numpy"])
def test_ops_chosen_by_values_read_without_an_op_follow_the_weights(read):
    report = _check(read)
    assert report.ok and not report.errors, report.table()
    messages = _messages(report)
    # The routing changes between the protocol's checkpoints, so the path
    # that tells it from a reload's change ran in every mode.
    assert len(messages) == len(reloadsafe.MODES), report.table()
    assert all("ops follow the weights' values" in m for m in messages), report.table()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_same_routing_compiled_follows_the_weights(backend):
    # torch.compile breaks its graph at tolist() and, after a reload that
    # routes otherwise, compiles the rest again for the new split sizes (with
    # symbolic sizes, whose ops run once more through Python's dispatcher):
    # still the forward's own routing, which a cold load of the checkpoint
    # repeats.
    def build():
        layer = CountedExperts("tolist")
        layer.compile(backend=backend)
        return layer

    torch._dynamo.reset()
    x = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(0))
    report = check_reload(build, x, reloads=4)
    assert report.ok and not report.errors, report.table()
    messages = _messages(report)
    assert len(messages) == len(reloadsafe.MODES), report.table()
    assert all("ops follow the weights' values" in m for m in messages), report.table()


def test_a_read_in_compiled_code_is_noted_too():
    # Traced into a graph, the op (which returns nothing) would be dropped as
    # dead code: the noting method runs outside the compiler.
    torch._dynamo.reset()
    total = torch.compile(lambda t: (t * 2).sum().tolist(), backend="aot_eager")
    t = torch.arange(6.0)
    with noting_host_reads():
        total(t)
        with reloadsafe.trace() as tr:
            assert total(t) == 30.0
    assert [op.depth for op in tr.ops if op.name == "reloadsafe::host_read"] == [0], [op.name for op in tr.ops]


def test_a_read_compiled_into_one_graph_is_an_op_the_trace_sees():
    # With capture_scalar_outputs, Dynamo traces tolist() itself into the
    # graph as one _local_scalar_dense per value (an op that reads values),
    # without calling the noting method: fullgraph compiles, and the reads
    # are still seen. (Patched through the config's own API: on torch 2.15
    # pytest's monkeypatch deletes a config entry when it restores it.)
    torch._dynamo.reset()
    sizes = torch.compile(lambda t: (t > 0).sum(0).tolist(), backend="aot_eager", fullgraph=True)
    t = torch.tensor([[1.0, -1.0], [2.0, 3.0]])
    with torch._dynamo.config.patch(capture_scalar_outputs=True), noting_host_reads():
        sizes(t)
        with reloadsafe.trace() as tr:
            assert sizes(t) == [2, 1]
    torch._dynamo.reset()
    top = [op.name for op in tr.ops if op.depth == 0]
    assert top.count("aten::_local_scalar_dense") == 2, top
    assert "reloadsafe::host_read" not in top, top


def test_without_the_note_the_same_routing_is_flagged(monkeypatch):
    monkeypatch.setattr(check_module, "noting_host_reads", contextlib.nullcontext)
    report = _check("tolist")
    assert not report.ok and "op sequence" in report.flagged, report.table()


def test_the_methods_are_put_back_after_a_check_and_a_nested_use():
    assert "tolist" not in torch.Tensor.__dict__ and "numpy" not in torch.Tensor.__dict__
    with noting_host_reads():
        with noting_host_reads():
            assert torch.Tensor.tolist is not torch._C.TensorBase.tolist
        assert torch.Tensor.tolist is not torch._C.TensorBase.tolist  # the outer use holds
    _check("tolist")
    assert "tolist" not in torch.Tensor.__dict__ and "numpy" not in torch.Tensor.__dict__
    assert torch.Tensor.tolist is torch._C.TensorBase.tolist


def test_a_noted_read_is_a_traced_op_and_returns_the_same_values():
    t = torch.arange(6).reshape(2, 3)
    param = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    with noting_host_reads(), reloadsafe.trace() as tr:
        values = t.tolist()
        from_param = param.tolist()
    with reloadsafe.trace() as plain:
        t.tolist()
    assert values == [[0, 1, 2], [3, 4, 5]] and from_param == [1.0, 1.0]
    noted = [op for op in tr.ops if op.name == "reloadsafe::host_read"]
    assert [op.reads[0].data_ptr for op in noted] == [t.data_ptr(), param.data_ptr()]
    assert not [op for op in plain.ops if op.name == "reloadsafe::host_read"]


def test_threads_share_one_replacement_and_the_last_puts_it_back():
    inside = threading.Barrier(3)
    done = threading.Barrier(3)

    def user():
        with noting_host_reads():
            inside.wait()
            done.wait()

    threads = [threading.Thread(target=user) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert torch.Tensor.tolist is not torch._C.TensorBase.tolist
    done.wait()
    for t in threads:
        t.join()
    assert "tolist" not in torch.Tensor.__dict__
