"""check_reload on layers built the way backends build them (real_layers.py):
each natural post-processing that quantizes or packs anew on every reload is
flagged by the name of what moved (an inner tensor of a subclass, a packed
object), each in-place variant passes with no violation and no warning, and
a raw-pointer read the trace cannot see is flagged by its output."""
import importlib.util
import warnings

import pytest
import torch

import reloadsafe
from reloadsafe import check_reload

import real_layers as rl

RELOADS = 4


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    # torch.ao's quantize_dynamic and torchao warn about their own futures on
    # every call; nothing here depends on those warnings.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.ao")
        yield


def _input(seed=0):
    return torch.randn(*rl.INPUT_SHAPE, generator=torch.Generator().manual_seed(seed))


def _check(cls, **kw):
    return check_reload(cls, _input(), reloads=kw.pop("reloads", RELOADS), **kw)


@pytest.mark.parametrize("cls", rl.REBUILT, ids=lambda c: c.__name__)
def test_rebuilt_on_every_reload_is_flagged_by_what_moved(cls):
    rl.need(cls)
    report = _check(cls)
    assert not report.ok, report.table()
    assert not report.errors, report.errors
    flagged = report.flagged
    assert any(f.startswith(cls.expected) for f in flagged), (cls.expected, flagged, report.table())
    for name in cls.expected_all:
        assert name in flagged, (name, flagged, report.table())
    for mode in report.modes.values():
        assert mode["violation_count"] > 0 and mode["reloads_done"] == RELOADS, mode
    # Declared as a negative control, the same run is detected.
    assert _check(cls, expect_violation=cls.expected).ok


@pytest.mark.parametrize("cls", [rl.FbgemmPrepackRebuilt, rl.QuantizeDynamicRebuilt], ids=lambda c: c.__name__)
def test_a_repacked_fbgemm_object_is_a_replaced_object_at_its_op_and_argument(cls):
    report = _check(cls)
    for name, mode in report.modes.items():
        replaced = [v for v in mode["violations"] if v["what"] == "object replaced"]
        assert len(replaced) >= RELOADS, (name, report.table())  # one per reload at least
        for v in replaced:
            assert v["tensor"] == cls.expected_all[0], v
            assert v["read"] == f"{rl.LINEAR_DYNAMIC} arg 1 (W_prepack)", v
            assert "LinearPackedParamsBase@" in v["before"] and v["before"] != v["after"], v


@pytest.mark.parametrize("cls", rl.IN_PLACE, ids=lambda c: c.__name__)
def test_refilled_in_place_passes_with_no_violation_and_no_warning(cls):
    rl.need(cls)
    report = _check(cls)
    assert report.ok, report.table()
    for name, mode in report.modes.items():
        assert mode["violations"] == [] and mode["flagged"] == [], (name, report.table())
        assert mode["warnings"] == [], (name, mode["warnings"])
        assert "error" not in mode, (name, mode.get("error"))
        assert mode["reloads_done"] == RELOADS
        assert mode["undeclared_reads"] == 0, (name, report.table())
        assert mode["declared_reads"] >= 1


# The harness steps on the in-place layers: each passes with its forward
# state compared after the forward, with its host numbers held, after sleep
# level 1 (parameters and buffers restored, a subclass through its inner
# tensors) and with its parameters re-created; a false alarm here would be
# one on a correct layer of a real library.
_STEPS: dict[str, dict[str, bool | int]] = {
    "forward state and host numbers": {"compare_forward_state": True, "host_numbers": True},
    "sleep 1": {"sleep": 1},
    "recreated parameters": {"recreate_parameters": True},
}


@pytest.mark.parametrize("steps", list(_STEPS), ids=list(_STEPS))
@pytest.mark.parametrize("cls", rl.IN_PLACE, ids=lambda c: c.__name__)
def test_refilled_in_place_passes_the_harness_steps(cls, steps):
    rl.need(cls)
    report = _check(cls, reloads=3, **_STEPS[steps])
    assert report.ok, report.table()


def test_compare_state_names_what_the_first_forward_repacked_and_compare_forward_state_does_not():
    """Its first forward repacks the loaded codes in place: a cold load
    without a forward holds them unpacked, so compare_state names them on a
    correct layer; compare_forward_state compares with a cold load that ran
    its forward too."""
    rl.need(rl.FirstForwardRepackInPlace)
    report = _check(rl.FirstForwardRepackInPlace, reloads=2, compare_state=True)
    assert "qweight" in report.flagged, report.table()
    assert _check(rl.FirstForwardRepackInPlace, reloads=2, compare_forward_state=True).ok


