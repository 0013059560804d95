"""check_reload(sleep=1 or 2, module_caches=...): the layer sleeps and wakes
before every reload, as an engine's sleep mode does; state outside what wake
restores comes back as garbage and shows, by name with compare_state. An
engine's own sleep helper (sleep=function) runs instead of the emulation,
and the host memory it keeps is counted."""
from typing import Any

import pytest
import torch

import reloadsafe
from reloadsafe import ReloadCheckError, check_reload
from reloadsafe.sleep import caches_emptied, discard

import sample_layers as sl

X = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))


class ScaleAttribute(torch.nn.Module):
    """A scale made at the first load as a plain attribute, never rewritten."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.scale: Any = None

    def process_weights_after_loading(self):
        if self.scale is None:
            self.scale = torch.full((1,), 0.5, device=self.weight.device)

    def forward(self, x):
        return torch.mm(x, self.weight.t()) * self.scale


class ScaleBuffer(ScaleAttribute):
    """The same scale as a registered buffer: wake restores it."""

    def __init__(self):
        super().__init__()
        del self.scale
        self.register_buffer("scale", torch.full((1,), 0.5))


def _slice_loader(p, loaded):
    p.data[:, :16].copy_(loaded[:, :16])


class PaddedWeight(torch.nn.Module):
    """A weight whose loader writes only the real columns; the pad is zero
    from construction and read by the forward."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 20)
        self.weight.weight_loader = _slice_loader

    def forward(self, x):
        return torch.mm(torch.nn.functional.pad(x, (0, 4), value=1.0), self.weight.t())


_CACHE: dict = {}


