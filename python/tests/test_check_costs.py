"""What check_reload does to stay cheap, and that it keeps its checks:
checkpoints drawn from pools (every element changes from seed to seed, never
all by one factor), and collections that traverse only what the check made
(a reference cycle a reload leaves is still collected before the census)."""
import gc

import pytest
import torch

import reloadsafe
from reloadsafe import CheckpointDrawer, check_reload, draw_checkpoint

LAYOUTS = {
    "w": ((64, 48), torch.bfloat16),
    "f32": ((7, 5), torch.float32),
    "fp8": ((16, 16), torch.float8_e4m3fn),
    "i8": ((300,), torch.int8),
    "u8": ((300,), torch.uint8),
    "i64": ((300,), torch.int64),
    "b": ((300,), torch.bool),
    "c": ((9,), torch.complex64),
    "scalar": ((), torch.float32),
}


def _as_float(t):
    return t.float() if t.dtype == torch.float8_e4m3fn else t


def test_checkpoints_keep_layouts_and_are_fresh_tensors():
    draw = CheckpointDrawer(LAYOUTS)
    a, b = draw(1), draw(2)
    for name, (shape, dtype) in LAYOUTS.items():
        for ckpt in (a, b):
            t = ckpt[name]
            assert tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous(), name
        # No two checkpoints (and no checkpoint and the pool) share memory.
        assert a[name].untyped_storage().data_ptr() != b[name].untyped_storage().data_ptr()
    a["f32"].fill_(0)  # writing into one checkpoint changes no other
    assert not torch.equal(draw(1)["f32"], a["f32"])


def test_the_same_seed_gives_the_same_values_and_draw_checkpoint_agrees():
    draw = CheckpointDrawer(LAYOUTS)
    for seed in (0, 1, 1000004, 2**40 + 3):
        one, two, three = draw(seed), draw(seed), draw_checkpoint(LAYOUTS, seed)
        for name in LAYOUTS:
            assert torch.equal(_as_float(one[name]), _as_float(two[name])), (name, seed)
            assert torch.equal(_as_float(one[name]), _as_float(three[name])), (name, seed)


@pytest.mark.parametrize("name", ["w", "f32", "fp8", "i8", "u8", "i64", "c"])
def test_seeds_change_nearly_every_element(name):
    draw = CheckpointDrawer(LAYOUTS)
    seeds = [reloadsafe._C.reload_seed(1, r) for r in range(12)]
    values = [_as_float(draw(s)[name]) for s in seeds]
    for i in range(len(values)):
        for j in range(i):
            same = (values[i] == values[j]).float().mean().item()
            # Integers over a small range coincide by chance (1 in 128 or 256).
            assert same < 0.05, (name, seeds[i], seeds[j], same)


def test_bools_change_about_half_their_elements():
    draw = CheckpointDrawer(LAYOUTS)
    a, b = draw(1)["b"], draw(1000004)["b"]
    assert 0.3 < (a != b).float().mean().item() < 0.7


@pytest.mark.parametrize("name", ["w", "f32", "c"])
def test_no_checkpoint_is_a_multiple_of_another(name):
    # A multiple quantizes to the same bytes: a stale quantized weight would
    # then compute the right output.
    draw = CheckpointDrawer(LAYOUTS)
    a, b = draw(1)[name].to(torch.complex128), draw(1000004)[name].to(torch.complex128)
    ratio = b / a
    assert (ratio - ratio.flatten()[0]).abs().max().item() > 0.1


def test_values_look_drawn_from_their_distribution():
    draw = CheckpointDrawer({"w": ((256, 256), torch.float32), "i": ((4096,), torch.int8)})
    w = draw(5)["w"]
    # A standard normal times a scale in [0.5, 2).
    assert abs(w.mean().item()) < 0.05 and 0.45 < w.std().item() < 2.1
    i = draw(5)["i"]
    assert i.min().item() >= -128 and i.max().item() <= 127 and len(torch.unique(i)) > 200


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(8, 16))
        self.codes = torch.nn.Parameter(torch.zeros(40, dtype=torch.int8), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))

    def forward(self, x):
        return x @ self.w


@pytest.mark.parametrize("seed", [0, 1, reloadsafe._C.reload_seed(1, 3)])
def test_a_python_subject_draws_what_the_cpp_generator_draws_for_the_same_seed(seed):
    # The layer's subject, as check_reload builds it, against the C++
    # functions a C++ subject (BackendSubject::draw_checkpoint) draws with,
    # given the same layouts: one generator, not two that drift.
    from reloadsafe.layer_subject import LayerSubject

    subject = LayerSubject(_Mixed(), torch.zeros(2, 8), None, None, None, None, ("normal",),
                           torch.device("cpu"), None, (), None, 0)
    drawn = subject.draw_checkpoint(seed)
    layouts = {"w": torch.empty(8, 16, device="meta"), "codes": torch.empty(40, dtype=torch.int8, device="meta"),
               "scale": torch.empty(8, dtype=torch.bfloat16, device="meta")}
    cpp = reloadsafe._C.CheckpointPools(layouts).draw(seed)
    assert list(drawn) == ["w", "codes", "scale"]  # the layer's order
    assert sorted(drawn) == sorted(cpp)
    for name, t in cpp.items():
        assert drawn[name].dtype == t.dtype and torch.equal(drawn[name], t), name
    assert drawn["codes"].min().item() < 0 < drawn["codes"].max().item()  # both signs, as int8 weights


