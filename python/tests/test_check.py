"""check_reload on Python layers: the sample layers pass, each negative
control is flagged by the right name, bad input gets an error naming what
to fix."""
import json
import warnings
from typing import Any, cast

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

    # The protocol's own cold load fails, named by its step and the seeds it
    # drew with (the run's seed 1, the input's input_seed(1)).
    with pytest.raises(ReloadCheckError, match=r"Broken: the cold load's forward \(checkpoint seed 1, input seed "
                       r"7920\) raised RuntimeError: kernel not built for this shape") as e:
        check_reload(Broken, torch.randn(8, 32))
    assert "example input (shape (8, 32)" in str(e.value)
    # Another seed, other seeds named.
    with pytest.raises(ReloadCheckError, match=r"\(checkpoint seed 5, input seed 7924\)"):
        check_reload(Broken, torch.randn(8, 32), seed=5)


def test_wrong_example_input_shape():
    with pytest.raises(ReloadCheckError, match="the cold load's forward .* raised RuntimeError"):
        check_reload(sl.Transposed, torch.randn(8, 31))


def test_module_without_parameters():
    with pytest.raises(ReloadCheckError, match="has no parameters or buffers.*register its weights as torch.nn.Parameter"):
        check_reload(torch.nn.ReLU, torch.randn(4))


def test_a_load_that_changes_shapes_is_judged_by_the_forward_with_the_layout_as_a_hint():
    # A loader may leave a parameter padded, packed or quantized
    # (test_real_code.py), so the layout is no refusal; here the forward
    # breaks on it, and the error says what the load left.
    def load(layer, ckpt):
        layer.weight.data = ckpt["weight"].t().contiguous()  # replaces instead of loading

    with pytest.raises(ReloadCheckError, match=r"the cold load's forward .* raised RuntimeError.*Note: after load, 'weight' is "
                       r"float32\[64, 16\] where the checkpoint has float32\[16, 64\]"):
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False")
@pytest.mark.parametrize("cls", sl.SAMPLES + sl.NEGATIVE_CONTROLS, ids=lambda c: c.__name__)
def test_cuda_graph_replay(cls):
    report = _check(cls, device="cuda")
    expected = getattr(cls, "expected", None)
    if expected is None:
        assert report.ok, report.table()
    else:
        assert not report.ok
    for mode in report.to_dict()["modes"].values():
        assert mode["graph_replays"] == RELOADS, report.table()  # the protocol's graph step ran


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False")
def test_cuda_graph_replay_of_a_rebuilt_tensor_is_stale_on_every_reload():
    # Note [Device quarantine]: the block a reload frees is never handed back
    # to the rebuilt tensor, so the captured graph reads poison every time.
    report = _check(sl.RebuiltScale, device="cuda", trace=False)
    for mode in report.to_dict()["modes"].values():
        stale = [v for v in mode["violations"] if v["tensor"] == "cuda graph replay"]
        assert len(stale) == RELOADS, report.table()


@pytest.mark.parametrize("cls", sl.SAMPLES + sl.NEGATIVE_CONTROLS, ids=lambda c: c.__name__)
def test_sample_layers_are_device_clean(cls):
    # Note [Device-clean layers]: a tensor made without a device lands on
    # meta in the probe and is named; these must all pass it.
    check_reload(cls, _input(cls), reloads=1, modes=("normal",), device_clean=True, trace=False)


class _PadsWithoutADevice(sl.RowPadding):
    def process_weights_after_loading(self):
        padded = torch.zeros(16, 64, dtype=self.weight.dtype).narrow(1, 0, 60)  # no device
        padded.copy_(self.weight)
        sl.keep_address(self.weight, padded)


class _ScaleWithoutADevice(sl.Transposed):
    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        self.col_scale = torch.ones(self.weight.shape[0])  # no device

    def forward(self, x):
        return super().forward(x) * self.col_scale


def test_a_layer_that_makes_a_tensor_without_a_device_is_named_on_a_cpu():
    x = _input(sl.RowPadding)
    check_reload(sl.RowPadding, x, reloads=1, modes=("direct",), device_clean=True)  # the fixed layer
    # keep_address rebinds the weight to the padded tensor made without a device (set_data; on a GPU a CPU weight).
    with pytest.raises(ReloadCheckError, match=r"_PadsWithoutADevice is not device-clean: after the load or post-processing .*'weight' is on meta"):
        check_reload(_PadsWithoutADevice, x, reloads=1, modes=("direct",), device_clean=True)
    check_reload(_PadsWithoutADevice, x, reloads=1, modes=("direct",))  # passes on a CPU without the probe


