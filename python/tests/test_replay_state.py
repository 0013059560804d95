"""The capture's CPU replay runs each op under the thread-local state it ran
under in the forward (autocast and its dtype, grad and inference mode): a
correct layer's verdict does not depend on the state its forward enters."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reloadsafe import check_reload


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(16, 32), requires_grad=False)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


class AutocastForward(Linear):
    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.nn.functional.linear(x, self.weight).float()


class AutocastFloat16Forward(Linear):
    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.nn.functional.linear(x, self.weight).float()


class InferenceModeForward(Linear):
    def forward(self, x):
        with torch.inference_mode():
            return torch.nn.functional.linear(x, self.weight) * 2


class GradModeForward(Linear):
    def forward(self, x):
        with torch.enable_grad():
            return torch.nn.functional.linear(x, self.weight) + 1


class Counting(TorchDispatchMode):
    """A Python dispatch mode that only counts the ops it runs, as a
    profiling or logging mode does."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class DispatchModeForward(Linear):
    def forward(self, x):
        with Counting():
            return torch.nn.functional.linear(x, self.weight) * 2


X = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))


# A forward under a Python dispatch mode (a profiling or logging mode) is
# captured with the Python keys on; what a replay runs instead is
# call_state_test's (Note [A Python mode is not replayed] in
# conformance/trace/internal/call_state.cc).
@pytest.mark.parametrize("cls", [AutocastForward, AutocastFloat16Forward, InferenceModeForward, GradModeForward,
                                 DispatchModeForward], ids=lambda c: c.__name__)
def test_a_forward_that_enters_thread_local_state_replays_under_it(cls):
    report = check_reload(cls, X, reloads=3)
    assert report.ok, report.table()


def test_the_replay_leaves_the_callers_autocast_state_as_it_was():
    before = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    assert check_reload(AutocastFloat16Forward, X, reloads=2).ok
    assert (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")) == before


def test_a_check_run_under_the_callers_autocast_passes():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert check_reload(Linear, X, reloads=2).ok
