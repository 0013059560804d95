"""check_reload on Python layers: the sample layers pass, each negative
control is flagged by the right name, bad input gets an error naming what
to fix."""
import json

import pytest
import torch

import reloadsafe
from reloadsafe import ReloadCheckError, check_reload

import sample_layers as sl

RELOADS = 4


def _input(cls):
    return torch.randn(*cls.input_shape, generator=torch.Generator().manual_seed(0))


def _check(cls, **kw):
    kw.setdefault("modes", getattr(cls, "modes", reloadsafe.MODES))
    return check_reload(cls, _input(cls), reloads=RELOADS, **kw)


@pytest.mark.parametrize("cls", sl.SAMPLES, ids=lambda c: c.__name__)
def test_sample_layers_keep_every_address(cls):
    report = _check(cls)
    assert report.ok, report.table()
    claimed = getattr(cls, "modes", reloadsafe.MODES)
    data = report.to_dict()
    assert data["name"] == cls.__name__ and data["ok"]
    assert set(data["modes"]) == set(reloadsafe.MODES)  # both run; only the claimed ones count
    for mode in claimed:
        m = data["modes"][mode]
        assert m["expected_to_pass"] and m["reloads_done"] == RELOADS
        assert m["flagged"] == [] and m["violations"] == [] and "error" not in m, report.table()
        assert m["declared_reads"] >= 1 and m["undeclared_reads"] == 0
        assert len(m["memory_bytes"]) == RELOADS + 1


@pytest.mark.parametrize("cls", sl.NEGATIVE_CONTROLS, ids=lambda c: c.__name__)
def test_negative_controls_are_flagged_by_name(cls):
    report = _check(cls)
    assert not report.ok
    assert any(f.startswith(cls.expected) for f in report.flagged), (cls.expected, report.flagged, report.table())
    assert cls.expected in report.table()
    # Declared as a negative control, the same run is ok (detected).
    assert _check(cls, expect_violation=cls.expected).ok


def test_a_negative_control_that_names_the_wrong_tensor_is_not_ok():
    assert not _check(sl.RebuiltScale, expect_violation="weight").ok


def test_outside_kernel_read_is_named_undeclared_with_op_and_argument():
    report = _check(sl.OutsideKernel)
    table = report.table()
    assert "aten::mm" in table and "mat2" in table and "undeclared" in table, table


def test_json_is_the_cpp_schema():
    report = _check(sl.Transposed)
    data = json.loads(report.json())
    assert set(data) == {"device", "reloads", "seed", "trace", "backends"}
    assert data["device"] == "cpu" and data["reloads"] == RELOADS and data["trace"] is True
    entry = data["backends"][0]
    assert list(entry)[:4] == ["name", "description", "negative_control", "ok"]
    for mode in entry["modes"].values():
        assert {"expected_to_pass", "reloads_done", "violation_count", "declared_reads", "undeclared_reads",
                "flagged", "violations", "warnings", "memory_bytes"} <= set(mode)


def test_a_module_instance_is_deep_copied_and_left_unloaded():
    layer = sl.Transposed()
    before = layer.weight.detach().clone()
    report = check_reload(layer, _input(sl.Transposed), reloads=2)
    assert report.ok, report.table()
    assert torch.equal(layer.weight, before)


def test_user_checkpoints_and_load_function():
    seen = []

    def make_checkpoint(seed):
        g = torch.Generator().manual_seed(seed)
        return {"w": torch.randn(16, 64, generator=g)}

    def load(layer, ckpt):
        seen.append(ckpt["w"].sum().item())
        layer.weight.detach().copy_(ckpt["w"])

    report = check_reload(sl.KernelOwner, torch.randn(8, 64), load=load, make_checkpoint=make_checkpoint, reloads=3)
    assert report.ok, report.table()
    assert len(set(seen)) > 3  # value-changing checkpoints