def test_a_tensor_made_without_a_device_is_named_with_its_step():
    x = _input(sl.Transposed)
    with pytest.raises(ReloadCheckError, match=r"not device-clean: after the load or post-processing .* 'col_scale' is on meta"):
        check_reload(_ScaleWithoutADevice, x, reloads=1, device_clean=True)


# Device-clean probe rows: layers made on sl.Transposed (weight [16, 32]
# after post-processing, output [8, 16]) that each make a tensor without a
# device in one of the ways Note [Device-clean layers] lists. A row whose
# tensor runs beside CUDA weights on a GPU passes the probe; one that would
# raise there is named. What a GPU does with each was seen on an H200
# (torch 2.11): the 0-dim rows, set_data from a CPU parameter, the copies,
# .to(w.device) and as_tensor run; the [1] and [16, 1] rows raise "Expected
# all tensors to be on the same device"; a weight whose .data is set to a
# CPU tensor stays on the CPU.


class _ScalarGain(sl.Transposed):
    """A 0-dim gain made without a device, kept: a number to CUDA's mul."""

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        if not hasattr(self, "gain"):
            self.gain = torch.tensor(0.5)

    def forward(self, x):
        return super().forward(x) * self.gain


class _ScalarsInForward(sl.Transposed):
    def forward(self, x):
        y = super().forward(x)
        return torch.where(y > 0, y, torch.full((), 0.0)) * torch.tensor(2.0)


class _OneWideGain(_ScalarGain):
    """A [1] gain made without a device: not 0-dim, no number to CUDA."""

    def process_weights_after_loading(self):
        sl.Transposed.process_weights_after_loading(self)
        if not hasattr(self, "gain"):
            self.gain = torch.ones(1)


class _RowScaleWithoutADevice(sl.Transposed):
    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        if not hasattr(self, "row_scale"):
            self.row_scale = torch.full((16, 1), 0.5)

    def forward(self, x):
        return torch.mm(x, (self.weight * self.row_scale).t())


class _LinearOverTheWeight(sl.Transposed):
    """An nn.Linear built without a device, its weight's .data set to the
    loaded weight (set_data from a CPU parameter to a CUDA tensor on a GPU)."""

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        if not hasattr(self, "lin"):
            self.lin = torch.nn.Linear(32, 16, bias=False)
            self.lin.weight.data = self.weight

    def forward(self, x):
        return self.lin(x)


class _DataSetWithoutADevice(sl.Transposed):
    """A parameter on the weights' device whose .data is then set to a
    tensor made without a device: on a GPU it ends up on the CPU."""

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        if not hasattr(self, "offset"):
            self.offset = torch.nn.Parameter(self.weight.new_zeros(16), requires_grad=False)
            self.offset.data = torch.zeros(16)

    def forward(self, x):
        return super().forward(x) + self.offset


class _CopiedIntoTheWeightsDevice(sl.Transposed):
    """Values from tensors made without a device copied into tensors on the
    weights' device (copy_, slice assignment): CPU to CUDA copies."""

    def __init__(self):
        super().__init__()
        self.offset = torch.zeros(16)
        self.tail = torch.zeros(16)

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        self.offset.copy_(torch.linspace(0, 1, 16))
        self.tail[:] = torch.arange(16.0)

    def forward(self, x):
        return super().forward(x) + self.offset + self.tail


class _MovedToTheWeightsDevice(sl.Transposed):
    def forward(self, x):
        y = super().forward(x)
        return y + torch.arange(16.0).to(y.device) + torch.ones(16).to(x)


class _AsTensorOfTheWeight(sl.Transposed):
    """torch.as_tensor of the weight, with no device: on the weight's device."""

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        if not hasattr(self, "view"):
            self.view = torch.as_tensor(self.weight)

    def forward(self, x):
        return torch.mm(x, self.view.t())


class _ReadsANumberWithoutADevice(sl.Transposed):
    def forward(self, x):
        return super().forward(x) * int(torch.tensor([1, 2]).sum())


_NOT_CLEAN = r"is not device-clean: after the load or post-processing .*"

