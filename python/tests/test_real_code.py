"""The patterns real code brings to ``check_reload``, each reduced to a few
lines of plain torch: compiled forwards, tensors a forward makes through a
factory, loaders that leave a parameter padded, packed or already quantized,
factories whose layers outlive the check, and vLLM's layer conventions.

Each was a false alarm or an error where a verdict was due on real code
(whole Hugging Face models, vLLM's own layers); the tests pin the right
verdict, correct and buggy variants alike.
"""
import copy
import time

import pytest
import torch

import reloadsafe
from reloadsafe import ReloadCheckError, check_reload

RELOADS = 3
OUT, IN = 32, 64


def _param(*shape, dtype=torch.float32):
    return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)


def _x(rows=8, cols=IN):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))


def _warnings(report):
    return [w for m in report.modes.values() for w in m["warnings"]]


def _clean(report):
    """ok, with no violation and no warning in any mode."""
    assert report.ok, report.table()
    assert not _warnings(report), report.table()


# --- 1. torch.compile ------------------------------------------------------
# Dynamo guards on the dispatch keys the trace switches on, so a compiled
# function recompiles inside the captured forward; what the compiler runs
# there (on fake tensors, with symbolic sizes under dynamic=True) is not the
# forward's work and must not be recorded.


def _amax(x):
    return x.abs().amax(-1)


class CompiledActScale(torch.nn.Module):
    """vLLM's FP8 activation quantization in miniature: the forward calls a
    function compiled apart from the layer (vLLM compiles it with
    dynamic=True)."""

    def __init__(self, dynamic, backend):
        super().__init__()
        self.weight = _param(OUT, IN)
        self.act_scale = torch.compile(_amax, dynamic=dynamic, backend=backend)

    def forward(self, x):
        return (x @ self.weight.t()) * self.act_scale(x)[:, None]


class ScaledLinear(torch.nn.Module):
    """A linear layer whose post-processing derives a per-row scale: refilled
    in place (correct) or, with ``rebuild``, bound anew on every reload."""

    def __init__(self, rebuild=False):
        super().__init__()
        self.weight = _param(OUT, IN)
        self.rebuild = rebuild
        self.register_buffer("scale", torch.ones(OUT, 1))

    def process_weights_after_loading(self):
        scale = self.weight.abs().amax(-1, keepdim=True) + 1.0
        if self.rebuild:
            self.scale = scale
        else:
            self.scale.copy_(scale)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight) / self.scale.t()


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_forward_calling_a_compiled_function_passes(dynamic, backend):
    torch._dynamo.reset()
    report = check_reload(lambda: CompiledActScale(dynamic, backend), _x(), reloads=RELOADS)
    _clean(report)


def _compiled(rebuild, backend, how):
    def make():
        layer = ScaledLinear(rebuild)
        if how == "method":  # nn.Module.compile(): in place, the names stay
            layer.compile(backend=backend)
            return layer
        return torch.compile(layer, backend=backend)  # an OptimizedModule: names under _orig_mod.

    return make