def test_empty_layouts():
    ckpt = CheckpointDrawer({"e": ((0, 4), torch.float32)})(3)
    assert tuple(ckpt["e"].shape) == (0, 4)


class _CycleEachReload(torch.nn.Module):
    """Keeps the weight's address, but every post-processing leaves a
    reference cycle that holds a new storage: garbage only a collection
    frees."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(64, 64), requires_grad=False)

    def process_weights_after_loading(self):
        junk = {"storage": self.weight.detach() * 2}
        junk["self"] = junk  # a cycle: freed by the collector, not by reference counts

    def forward(self, x):
        return torch.mm(x, self.weight.t())


def test_a_cycle_a_reload_leaves_is_collected_before_the_census():
    report = check_reload(_CycleEachReload, torch.randn(4, 64), reloads=4)
    assert report.ok, report.table()
    for mode in reloadsafe.MODES:
        memory = report.modes[mode]["memory_bytes"]
        assert memory[1] == memory[-1], memory


def test_the_callers_gc_state_is_left_as_it_was():
    assert gc.get_freeze_count() == 0
    check_reload(_CycleEachReload, torch.randn(4, 64), reloads=1)
    assert gc.get_freeze_count() == 0
    # A caller that froze objects keeps its freeze (and the check still works):
    # what it froze is still out of every generation a collection walks. (The
    # freeze count alone cannot tell: it also falls when a frozen object dies,
    # as the entries torch 2.15's thread-local config replaces when a check
    # sets it.)
    keep: list[list[object]] = [[] for _ in range(10)]
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        assert check_reload(_CycleEachReload, torch.randn(4, 64), reloads=1).ok
        assert gc.get_freeze_count() > 0
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(k) in walked for k in [keep, *keep])
    finally:
        gc.unfreeze()
    del keep


# Note [Crossings per reload]
# The protocol runs in C++ and asks a Python layer only for the subject's
# primitives (conformance/harness/subject.h): a load, a post-processing, a
# forward, what the layer holds by name, a sleep. Per reload, over both
# modes: the live layer's load, post-processing and forward in each mode
# (2 each), one cold load of the checkpoint with its forward, on a copy of
# the layer as built (Note [Layers made aside by copying] in
# conformance/harness/layer_life.h; the second mode reuses its output:
# cold_loads.h), one checkpoint drawn per mode, and
# the live layer's named tensors once per mode (the address check). A step
# adds what it needs: compare_state both modes' live state and one cold
# layer's (the second mode matches the first's digest: Note [A cold state
# kept as its digest] in cold_loads.h), tensors, numbers and module caches,
# and no layer of its own (that cold layer is the one whose forward the
# forward check takes: Note [One cold layer per reload]); sleep the buffers
# to restore and the sleep itself. A crossing more is a rule that moved back into Python or
# a step asking twice; the rows say where.
_HANDLE = ("load", "process", "forward", "named_tensors", "named_objects", "named_numbers",
           "parameters", "buffers", "sleep_and_wake")
_SUBJECT = ("info", "draw_checkpoint", "draw_input", "new_layer", "copy_of_new_layer", "cache_tensors",
            "empty_caches", "restore_caches")
_DEFAULT = {"load": 3, "process": 3, "forward": 3, "named_tensors": 2, "draw_checkpoint": 2,
            "copy_of_new_layer": 1, "empty_caches": 1, "restore_caches": 1}


@pytest.mark.parametrize(
    "steps,per_reload",
    [
        ({}, _DEFAULT),
        ({"compare_state": True},
         {**_DEFAULT, "named_tensors": 5, "named_numbers": 3, "cache_tensors": 3}),
        ({"sleep": 2},
         {**_DEFAULT, "named_tensors": 4, "buffers": 2, "sleep_and_wake": 2, "cache_tensors": 2}),
    ],
    ids=["default", "compare_state", "sleep"],
)
def test_a_reload_crosses_into_python_only_for_the_subjects_primitives(monkeypatch, steps, per_reload):
    from reloadsafe import layer_subject

    from sample_layers import Transposed

    counts: dict[str, int] = {}

    def counted(cls, name):
        method = getattr(cls, name)

        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return method(*args, **kwargs)

        monkeypatch.setattr(cls, name, call)

    for name in _HANDLE:
        counted(layer_subject.LayerHandle, name)
    for name in _SUBJECT:
        counted(layer_subject.LayerSubject, name)

    def crossings(reloads):
        counts.clear()
        report = check_reload(Transposed, torch.randn(4, 32), reloads=reloads, **steps)
        assert report.ok, report
        return dict(counts)

    # The difference of two runs is what one reload costs; what a run does
    # once (its start, the capture, the checks of the first reload) cancels.
    few, more = crossings(2), crossings(6)
    measured = {name: (more.get(name, 0) - few.get(name, 0)) / 4 for name in set(few) | set(more)}
    assert {k: v for k, v in measured.items() if v} == per_reload