#: (layer, None where the probe passes it, else a pattern of its error)
DEVICE_CLEAN_CASES = [
    (_ScalarGain, None),
    (_ScalarsInForward, None),
    (_LinearOverTheWeight, None),
    (_CopiedIntoTheWeightsDevice, None),
    (_MovedToTheWeightsDevice, None),
    (_AsTensorOfTheWeight, None),
    (_OneWideGain, _NOT_CLEAN + r"'gain' is on meta \(float32\[1\]\)"),
    (_RowScaleWithoutADevice, _NOT_CLEAN + r"'row_scale' is on meta \(float32\[16, 1\]\)"),
    (_DataSetWithoutADevice, _NOT_CLEAN + r"'offset' is on meta \(float32\[16\]\)"),
    # The probe cannot know what a host read of a meta tensor would give.
    (_ReadsANumberWithoutADevice, r"the device-clean probe cannot follow the forward .*cannot be called on meta tensors"),
]


@pytest.mark.parametrize(
    "cls, named", DEVICE_CLEAN_CASES, ids=[c.__name__.lstrip("_") for c, _ in DEVICE_CLEAN_CASES]
)
def test_the_device_clean_probe_passes_what_runs_on_a_gpu_and_names_what_does_not(cls, named):
    def run(device_clean):
        return check_reload(cls, _input(cls), reloads=1, modes=("normal",), trace=False, device_clean=device_clean)

    assert run(False).ok  # every row is a correct layer on a CPU
    if named is None:
        assert run(True).ok
    else:
        with pytest.raises(ReloadCheckError, match=named):
            run(True)


def test_raise_for_violations_carries_the_table_and_the_report():
    report = _check(sl.RebuiltScale)
    with pytest.raises(reloadsafe.ReloadViolation) as e:
        report.raise_for_violations()
    assert e.value.report is report and "col_scale" in str(e.value)
    assert _check(sl.Transposed).raise_for_violations().ok


def test_a_forward_that_fails_mid_run_is_that_modes_error():
    # A layer the check makes aside mid-run (a cold load to compare a reload
    # with, built or copied) whose forward raises: no reload's bug (that
    # would be the violation "reload"), the mode's error. Told apart by its
    # loads, not by layers or forwards counted, which depend on what the
    # protocol runs before the reloads: once the live layer has been
    # reloaded, a layer loaded once raises.
    class FailsLater(sl.Transposed):
        reloaded = False

        def process_weights_after_loading(self):
            super().process_weights_after_loading()
            self.loads = getattr(self, "loads", 0) + 1
            FailsLater.reloaded = FailsLater.reloaded or self.loads > 1

        def forward(self, x):
            if FailsLater.reloaded and self.loads == 1:
                raise RuntimeError("workspace exhausted")
            return super().forward(x)

    report = check_reload(FailsLater, torch.randn(8, 32), reloads=RELOADS)
    assert not report.ok
    assert any("workspace exhausted" in e for e in report.errors), report.errors
    assert "error: " in report.table()


# Bad input found by trying the check as a new user would (issue 19): each a
# ReloadCheckError naming what to fix, or a correct verdict.


@pytest.mark.parametrize("value", ["5", True, 2.5, None])
def test_reloads_must_be_a_whole_number(value):
    with pytest.raises(ReloadCheckError, match=rf"reloads must be an int, got {type(value).__name__} .*reloads=10"):
        check_reload(sl.Transposed, torch.randn(8, 32), reloads=value)


def test_seed_tolerance_modes_and_device_are_checked():
    with pytest.raises(ReloadCheckError, match="seed must be an int, got str"):
        check_reload(sl.Transposed, torch.randn(8, 32), seed=cast(Any, "1"))
    with pytest.raises(ReloadCheckError, match="seed must be at least 0, got -1"):
        check_reload(sl.Transposed, torch.randn(8, 32), seed=-1)
    with pytest.raises(ReloadCheckError, match="memory_tolerance_bytes must be an int, got float"):
        check_reload(sl.Transposed, torch.randn(8, 32), memory_tolerance_bytes=cast(Any, 1.5))
    with pytest.raises(ReloadCheckError, match=r"modes must be a sequence of modes, got the string 'normal': pass modes=\('normal',\)"):
        check_reload(sl.Transposed, torch.randn(8, 32), modes="normal")
    with pytest.raises(ReloadCheckError, match="device='gpu0' is not a device"):
        check_reload(sl.Transposed, torch.randn(8, 32), device="gpu0")