@pytest.mark.parametrize("how", ["method", "wrapper"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_compiled_module_gets_its_eager_twins_verdicts(backend, how):
    torch._dynamo.reset()
    eager_ok = check_reload(lambda: ScaledLinear(False), _x(), reloads=RELOADS)
    eager_bad = check_reload(lambda: ScaledLinear(True), _x(), reloads=RELOADS)
    assert eager_ok.ok and not eager_bad.ok
    report = check_reload(_compiled(False, backend, how), _x(), reloads=RELOADS)
    assert report.ok, report.table()
    assert not [w for w in _warnings(report) if "op sequence" in w["message"]], report.table()
    bad = check_reload(_compiled(True, backend, how), _x(), reloads=RELOADS)
    assert not bad.ok
    prefix = "_orig_mod." if how == "wrapper" else ""
    assert f"{prefix}scale" in bad.flagged, bad.table()
    assert "op sequence" not in bad.flagged, bad.table()


class PythonDataConstants(torch.nn.Module):
    """A forward that makes tensors from Python data (Mamba's and many
    models' ``torch.tensor(...)``): eager makes them on every call; a graph
    AOTAutograd traced holds each as a constant and copies it
    (``lift_fresh_copy``)."""

    def __init__(self):
        super().__init__()
        self.weight = _param(OUT, IN)

    def forward(self, x):
        return (x @ self.weight.t()) * torch.tensor(2.0) + torch.arange(OUT) * torch.tensor([1])


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_compiled_graphs_constants_are_no_undeclared_reads(backend):
    # Nobody can declare a compiler's constant: a warning asking to would be
    # noise on every model that makes a tensor from Python data.
    torch._dynamo.reset()

    def make():
        layer = PythonDataConstants()
        layer.compile(backend=backend)
        return layer

    report = check_reload(make, _x(), reloads=RELOADS)
    assert report.ok, report.table()
    assert not [w for w in _warnings(report) if "not declared" in w["message"]], report.table()
    assert all(m["undeclared_reads"] == 0 for m in report.modes.values()), report.table()


class SizeFromTheWeights(torch.nn.Module):
    """A forward that slices by a size it reads on the host from what the
    weights computed (as Qwen4-Exp's attention indexer keeps a number of
    blocks): compiled, each new size is a new graph, so the first call of
    one falls inside the check (the capture or a retrace, after a cold load
    aside compiled it for another checkpoint's size)."""

    def __init__(self):
        super().__init__()
        self.weight = _param(OUT, IN)

    def forward(self, x):
        h = x @ self.weight.t()
        n = int((h > 0).sum())
        return h.flatten()[:n].sum().reshape(1) + h.sum(0)


def test_a_graphs_first_call_inside_the_check_is_traced_as_its_later_calls():
    # AOTAutograd runs a graph's first call under a mode that checks custom
    # ops' aliasing (Note [A compiled graph's first call] in compiler.py):
    # seen through it, the capture's ops had copies one level deeper that
    # no later forward makes, and the op sequence "changed" at the sliced op
    # (Qwen4-Exp compiled ended in PyTorch's internal assertion at the replay).
    torch._dynamo.reset()

    def make():
        layer = SizeFromTheWeights()
        layer.compile(backend="aot_eager")
        return layer

    report = check_reload(make, _x(), reloads=RELOADS)
    assert report.ok and not report.errors, report.table()
    messages = [w["message"] for w in _warnings(report) if w["tensor"] == "op sequence"]
    assert messages, report.table()  # the slice's size follows the weights
    assert all("handed other numbers" in m and "(depth" not in m for m in messages), report.table()


def test_a_compiled_graphs_first_call_is_traced_once():
    torch._dynamo.reset()
    double = torch.compile(lambda t: (t * 2).relu(), backend="aot_eager")
    with reloadsafe.trace() as t:
        double(torch.randn(4))  # compiles (untraced), then runs the graph the first time
    assert [(op.name, op.depth) for op in t.ops if op.name in ("aten::mul.Tensor", "aten::relu")] == [
        ("aten::mul.Tensor", 0), ("aten::relu", 0)], t.ops


# --- 2. Tensors a forward makes through a factory ---------------------------
# torch.zeros, torch.arange and torch.zeros_like return a new tensor object on
# the storage the op made, so the captured call's result and the tensor the
# next op reads are different objects over one storage.


class PositionTable(torch.nn.Module):
    """A forward that builds positions and a zero accumulator with
    factories, as a transformer's forward builds its position ids, masks
    and caches."""

    def __init__(self):
        super().__init__()
        self.weight = _param(OUT, IN)
        self.pos = _param(16, OUT)

    def forward(self, x):
        positions = torch.arange(x.shape[0], device=x.device)
        acc = torch.zeros(x.shape[0], OUT, dtype=x.dtype, device=x.device)
        acc += x @ self.weight.t()
        mask = torch.ones_like(acc).triu()
        return acc * mask + self.pos[positions]


def test_a_forward_making_tensors_through_factories_is_replayed():
    report = check_reload(PositionTable, _x(), reloads=RELOADS)
    _clean(report)  # no "not replayed: ... made without an op"


class StalePositionTable(PositionTable):
    """The same forward reading ``pos`` through a copy kept outside the
    module, refilled only at construction: only the replay of the capture
    (and the live forward) see it."""

    def __init__(self):
        super().__init__()
        self.kernel = [self.pos.detach().clone()]

    def process_weights_after_loading(self):
        self.kernel[0] = self.pos.detach().clone()  # rebuilt: the capture keeps the old one

    def forward(self, x):
        positions = torch.arange(x.shape[0], device=x.device)
        return torch.zeros(x.shape[0], OUT) + x @ self.weight.t() + self.kernel[0][positions]


def test_a_stale_read_behind_a_factory_made_tensor_is_flagged():
    report = check_reload(StalePositionTable, _x(), reloads=RELOADS)
    assert not report.ok
    assert "kernel[0]" in report.flagged, report.table()


class MaskedAssignment(torch.nn.Module):
    """A forward that assigns a Python number through a mask, as Gemma 3's
    multimodal forward clears its image tokens (``ids[mask] = 0``): on the
    CPU PyTorch makes the number a tensor with no op, then hands it to
    ``lift_fresh``."""

    def __init__(self):
        super().__init__()
        self.weight = _param(OUT, IN)

    def kernel(self):
        return self.weight

    def forward(self, x):
        out = x @ self.kernel().t()
        out[out < 0] = 0.5
        return out


class StaleMaskedAssignment(MaskedAssignment):
    """The same forward reading its weight through a copy rebuilt at each
    post-processing: the capture keeps reading the old one."""

    def __init__(self):
        super().__init__()
        self.packed = [self.weight.detach().clone()]

    def process_weights_after_loading(self):
        self.packed[0] = self.weight.detach().clone()

    def kernel(self):
        return self.packed[0]


def test_a_python_number_assigned_through_a_mask_is_replayed():
    report = check_reload(MaskedAssignment, _x(), reloads=RELOADS)
    _clean(report)  # no "not replayed: aten::lift_fresh reads a tensor ... made without an op"
    stale = check_reload(StaleMaskedAssignment, _x(), reloads=RELOADS)
    assert "packed[0]" in stale.flagged, stale.table()


# --- 3. Loads judged by what the forward reads -------------------------------
# An engine's loader may leave a parameter padded, packed or already
# quantized: the check must not require each checkpoint tensor to sit on the
# parameter of its name in the checkpoint's shape and dtype.


class PaddedVocab(torch.nn.Module):
    """vLLM's VocabParallelEmbedding: 200 rows loaded into a [256, 64]
    parameter, the padding zeroed by the loader."""

    VOCAB, PADDED = 200, 256

    def __init__(self):
        super().__init__()
        self.weight = _param(self.PADDED, IN)
        self.weight.weight_loader = self._load

    @staticmethod
    def _load(param, loaded):
        param.data[: loaded.shape[0]].copy_(loaded)
        param.data[loaded.shape[0]:].zero_()

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.weight)[:, :, :8].sum(-1)

    @classmethod
    def checkpoint(cls, seed):
        g = torch.Generator().manual_seed(seed)
        return {"weight": torch.randn(cls.VOCAB, IN, generator=g)}


def test_a_padded_load_passes():
    ids = torch.randint(0, PaddedVocab.VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    report = check_reload(PaddedVocab, ids, make_checkpoint=PaddedVocab.checkpoint, reloads=RELOADS)
    _clean(report)


class OnlineQuantized(torch.nn.Module):
    """vLLM's online FP8 quantization: the loader quantizes the float
    checkpoint into the parameter it already holds, transposed, so after
    the load the parameter is float8 [in, out] beside a per-column scale."""

    def __init__(self, rebuild=False):
        super().__init__()
        self.rebuild = rebuild
        self.weight = torch.nn.Parameter(torch.zeros(IN, OUT, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight.weight_loader = self._load
        self.register_buffer("weight_scale", torch.ones(OUT))

    def _load(self, param, loaded):
        scale = loaded.abs().amax(-1).clamp(min=1e-6) / 448.0
        q = (loaded / scale[:, None]).to(torch.float8_e4m3fn).t()
        if self.rebuild:
            param.data = q.contiguous()  # a new storage on every load
        else:
            param.data.copy_(q)
        self.weight_scale.copy_(scale)

    def forward(self, x):
        return (x @ self.weight.to(x.dtype)) * self.weight_scale

    @staticmethod
    def checkpoint(seed):
        g = torch.Generator().manual_seed(seed)
        return {"weight": torch.randn(OUT, IN, generator=g)}


def test_a_load_that_quantizes_in_the_loader_passes_and_its_rebuilt_twin_is_flagged():
    report = check_reload(OnlineQuantized, _x(), make_checkpoint=OnlineQuantized.checkpoint, reloads=RELOADS)
    _clean(report)
    bad = check_reload(lambda: OnlineQuantized(rebuild=True), _x(), make_checkpoint=OnlineQuantized.checkpoint,
                       reloads=RELOADS)
    assert not bad.ok and "weight" in bad.flagged, bad.table()


class PackedNibbles(torch.nn.Module):
    """bitsandbytes' Linear4bit in miniature: the parameter named like the
    checkpoint's float weight holds packed 4-bit codes (uint8 [out*in/2, 1])
    after the load, with the absmax beside it."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(OUT * IN // 2, 1, dtype=torch.uint8), requires_grad=False)
        self.weight.weight_loader = self._load
        self.register_buffer("absmax", torch.ones(OUT))

    def _load(self, param, loaded):
        absmax = loaded.abs().amax(-1).clamp(min=1e-6)
        codes = ((loaded / absmax[:, None]) * 7 + 8).round().clamp(0, 15).to(torch.uint8).reshape(-1, 2)
        param.data.copy_((codes[:, 0] << 4 | codes[:, 1]).reshape(-1, 1))
        self.absmax.copy_(absmax)

    def forward(self, x):
        packed = self.weight.reshape(-1)
        codes = torch.stack([packed >> 4, packed & 15], -1).reshape(OUT, IN).to(x.dtype)
        return x @ (((codes - 8) / 7) * self.absmax[:, None]).t()

    @staticmethod
    def checkpoint(seed):
        g = torch.Generator().manual_seed(seed)
        return {"weight": torch.randn(OUT, IN, generator=g)}


def test_a_load_that_packs_under_the_checkpoints_name_passes():
    report = check_reload(PackedNibbles, _x(), make_checkpoint=PackedNibbles.checkpoint, reloads=RELOADS)
    _clean(report)


def test_a_failing_load_names_the_layout_it_left_as_a_hint():
    class Broken(PackedNibbles):
        def forward(self, x):
            return x @ self.weight.t()  # reads the packed bytes as if they were the float weight

    with pytest.raises(ReloadCheckError) as e:
        check_reload(Broken, _x(), make_checkpoint=PackedNibbles.checkpoint, reloads=RELOADS)
    assert "after load, 'weight' is uint8[1024, 1] where the checkpoint has float32[32, 64]" in str(e.value)


# --- 4. Memory the check's own aside loads leave alive -----------------------


_BUILT: list = []


def _kept_by_a_registry():
    layer = ScaledLinear()
    _BUILT.append(layer)  # vLLM keeps every online-quantized layer in a module-level registry
    return layer


class _RegisteredWhenLoaded(ScaledLinear):
    """A layer its post-processing puts in a module-level registry, as vLLM
    keeps every online-quantized layer it ever loaded: a copy the check makes
    aside is kept too (Note [Layers made aside by copying])."""

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        _BUILT.append(self)


@pytest.mark.parametrize("kept", [_kept_by_a_registry, _RegisteredWhenLoaded], ids=["when-built", "when-loaded"])
def test_layers_a_factory_keeps_alive_are_not_the_reloads_growth(kept):
    # Kept when built: the layers made aside are copies of one as built,
    # which the registry never sees, so only the factory's own are kept.
    # Kept when loaded: every cold load made aside is kept, and a warning
    # says so; in neither case is it the reload's growth.
    _BUILT.clear()
    report = check_reload(kept, _x(), reloads=6)
    try:
        assert report.ok, report.table()
        leaks = [w for w in _warnings(report) if w["tensor"] == "memory"]
        if kept is _RegisteredWhenLoaded:
            assert leaks and "layers built aside" in leaks[0]["message"], report.table()
        else:
            assert len({id(layer) for layer in _BUILT}) <= 2, "the live layers only: a probe is not built twice"
    finally:
        _BUILT.clear()


class InAProfilerBlock(ScaledLinear):
    """A forward inside torch.profiler.record_function, as FSDP2's forward
    opens one: the handle one op makes and a later op closes is the
    forward's own (Note [An object the forward makes] in
    conformance/trace/read_trace.cc)."""

    def forward(self, x):
        with torch.profiler.record_function("scaled_linear"):
            return super().forward(x)


def test_a_forward_inside_record_function_is_checked_as_any_other():
    report = check_reload(InAProfilerBlock, _x(), reloads=4)
    assert report.ok and not _warnings(report), report.table()
    bad = check_reload(lambda: InAProfilerBlock(rebuild=True), _x(), reloads=4)
    assert not bad.ok and "scale" in bad.flagged, bad.table()
    assert not any("undeclared object" in name for name in bad.flagged), bad.table()


class GrowingCache(ScaledLinear):
    """A reload that keeps every post-processed scale it made."""

    def __init__(self):
        super().__init__()
        self.history = []

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        self.history.append(self.scale.clone())


def test_a_reload_that_grows_is_still_flagged_when_the_factory_keeps_layers():
    _BUILT.clear()

    def make():
        layer = GrowingCache()
        _BUILT.append(layer)
        return layer

    try:
        report = check_reload(make, _x(), reloads=6)
        assert not report.ok and "memory" in report.flagged, report.table()
    finally:
        _BUILT.clear()


# --- 5. vLLM's layer conventions ---------------------------------------------


class VllmStyleParameter(torch.nn.Parameter):
    """vLLM's BasevLLMParameter: a Parameter subclass whose constructor takes
    the data and a keyword-only weight loader, which deepcopy cannot call."""

    def __new__(cls, data, *, weight_loader):
        return super().__new__(cls, data, requires_grad=False)

    def __init__(self, data, *, weight_loader):
        self._weight_loader = weight_loader

    @property
    def weight_loader(self):
        return self._weight_loader


def _copy_loader(param, loaded):
    param.data.copy_(loaded)


class QuantMethod:
    """vLLM's QuantizeMethodBase: the post-processing hook is the quant
    method's, called with the layer; here it builds the kernel's scale."""

    def process_weights_after_loading(self, layer):
        layer.cpu_scale = layer.weight.abs().amax(-1) + 1.0


class VllmStyleLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = VllmStyleParameter(torch.zeros(OUT, IN), weight_loader=_copy_loader)
        self.quant_method = QuantMethod()

    def forward(self, x):
        return (x @ self.weight.t()) / self.cpu_scale


def test_a_module_that_cannot_be_deep_copied_is_told_to_pass_a_factory():
    with pytest.raises(TypeError):
        copy.deepcopy(VllmStyleLinear())
    with pytest.raises(ReloadCheckError, match=r"cannot be deep-copied .*pass a factory") as e:
        check_reload(VllmStyleLinear(), _x(), reloads=RELOADS)
    assert "check_reload(lambda: " in str(e.value)


def test_a_quant_methods_post_processing_runs_by_default():
    report = check_reload(VllmStyleLinear, _x(), reloads=RELOADS)
    # The quant method rebinds cpu_scale on every reload: flagged by name,
    # where it used to be an AttributeError from the forward.
    assert not report.ok and "cpu_scale" in report.flagged, report.table()


class InPlaceQuantMethod:
    def process_weights_after_loading(self, layer):
        scale = layer.weight.abs().amax(-1) + 1.0
        if hasattr(layer, "cpu_scale"):
            layer.cpu_scale.copy_(scale)
        else:
            layer.cpu_scale = scale


def test_a_quant_method_that_refills_in_place_passes():
    def make():
        layer = VllmStyleLinear()
        layer.quant_method = InPlaceQuantMethod()  # type: ignore[assignment]
        return layer

    _clean(check_reload(make, _x(), reloads=RELOADS))


# --- compare_state and host numbers on real layers ------------------------------


class Fp8Weight(torch.nn.Module):
    """An FP8 weight compared against a cold load's (compare_state): float8
    has no CPU allclose, which made the comparison an error."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(OUT, IN, dtype=torch.float8_e4m3fn), requires_grad=False)

    def forward(self, x):
        return x @ self.weight.float().t()

    @staticmethod
    def checkpoint(seed):
        g = torch.Generator().manual_seed(seed)
        return {"weight": torch.randn(OUT, IN, generator=g).to(torch.float8_e4m3fn)}


def test_compare_state_compares_float8_tensors():
    report = check_reload(Fp8Weight, _x(), make_checkpoint=Fp8Weight.checkpoint, reloads=RELOADS,
                          compare_state=True)
    assert not report.errors, report.errors
    _clean(report)


class SharedStats:
    """vLLM's quant_config, which every layer it builds shares: online
    quantization adds the time it took to a float no forward reads."""

    seconds = 0.0


SHARED = SharedStats()


class TimedQuantization(ScaledLinear):
    def __init__(self):
        super().__init__()
        self.stats = SHARED

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        self.stats.seconds += 1e-3


def test_a_number_every_layer_shares_is_not_the_layers_state():
    report = check_reload(TimedQuantization, _x(), reloads=RELOADS, host_numbers=True, compare_state=True)
    _clean(report)


class OwnCounter(ScaledLinear):
    """The same number on the layer's own object: the layer's state, and a
    host number a graph may bake in."""

    def __init__(self):
        super().__init__()
        self.stats = SharedStats()

    def process_weights_after_loading(self):
        super().process_weights_after_loading()
        self.stats.seconds += 1e-3


def test_a_number_of_the_layers_own_objects_is_still_compared():
    report = check_reload(OwnCounter, _x(), reloads=RELOADS, host_numbers=True)
    assert not report.ok and "stats.seconds" in report.flagged, report.table()


class TimesItsOwnQuantization(ScaledLinear):
    """The timing on the layer's own object (a quant config built per
    layer): no load decides it, so neither a cold load nor the capture says
    what it should hold."""

    def __init__(self):
        super().__init__()
        self.stats = SharedStats()

    def process_weights_after_loading(self):
        start = time.perf_counter()
        super().process_weights_after_loading()
        self.stats.seconds += time.perf_counter() - start + 1e-9


def test_a_number_no_load_decides_is_not_compared():
    report = check_reload(TimesItsOwnQuantization, _x(), reloads=RELOADS, host_numbers=True, compare_state=True)
    _clean(report)
