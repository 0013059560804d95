"""check_reload's harness-step keywords come from the C++ step table
(conformance/harness/step_table.cc through _C.step_table()): each step is a
keyword with its default in the signature and a line in the docstring, and a
value it cannot take, or a keyword no step has, is refused naming it."""
import inspect

import pytest
import torch

from reloadsafe import _C, ReloadCheckError, check_reload

import sample_layers

X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


def _layer():
    return torch.nn.Linear(8, 8, bias=False)


@pytest.mark.parametrize("spec", _C.step_table(), ids=lambda s: s.name)
def test_every_step_is_a_keyword_with_its_default_and_its_doc(spec):
    parameter = inspect.signature(check_reload).parameters[spec.name]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    assert parameter.default is (False if spec.takes == "switch" else None)
    assert spec.help in " ".join((check_reload.__doc__ or "").split())


@pytest.mark.parametrize(
    "kwargs, error, says",
    [
        ({"hibernate": True}, TypeError, "unexpected keyword argument 'hibernate' (the harness steps are sleep"),
        ({"compare_state": 1}, ReloadCheckError, "compare_state is a switch: pass True or False, got 1"),
        ({"sleep": 3}, ReloadCheckError, "sleep must be one of (1, 2)"),
        ({"sleep": True}, ReloadCheckError, "sleep must be one of (1, 2)"),
        ({"reload_peak_budget_bytes": -1}, ReloadCheckError, "reload_peak_budget_bytes must be at least 0"),
    ],
)
def test_a_step_value_it_cannot_take_is_refused_naming_it(kwargs, error, says):
    with pytest.raises(error) as raised:
        check_reload(_layer, X, reloads=1, **kwargs)
    assert says in str(raised.value)


def test_a_step_left_at_its_default_is_not_taken_and_one_asked_for_runs():
    plain = check_reload(_layer, X, reloads=2, compare_state=False, sleep=None)
    assert plain.ok, plain.table()
    stepped = check_reload(_layer, X, reloads=2, compare_state=True, sleep=2)
    assert stepped.ok, stepped.table()
    # What the run was given (the report keeps the run's options for its JSON).
    assert stepped._options.steps.values() == {"compare_state": 1, "sleep": 2}
    assert not plain._options.steps.any()


def test_the_cpp_table_refuses_a_name_it_lacks():
    with pytest.raises(RuntimeError, match="no harness step is named 'hibernate'"):
        _C.check_steps(_C.ReloadSteps().set("hibernate"))
    merged = _C.merge_steps(_C.ReloadSteps().set("sleep", 1), _C.ReloadSteps().set("sleep", 2))
    assert merged.get("sleep") == 2


class _FusedQK(torch.nn.Module):
    """q and k loaded into one fused weight; ``resets`` zeroes it at the
    start of every load call, right only while both halves come in one."""

    def __init__(self, resets: bool = True):
        super().__init__()
        self.qk = torch.nn.Parameter(torch.zeros(16, 8), requires_grad=False)
        self.resets = resets

    def forward(self, x):
        return x @ self.qk.t()


def _load_fused(layer, ckpt):
    if layer.resets:
        layer.qk.zero_()
    for name, half in ckpt.items():
        layer.qk[(0 if name == "q" else 8):][:8].copy_(half)


def _fused_checkpoint(seed):
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(8, 8, generator=g), "k": torch.randn(8, 8, generator=g)}


def test_load_per_tensor_loads_in_parts_as_a_weight_sync_does():
    def check(resets, **steps):
        return check_reload(lambda: _FusedQK(resets), X, load=_load_fused, make_checkpoint=_fused_checkpoint,
                            reloads=2, **steps)

    assert check(True).ok  # one call per load: the reset is harmless
    caught = check(True, load_per_tensor=True, compare_state=True)
    assert not caught.ok and "qk" in caught.flagged, caught.table()
    assert check(False, load_per_tensor=True, compare_state=True).ok


def test_load_from_file_loads_a_file_into_the_layers_tensors_and_refuses_another_layout():
    # MlaDerived's checkpoint names its parameter: the file is loaded into it
    # in place, and what post-processing derives from it is checked as usual.
    x = torch.randn(*sample_layers.MlaDerived.input_shape)
    report = check_reload(sample_layers.MlaDerived, x, reloads=2, load_from_file=True, compare_state=True)
    assert report.ok, report.table()
    # A negative control's post-processing still breaks its addresses.
    x = torch.randn(*sample_layers.RebuiltScale.input_shape)
    caught = check_reload(sample_layers.RebuiltScale, x, reloads=2, load_from_file=True)
    assert not caught.ok and "col_scale" in caught.flagged, caught.table()
    # Transposed keeps its weight as [16, 32]; the checkpoint's is [32, 16].
    x = torch.randn(*sample_layers.Transposed.input_shape)
    with pytest.raises(ReloadCheckError) as raised:
        check_reload(sample_layers.Transposed, x, reloads=2, load_from_file=True)
    says = str(raised.value)
    assert "the checkpoint's tensor 'weight' is Float [32, 16], the layer's 'weight' is Float [16, 32]" in says
    assert "run without load_from_file" in says and "reloadsafe.SafetensorsLoader" in says