def test_a_numpy_integer_is_a_whole_number():
    np = pytest.importorskip("numpy")
    assert check_reload(sl.Transposed, torch.randn(8, 32), reloads=np.int64(2)).ok


class _MetaBuilt(torch.nn.Module):
    """Built on the meta device, as deferred initialisation and online
    quantization build layers: its weights get memory when loaded."""

    def __init__(self):
        super().__init__()
        with torch.device("meta"):
            self.weight = torch.nn.Parameter(torch.empty(16, 32), requires_grad=False)

    def forward(self, x):
        return torch.mm(x, self.weight.t())


def test_a_layer_built_on_the_meta_device_is_materialised_by_its_load():
    report = check_reload(_MetaBuilt, torch.randn(8, 32), reloads=3)
    assert report.ok, report.table()


def test_a_tensor_left_on_the_meta_device_is_named():
    class MetaBuffer(_MetaBuilt):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.empty(32, device="meta"))

        def forward(self, x):
            return torch.mm(x * self.table, self.weight.t())

    with pytest.raises(ReloadCheckError, match=r"buffer 'table' of MetaBuffer is still on the meta device \(float32\[32\], no data\)"):
        check_reload(MetaBuffer, torch.randn(8, 32))
    with pytest.raises(ReloadCheckError, match="parameter 'weight' .* is still on the meta device"):
        check_reload(_MetaBuilt, torch.randn(8, 32), load=lambda layer, ckpt: None)


def test_a_torch_nn_linear_made_on_meta_checks():
    def factory():
        with torch.device("meta"):
            return torch.nn.Linear(32, 16)

    assert check_reload(factory, torch.randn(8, 32), reloads=2).ok


def _mkldnn_linear():
    # torch.utils.mkldnn's modules are TorchScript classes, built on first use:
    # from torch 2.15 on that warns that torch.jit.script_method is deprecated.
    # That is torch's own module, not the code under test.
    import torch.utils.mkldnn

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*script_method.* is deprecated", category=FutureWarning)
        return torch.utils.mkldnn.to_mkldnn(torch.nn.Linear(32, 16).eval())


def test_mkldnn_weights_are_named_with_what_to_do():
    with pytest.raises(ReloadCheckError) as e:
        check_reload(_mkldnn_linear, torch.randn(8, 32))
    msg = str(e.value)
    assert "every parameter is empty" not in msg
    assert "only buffers ('weight' (a mkldnn float32[16, 32] tensor)" in msg, msg
    assert "make_checkpoint=" in msg and "keep 'weight' dense" in msg and "to_mkldnn" in msg, msg


def test_sparse_and_quantized_parameters_are_named_with_what_to_do():
    class Sparse(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.eye(32).to_sparse(), requires_grad=False)

        def forward(self, x):
            return torch.sparse.mm(self.weight, x.t()).t()

    class Quantized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # A quantized parameter, which check_reload must refuse with what
            # to do instead. torch 2.15 deprecates creating one (a
            # UserWarning); users may still hold them, so it is made quietly.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*quantized tensor creation", category=UserWarning)
                q = torch.quantize_per_tensor(torch.randn(16, 32), 0.1, 0, torch.qint8)
            self.weight = torch.nn.Parameter(q, requires_grad=False)

        def forward(self, x):
            return torch.mm(x, self.weight.dequantize().t())

    with pytest.raises(ReloadCheckError, match=r"parameter 'weight' is a sparse_coo float32\[32, 32\] tensor, from which no checkpoint can be drawn.*keep 'weight' a dense \(strided\) tensor.*make it sparse_coo in post-processing"):
        check_reload(Sparse, torch.randn(8, 32))
    with pytest.raises(ReloadCheckError, match=r"parameter 'weight' is a quantized qint8\[16, 32\] tensor.*quantize or pack it .* in post-processing"):
        check_reload(Quantized, torch.randn(8, 32))


def test_the_default_loader_refuses_to_write_into_an_mkldnn_tensor():
    ckpt = lambda seed: {"weight": torch.randn(16, 32, generator=torch.Generator().manual_seed(seed))}  # noqa: E731
    with pytest.raises(ReloadCheckError, match=r"the default loader cannot write the checkpoint's 'weight' into the layer's 'weight', a mkldnn float32\[16, 32\] tensor"):
        check_reload(_mkldnn_linear, torch.randn(8, 32), make_checkpoint=ckpt)