# Bad input: a ReloadCheckError that says what to fix.


def test_not_a_module():
    with pytest.raises(ReloadCheckError, match="must be a torch.nn.Module or a function returning one, got int"):
        check_reload(42, torch.randn(2))
    with pytest.raises(ReloadCheckError, match="factory returned dict, not a torch.nn.Module"):
        check_reload(lambda: {"weight": torch.zeros(1)}, torch.randn(2))


def test_forward_that_raises():
    class Broken(sl.Transposed):
        def forward(self, x):
            raise RuntimeError("kernel not built for this shape")

    with pytest.raises(ReloadCheckError, match=r"the forward raised RuntimeError: kernel not built for this shape") as e:
        check_reload(Broken, torch.randn(8, 32))
    assert "example input (shape (8, 32)" in str(e.value)


def test_wrong_example_input_shape():
    with pytest.raises(ReloadCheckError, match="the forward raised RuntimeError"):
        check_reload(sl.Transposed, torch.randn(8, 31))


def test_module_without_parameters():
    with pytest.raises(ReloadCheckError, match="has no parameters or buffers.*register its weights as torch.nn.Parameter"):
        check_reload(torch.nn.ReLU, torch.randn(4))


def test_load_that_changes_shapes():
    def load(layer, ckpt):
        layer.weight.data = ckpt["weight"].t().contiguous()  # replaces instead of loading

    with pytest.raises(ReloadCheckError, match=r"after load, 'weight' is float32\[64, 16\] but the checkpoint has float32\[16, 64\]"):
        check_reload(sl.KernelOwner, torch.randn(8, 64), load=load)


def test_checkpoint_names_the_layer_lacks():
    with pytest.raises(ReloadCheckError, match="the checkpoint has 'nope' but the layer has no parameter or buffer"):
        check_reload(sl.Transposed, torch.randn(8, 32), make_checkpoint=lambda s: {"nope": torch.zeros(1)})


def test_checkpoints_must_keep_their_layouts():
    with pytest.raises(ReloadCheckError, match="every checkpoint must have the same names and layouts"):
        check_reload(sl.Transposed, torch.randn(8, 32), make_checkpoint=lambda s: {"weight": torch.zeros(32, 16 + s)})


def test_bad_arguments():
    with pytest.raises(ReloadCheckError, match="unknown mode 'fast'"):
        check_reload(sl.Transposed, torch.randn(8, 32), modes=("fast",))
    with pytest.raises(ReloadCheckError, match="reloads must be at least 1"):
        check_reload(sl.Transposed, torch.randn(8, 32), reloads=0)
    with pytest.raises(ReloadCheckError, match="example_input must be a tensor"):
        check_reload(sl.Transposed, [1, 2, 3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("cls", sl.SAMPLES + sl.NEGATIVE_CONTROLS, ids=lambda c: c.__name__)
def test_cuda_graph_replay(cls):
    report = _check(cls, device="cuda")
    expected = getattr(cls, "expected", None)
    if expected is None:
        assert report.ok, report.table()
    else:
        assert not report.ok


def test_raise_for_violations_carries_the_table_and_the_report():
    report = _check(sl.RebuiltScale)
    with pytest.raises(reloadsafe.ReloadViolation) as e:
        report.raise_for_violations()
    assert e.value.report is report and "col_scale" in str(e.value)
    assert _check(sl.Transposed).raise_for_violations().ok


def test_a_forward_that_fails_mid_run_is_that_modes_error():
    class FailsLater(sl.Transposed):
        calls = 0

        def forward(self, x):
            FailsLater.calls += 1
            if FailsLater.calls > 12:
                raise RuntimeError("workspace exhausted")
            return super().forward(x)

    report = check_reload(FailsLater, torch.randn(8, 32), reloads=RELOADS)
    assert not report.ok
    assert any("workspace exhausted" in e for e in report.errors), report.errors
    assert "error: " in report.table()
