"""check_reload runs with the C++ protocol's defaults and seed rule
(conformance/harness/run_options.h), which reloadsafe._C exposes: the
default number of reloads and the seed of every reload's checkpoint."""
from __future__ import annotations

import inspect

import torch

import reloadsafe
from reloadsafe import check_reload

_C = reloadsafe._C


def test_check_reloads_default_is_the_protocols():
    default = inspect.signature(check_reload).parameters["reloads"].default
    assert default == _C.DEFAULT_RELOADS
    assert _C.RunOptions().reloads == _C.DEFAULT_RELOADS


def test_reload_seeds_are_distinct_and_start_from_the_runs_seed():
    for seed in (0, 1, 5, 2**40 + 3):
        seeds = [_C.reload_seed(seed, r) for r in range(_C.DEFAULT_RELOADS + 1)]
        assert seeds[0] == seed, seed
        assert len(set(seeds)) == len(seeds), seeds


def test_a_runs_checkpoints_come_from_its_seed_by_the_rule():
    drawn: list[int] = []

    def make_checkpoint(seed: int) -> dict[str, torch.Tensor]:
        drawn.append(seed)
        return {"weight": torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))}

    # A linear layer without bias: make_checkpoint names all its weights.
    report = check_reload(lambda: torch.nn.Linear(8, 4, bias=False), torch.randn(2, 8),
                          make_checkpoint=make_checkpoint, reloads=3, seed=5)
    assert report.ok, report.table()
    # check_reload's own probes draw first; from the run's first draw on,
    # the cold load's checkpoint comes from the run's seed and reload r's
    # from reload_seed, and nothing else is drawn.
    run = drawn[drawn.index(5):]
    assert set(run) == {5} | {_C.reload_seed(5, r) for r in (1, 2, 3)}, drawn