def test_nan_and_inf_at_the_same_places_are_equal():
    class WithNan(sl.Transposed):
        def forward(self, x):
            y = super().forward(x)
            y[:, 0] = float("nan")
            y[:, 1] = float("inf")
            y[:, 2] = float("-inf")
            return y

    report = check_reload(WithNan, torch.randn(8, 32), reloads=RELOADS)
    assert report.ok, report.table()


def test_a_forward_on_another_thread_is_refused_saying_so():
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    class OffThread(sl.Transposed):
        def forward(self, x):
            return pool.submit(lambda: torch.mm(x, self.weight.t())).result()

    try:
        with pytest.raises(ReloadCheckError, match="OffThread: the forward ran no operator on the calling "
                           "thread: if it runs its ops on another thread"):
            check_reload(OffThread, torch.randn(8, 32), reloads=2)
    finally:
        pool.shutdown()


def test_the_garbage_collector_is_left_as_it_was():
    import gc

    assert gc.get_freeze_count() == 0
    assert _check(sl.Transposed).ok
    assert gc.get_freeze_count() == 0  # what the check froze is unfrozen
    keep: list[list[int]] = [[] for _ in range(10)]  # containers the collector tracks
    gc.freeze()  # a caller's own frozen objects
    try:
        frozen = gc.get_freeze_count()
        report = _check(sl.RebuiltScale, expect_violation="col_scale")
        assert report.ok
        # Frozen objects are in no generation. The caller's stay frozen, and
        # what the check made is not frozen; the count may only fall (a frozen
        # object whose last reference the check's run dropped is freed).
        in_generations = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in in_generations for o in keep), "the caller's objects were unfrozen"
        assert id(report) in in_generations, "the check froze what it made"
        assert gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
    del keep


def test_a_cycle_made_by_a_reload_is_collected_before_memory_is_counted():
    class Cyclic(sl.Transposed):
        """Each post-processing makes a reference cycle that holds a copy of
        the weight and drops it: only the collector frees the copy."""

        def process_weights_after_loading(self):
            super().process_weights_after_loading()
            a: dict[str, object] = {}
            b: dict[str, object] = {}
            a["b"], b["a"] = b, a
            a["copy"] = self.weight.detach().clone()

    report = _check(Cyclic)
    assert report.ok, report.table()


class _WithDropout(torch.nn.Module):
    """A correct layer whose forward has dropout: repeatable only in eval
    mode, the mode an engine runs it in. Each forward notes its mode."""

    modes: list[bool] = []

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(8, 16), requires_grad=False)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _WithDropout.modes.append(self.training)
        return self.drop(x @ self.weight.t())


def test_layers_are_checked_in_eval_mode_as_an_engine_runs_them():
    _WithDropout.modes.clear()
    report = check_reload(_WithDropout, torch.randn(4, 16), reloads=2)
    assert report.ok, report.table()
    assert _WithDropout.modes and not any(_WithDropout.modes), _WithDropout.modes


# A check that would test nothing, and a reload that raises.