class GlobalCache(torch.nn.Module):
    """Post-processing reads a permutation from a module-level cache."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.register_buffer("permuted", torch.zeros(8, 16), persistent=False)

    def process_weights_after_loading(self):
        if "perm" not in _CACHE:
            _CACHE["perm"] = torch.arange(15, -1, -1, device=self.weight.device)
        self.permuted.copy_(self.weight.index_select(1, _CACHE["perm"]))

    def forward(self, x):
        return torch.mm(x, self.permuted.t())


def test_state_outside_what_wake_restores_is_garbage_after_sleep():
    assert check_reload(ScaleAttribute, X, reloads=3).ok
    slept = check_reload(ScaleAttribute, X, reloads=3, sleep=2)
    assert {"forward", "replay"} <= set(slept.flagged), slept.table()
    named = check_reload(ScaleAttribute, X, reloads=3, sleep=2, compare_state=True)
    assert "scale" in named.flagged, named.table()


class TilesFromTheFirstForward(torch.nn.Module):
    """A table the first forward makes and later ones only read."""

    def __init__(self):
        super().__init__()
        self.weight = sl._param(8, 16)
        self.tiles: Any = None

    def forward(self, x):
        if self.tiles is None:
            self.tiles = torch.arange(8.0, device=x.device)
        return torch.mm(x, self.weight.t()) + self.tiles


def test_level_1_restores_all_the_cold_load_made_and_loses_what_a_forward_made():
    # The scale post-processing made at the cold load comes back at level 1,
    # as the weights' memory does in vLLM's level 1.
    assert check_reload(ScaleAttribute, X, reloads=3, sleep=1, compare_state=True).ok
    # The table the warm-up forward made does not.
    report = check_reload(TilesFromTheFirstForward, X, reloads=3, sleep=1, compare_forward_state=True)
    assert "tiles" in report.flagged and "forward" in report.flagged, report.table()
    assert check_reload(TilesFromTheFirstForward, X, reloads=3, compare_forward_state=True).ok


def test_registered_buffers_come_back_on_wake():
    for level in (1, 2):
        report = check_reload(ScaleBuffer, X, reloads=3, sleep=level, compare_state=True)
        assert report.ok, report.table()


def test_level_2_discards_what_the_loader_does_not_write_and_level_1_restores_it():
    assert check_reload(PaddedWeight, X, reloads=3, sleep=1).ok
    report = check_reload(PaddedWeight, X, reloads=3, sleep=2, compare_state=True)
    assert "weight" in report.flagged and "forward" in report.flagged, report.table()


def test_a_module_cache_is_slept_named_and_emptied_for_the_reference():
    _CACHE.clear()
    assert check_reload(GlobalCache, X, reloads=3, sleep=2).ok  # the check does not see the cache
    before = dict(_CACHE)
    report = check_reload(GlobalCache, X, reloads=3, sleep=2, compare_state=True,
                          module_caches={"_CACHE": _CACHE})
    assert "_CACHE['perm']" in report.flagged and "permuted" in report.flagged, report.table()
    # The reference forward was right: the live forward is what differs.
    assert "forward" in report.flagged
    # Each mode started from an empty cache, and the process got back its
    # cache as it was, not the garbage the check's sleeps left in it.
    assert list(_CACHE) == list(before) and all(_CACHE[k] is before[k] for k in before)
    assert torch.equal(_CACHE["perm"], torch.arange(15, -1, -1))


@pytest.mark.parametrize("cls", sl.SAMPLES, ids=lambda c: c.__name__)
def test_correct_layers_pass_after_sleep(cls):
    x = torch.randn(*cls.input_shape, generator=torch.Generator().manual_seed(0))
    modes = getattr(cls, "modes", reloadsafe.MODES)
    report = check_reload(cls, x, reloads=3, modes=modes, sleep=2, compare_state=True)
    assert report.ok, report.table()


def test_discard_fills_the_whole_storage():
    base = torch.arange(12, dtype=torch.float32)
    view = base[2:5]
    discard(view)
    assert base.isnan().all()
    ints = torch.arange(6)
    discard(ints[1:2])
    assert (ints == 0).all()


def test_caches_emptied_puts_the_contents_back_and_says_what_the_block_left():
    cache = {"a": torch.ones(1)}
    with caches_emptied({"c": cache}) as seen:
        assert cache == {}
        cache["b"] = torch.zeros(1)
    assert list(cache) == ["a"] and list(seen["c"]) == ["b"]


@pytest.mark.parametrize("level", [0, 3, True, "2", 1.5])
def test_sleep_takes_level_1_or_2(level):
    with pytest.raises(ReloadCheckError, match="sleep must be one of"):
        check_reload(ScaleBuffer, X, reloads=1, sleep=level)


class _HostBackups:
    """An engine's sleep helper that keeps a host copy of every parameter
    while the layer sleeps. ``keep_every_cycle``: each cycle's copies are
    kept in a list nothing clears (the leak); otherwise one copy per
    parameter is reused."""

    def __init__(self, keep_every_cycle: bool) -> None:
        self.keep_every_cycle = keep_every_cycle
        self.cycles: list[list[torch.Tensor]] = []
        self.calls = 0

    def __call__(self, layer: torch.nn.Module) -> None:
        self.calls += 1
        params = list(layer.parameters())
        if self.keep_every_cycle or not self.cycles:
            self.cycles.append([p.detach().to("cpu", copy=True) for p in params])
        else:
            for host, p in zip(self.cycles[-1], params, strict=True):
                host.copy_(p.detach())
        for p in params:
            discard(p)  # asleep: the device pages are gone
        for host, p in zip(self.cycles[-1], params, strict=True):
            p.detach().copy_(host)  # wake: back from the newest host copy


def test_an_engines_own_sleep_runs_before_every_reload_in_place_of_the_emulation():
    own = _HostBackups(keep_every_cycle=False)
    # ScaleAttribute fails the emulated sleep (its scale is garbage after
    # it); the helper here restores only parameters and never touches the
    # attribute, so it passes: the emulation did not run.
    report = check_reload(ScaleAttribute, X, reloads=3, sleep=own, compare_state=True)
    assert report.ok, report.table()
    assert own.calls == 2 * 3  # once per reload, in each mode


def test_host_copies_an_engines_sleep_keeps_every_cycle_are_memory_growth():
    leaky = check_reload(ScaleBuffer, X, reloads=4, sleep=_HostBackups(keep_every_cycle=True))
    assert not leaky.ok
    for mode in reloadsafe.MODES:
        assert "memory" in leaky.modes[mode]["flagged"], leaky.table()
    # The leak alone: without the helper's copies the layer passes.
    assert check_reload(ScaleBuffer, X, reloads=4, sleep=_HostBackups(keep_every_cycle=False)).ok