# The fbgemm "kept" variants add a fixed projection of their own, so they
# compute something else than their rebuilt counterparts.
_SAME_FORWARD = [(r, k) for r, k in rl.PAIRS if k not in (rl.FbgemmPrepackKept, rl.QuantizeDynamicKept)]


@pytest.mark.parametrize("pair", _SAME_FORWARD, ids=lambda p: p[0].__name__)
def test_the_in_place_and_rebuilt_variants_compute_the_same_forward(pair):
    """The variants differ only in where their tensors live: after a load, a
    forward and a second load of one checkpoint both give the same output
    (so a pass is not a pass of a different computation)."""
    rl.need(pair[0])
    x = _input()
    outs = []
    for cls in pair:
        layer = cls()
        ckpt = reloadsafe.draw_checkpoint(reloadsafe.loading.checkpoint_layouts(layer), 3)
        with torch.no_grad():
            reloadsafe.load_checkpoint(layer, reloadsafe.draw_checkpoint(reloadsafe.loading.checkpoint_layouts(layer), 2))
            layer.process_weights_after_loading()
            layer(x)  # a first forward, as a warm-up would
            reloadsafe.load_checkpoint(layer, ckpt)
            layer.process_weights_after_loading()
            outs.append(layer(x))
    torch.testing.assert_close(outs[0], outs[1])


def test_first_forward_repack_model_computes_what_bitsandbytes_dequantizes():
    """The first-forward repack model reads the same NF4 weight that
    bitsandbytes' own dequantize_4bit gives."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bnbf

    w = torch.randn(rl.OUT, rl.IN, generator=torch.Generator().manual_seed(5))
    q, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4")
    packed, absmax_t = rl._repack_for_cpu(q, state.absmax)
    assert packed.data_ptr() != q.data_ptr()
    torch.testing.assert_close(rl._unpack_for_cpu(packed, absmax_t, state.code), bnbf.dequantize_4bit(q, state))


def test_first_forward_state_kept_is_part_of_the_baseline():
    """The in-place repack layer's first forward rebinds its weight (as
    Linear4bit's does on AVX512-BF16 CPUs); a graph is captured after that,
    so the repacked tensors are the baseline and nothing is flagged."""
    pytest.importorskip("bitsandbytes")
    layer = rl.FirstForwardRepackInPlace()
    ckpt = reloadsafe.draw_checkpoint(reloadsafe.loading.checkpoint_layouts(layer), 1)
    with torch.no_grad():
        reloadsafe.load_checkpoint(layer, ckpt)
        layer.process_weights_after_loading()
        before = layer.qweight.data_ptr()
        layer(_input())
    assert layer.qweight.data_ptr() != before  # the first forward moved it
    report = _check(rl.FirstForwardRepackInPlace)
    assert report.ok, report.table()


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes (not in this environment: pip install it; the main test environment tools/setup.sh makes has it)"
)
def test_real_linear4bit_first_forward_repack_where_the_cpu_has_it():
    """On a CPU with AVX512-BF16 bitsandbytes' own Linear4bit repacks its
    weight in the first forward; there the in-place variant must pass and
    the rebuilt one be flagged with the real repack. Elsewhere the layer
    never repacks and the model above stands in for it."""
    import bitsandbytes.functional as bnbf

    if not bnbf.has_avx512bf16():
        pytest.skip("this CPU has no AVX512-BF16: Linear4bit does not repack here (FirstForwardRepack* model it)")
    layer = rl.BnbLinear4bitInPlace()
    ckpt = reloadsafe.draw_checkpoint(reloadsafe.loading.checkpoint_layouts(layer), 1)
    with torch.no_grad():
        reloadsafe.load_checkpoint(layer, ckpt)
        layer.process_weights_after_loading()
        layer.eval()  # as an engine's loader leaves it: Linear4bit repacks only in inference
        layer(_input())
    assert rl.first_forward_repacked(layer.lin)
    assert _check(rl.BnbLinear4bitInPlace).ok
    assert not _check(rl.BnbLinear4bitRebuilt).ok


def test_raw_pointer_read_is_flagged_by_the_forward_every_time():
    """A kernel object reads a re-created weight copy through a raw pointer
    (ctypes), which no trace sees: the freed copy is poisoned while the check
    runs, so the forward (and the replay) differ from a fresh cold load in
    every run, not only when the allocator happens to reuse the memory."""
    for _ in range(3):
        report = _check(rl.RawPointerKernel)
        assert not report.ok, report.table()
        assert set(report.flagged) & {"forward", "replay"}, (report.flagged, report.table())
        for mode in report.modes.values():
            assert mode["violation_count"] >= RELOADS, report.table()  # every reload, not some
    assert _check(rl.RawPointerKernel, expect_violation="forward").ok