class _ClosureOverItsOwnWeight(torch.nn.Module):
    """A kernel closure built in __init__ over the layer's own weight: the
    copies check_reload makes of an instance share the closure, so every
    forward reads the instance's weight, never loaded."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(16, 64), requires_grad=False)
        w = self.weight
        self.kernel = lambda x: x @ w.t()

    def forward(self, x):
        return self.kernel(x)


def test_an_instance_whose_closure_reads_the_template_is_refused():
    with pytest.raises(ReloadCheckError, match=r"same output .* for two different checkpoints.*pass a factory"):
        check_reload(_ClosureOverItsOwnWeight(), torch.randn(8, 64), reloads=2)
    # Built by a factory, each layer's closure reads its own weight: checked.
    assert check_reload(_ClosureOverItsOwnWeight, torch.randn(8, 64), reloads=2).ok


def test_a_layer_whose_output_ignores_its_weights_may_say_so():
    # An all-zero input: x @ w^T is zero whatever the weights.
    with pytest.raises(ReloadCheckError, match="allow_constant_output=True"):
        check_reload(sl.Transposed, torch.zeros(8, 32), reloads=2)
    assert check_reload(sl.Transposed, torch.zeros(8, 32), reloads=2, allow_constant_output=True).ok


class _AssertsOnWhatASleepDiscarded(sl.KernelOwner):
    """A shipped bug's shape: post-processing asserts on a plain tensor
    attribute that a level-2 sleep discards and no wake restores (wake
    restores registered buffers only)."""

    def __init__(self):
        super().__init__()
        self.calibrated = torch.ones(1)

    def process_weights_after_loading(self):
        assert bool(self.calibrated.eq(1).all()), "calibration lost"
        super().process_weights_after_loading()


def test_a_reload_that_raises_is_a_violation_naming_the_step():
    report = check_reload(_AssertsOnWhatASleepDiscarded, torch.randn(8, 64), reloads=3, sleep=2)
    assert not report.ok and not report.errors, report.table()
    for mode in report.modes.values():
        assert mode["reloads_done"] == 0, report.table()
        (v,) = mode["violations"]
        assert v["tensor"] == "reload" and v["reload"] == 1, report.table()
        assert v["what"] == ("the reload raised where the cold load did not (at reload 1, after a level-2 "
                             "sleep)"), report.table()
        assert "AssertionError: calibration lost" in v["after"], report.table()
    # Without the sleep the same layer reloads.
    assert check_reload(_AssertsOnWhatASleepDiscarded, torch.randn(8, 64), reloads=3).ok


def test_a_forward_that_raises_after_a_reload_is_a_violation():
    class Breaks(sl.KernelOwner):
        def process_weights_after_loading(self):
            super().process_weights_after_loading()
            self.loads = getattr(self, "loads", 0) + 1

        def forward(self, x):
            if self.loads > 1:
                raise RuntimeError("kernel handle lost on reload")
            return super().forward(x)

    report = check_reload(Breaks, torch.randn(8, 64), reloads=2, modes=("normal",))
    mode = report.modes["normal"]
    assert not report.ok and not report.errors, report.table()
    assert mode["violations"][0]["tensor"] == "reload", report.table()
    assert "the forward after the reload raised" in mode["violations"][0]["what"], report.table()
    assert "kernel handle lost on reload" in mode["violations"][0]["after"], report.table()


def test_a_layer_with_five_rebuilt_tensors_shows_all_five():
    class FiveRebuilt(sl.KernelOwner):
        def process_weights_after_loading(self):
            super().process_weights_after_loading()
            for i in range(5):
                setattr(self, f"derived{i}", self.weight.sum(0) * (i + 1))  # a new tensor every load

        def forward(self, x):
            out = super().forward(x)
            for i in range(5):
                out = out + getattr(self, f"derived{i}")[:16]
            return out

    table = check_reload(FiveRebuilt, torch.randn(8, 64), reloads=2).table()
    for i in range(5):
        assert f"derived{i}" in table, table
    assert "more violations; flagged:" in table, table


# Note [Naming a value failure's culprit]: a failure on values alone is
# looked at again with host_numbers and compare_state, and the report says
# what they name.


class _HostFloatScale(sl.KernelOwner):
    """The scale kept as a Python float: a captured graph keeps the old one."""

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        self.scale_float = float(self.col_scale.max()) + 1.0

    def forward(self, x):
        return super().forward(x) * self.scale_float


class _SkipsPostProcessingOnReload(sl.KernelOwner):
    """Post-processing that runs on the first load only: the derived scale
    is stale after every reload."""

    def __init__(self):
        super().__init__()
        self.register_buffer("row_scale", torch.ones(16))
        self._done = False

    def process_weights_after_loading(self):
        if self._done:
            return
        super().process_weights_after_loading()
        self.row_scale.copy_(self.weight.abs().amax(1) + 1.0)
        self._done = True

    def forward(self, x):
        return super().forward(x) * self.row_scale


@pytest.mark.parametrize(("cls", "culprit"), [(_HostFloatScale, "scale_float"),
                                               (_SkipsPostProcessingOnReload, "col_scale")])
def test_a_failure_on_values_alone_names_its_culprit(cls, culprit):
    report = check_reload(cls, torch.randn(8, 64), reloads=3)
    assert not report.ok and set(report.flagged) <= {"forward", "replay"}, report.table()
    table = report.table()
    assert "host_numbers=True, compare_state=True name why" in table and f"'{culprit}'" in table, table
