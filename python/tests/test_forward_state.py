"""State a forward makes and memory it fills without an op, as whole models
have them (Hugging Face's Recurrent Gemma and Mamba): a correct layer passes
with a warning that says what was not checked, and the bug beside each one
is still flagged."""
import pytest
import torch

from reloadsafe import check_reload

DIM = 8


def _messages(report):
    return [(w["tensor"], w["message"]) for m in report.modes.values() for w in m["warnings"]]


class PrefillState(torch.nn.Module):
    """Every forward binds `state` to tensors it makes (zeros, then the
    scan's steps), as Recurrent Gemma's prefill does: no forward reads the
    previous call's state, so no graph depends on where it was."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(DIM, DIM), requires_grad=False)
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state = torch.zeros(DIM)
        rows: list[torch.Tensor] = []
        for row in x @ self.weight:
            state = self.state = 0.5 * state + row
            rows.append(state)
        return torch.stack(rows)


class CarriedState(PrefillState):
    """A decode step: the state the previous call left is read, and the name
    bound to the new one. A graph captured once reads the captured address
    at every replay; the forward run again reads another."""

    def __init__(self) -> None:
        super().__init__()
        self.state = torch.zeros(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.state is not None
        state = self.state = 0.5 * self.state + (x @ self.weight).sum(0)
        return x @ self.weight + state


def test_state_every_forward_makes_passes_with_a_warning_naming_it():
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(0))
    report = check_reload(PrefillState, x, reloads=3)
    assert report.ok and not report.errors, report.table()
    warned = [t for t, m in _messages(report) if m.startswith("made by every forward")]
    assert warned == ["state"] * len(report.modes), report.table()


def test_state_carried_over_from_the_previous_forward_is_flagged():
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(0))
    report = check_reload(CarriedState, x, reloads=3)
    assert not report.ok, report.table()
    assert "state" in report.flagged, report.table()


class IndexFromData(torch.nn.Module):
    """Rows picked by a tensor made from Python data (torch.tensor: memory
    PyTorch fills without an op), bumped in place before its use. The call
    count handed to an op as a number (with no effect on the result) makes
    every retrace differ from the capture, so the replay runs after every
    reload rather than being known from the retrace."""

    def __init__(self, bump: bool) -> None:
        super().__init__()
        self.bump = bump
        self.calls = 0
        self.weight = torch.nn.Parameter(torch.empty(4, DIM), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        rows = torch.tensor([0, 2])
        if self.bump:
            rows.add_(1)
        return torch.add(x @ self.weight.index_select(0, rows).t(), self.calls, alpha=0)


@pytest.mark.parametrize("bump", [False, True], ids=["as made", "bumped by add_"])
def test_a_tensor_made_from_python_data_is_replayed_with_its_data(bump):
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(0))
    report = check_reload(lambda: IndexFromData(bump), x, reloads=3)
    assert report.ok and not report.errors, report.table()
    assert not any(t == "replay" for t, _ in _messages(report)), report.table()


class FilledThroughNumpy(torch.nn.Module):
    """Rows picked by memory an empty() made and numpy wrote: what a kernel
    called through its own binding does. The replay cannot rebuild it, and
    says so; the addresses and the live forward are still checked."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(4, DIM), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.empty(2, dtype=torch.int64)
        rows.numpy()[:] = [1, 3]
        return x @ self.weight.index_select(0, rows).t()


def test_memory_written_outside_the_dispatcher_is_not_replayed_and_says_why():
    pytest.importorskip("numpy", reason="Tensor.numpy() needs numpy, not in this environment")
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(0))
    report = check_reload(FilledThroughNumpy, x, reloads=3)
    assert report.ok and not report.errors, report.table()
    replay = [m for t, m in _messages(report) if t == "replay"]
    assert replay and all("reads memory an empty-like op made that no op wrote" in m for m in replay), (
        report.table())
