"""check_ranks (reloadsafe/ranks.py): check_reload on every rank of a gloo
world on the CPU, 2 and 4 ranks. Layers sharded as an engine shards them
(each rank's loader narrows the full checkpoint to its rows or columns), a
trainer's FSDP2 state gathered and pushed into them as RL frameworks sync;
a bug on one rank named with its rank; a rank that raises, dies or hangs
ends the check with an error that says which."""
from __future__ import annotations

import os
import time

import pytest
import torch

import reloadsafe
from reloadsafe import ReloadCheckError, check_ranks, check_reload

OUT, IN = 8, 16
RELOADS = 3
#: 2 and 4 ranks; a world of processes takes a few seconds to start.
WORLDS = [2, 4]


def _full_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    return reloadsafe.draw_checkpoint({"weight": ((OUT, IN), torch.float32)}, seed)


class ColumnShard(torch.nn.Module):
    """Rows rank * OUT / world_size on of the full weight, as a column-parallel
    linear holds them; its loader narrows the full checkpoint tensor to them.
    With ``rebinds``, its post-processing binds a new tensor (the bug)."""

    def __init__(self, rank: int, world_size: int, rebinds: bool = False) -> None:
        super().__init__()
        self.rank, self.world_size, self.rebinds = rank, world_size, rebinds
        rows = OUT // world_size
        self.weight = torch.nn.Parameter(torch.empty(rows, IN), requires_grad=False)
        self.weight.weight_loader = self.load_shard

    def load_shard(self, param: torch.Tensor, full: torch.Tensor) -> None:
        rows = param.shape[0]
        param.data.copy_(full.narrow(0, self.rank * rows, rows))

    def process_weights_after_loading(self) -> None:
        if self.rebinds:
            self.weight = torch.nn.Parameter(self.weight.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()  # the rank's columns of the output, no gather


class RowShard(ColumnShard):
    """Columns of the full weight (a row-parallel linear): the forward's
    partial sum, before the all-reduce an engine adds."""

    def __init__(self, rank: int, world_size: int, rebinds: bool = False) -> None:
        torch.nn.Module.__init__(self)
        self.rank, self.world_size, self.rebinds = rank, world_size, rebinds
        self.weight = torch.nn.Parameter(torch.empty(OUT, IN // world_size), requires_grad=False)
        self.weight.weight_loader = self.load_shard

    def load_shard(self, param: torch.Tensor, full: torch.Tensor) -> None:
        cols = param.shape[1]
        param.data.copy_(full.narrow(1, self.rank * cols, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = self.weight.shape[1]
        return x.narrow(1, self.rank * cols, cols) @ self.weight.t()


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, IN, generator=torch.Generator().manual_seed(seed))


# The ranks' checks: at module level, so that each rank imports them.


def check_columns(rank: int, world_size: int):
    return check_reload(lambda: ColumnShard(rank, world_size), _x, make_checkpoint=_full_checkpoint,
                        reloads=RELOADS, name="ColumnShard")


def check_rows(rank: int, world_size: int):
    return check_reload(lambda: RowShard(rank, world_size), _x, make_checkpoint=_full_checkpoint,
                        reloads=RELOADS, name="RowShard")


def check_columns_rank1_rebinds(rank: int, world_size: int):
    return check_reload(lambda: ColumnShard(rank, world_size, rebinds=rank == 1), _x,
                        make_checkpoint=_full_checkpoint, reloads=RELOADS, name="ColumnShard")


def check_rank1_raises(rank: int, world_size: int):
    if rank == 1:
        raise RuntimeError("rank 1's layer cannot be built")
    return check_columns(rank, world_size)


def check_rank1_dies(rank: int, world_size: int):
    if rank == 1:
        os._exit(3)
    return check_columns(rank, world_size)


def check_rank1_hangs(rank: int, world_size: int):
    if rank == 1:
        time.sleep(600)
    return check_columns(rank, world_size)


def check_returns_nothing(rank: int, world_size: int):
    return None


@pytest.mark.parametrize(
    "check,world_size",
    [(check_columns, 2), (check_rows, 2), (check_columns, 4)],
    ids=["column-2", "row-2", "column-4"],
)
def test_every_rank_of_a_correctly_sharded_layer_passes(check, world_size):
    report = check_ranks(check, world_size, timeout=300)
    assert report.ok, report.table()
    assert [r.rank for r in report.ranks] == list(range(world_size))
    assert f"rank {world_size - 1} of {world_size}: pass" in report.table()


@pytest.mark.parametrize("world_size", WORLDS)
def test_a_bug_on_one_rank_is_named_with_its_rank(world_size):
    report = check_ranks(check_columns_rank1_rebinds, world_size, timeout=300)
    assert not report.ok
    assert list(report.flagged) == [1] and "weight" in report.flagged[1], report.table()
    assert "rank 1 of" in report.table() and "FAIL" in report.table()
    with pytest.raises(reloadsafe.ReloadViolation):
        report.raise_for_violations()


@pytest.mark.parametrize(
    "check,says",
    [
        (check_rank1_raises, "rank 1's check raised:.*rank 1's layer cannot be built"),
        (check_rank1_dies, r"rank 1 died \(exit code 3\)"),
        (check_returns_nothing, "the check returned NoneType, not a ReloadReport"),
    ],
    ids=["raises", "dies", "returns-nothing"],
)
def test_a_rank_that_raises_or_dies_is_an_error_naming_it(check, says):
    with pytest.raises(ReloadCheckError, match=f"(?s){says}"):
        check_ranks(check, 2, timeout=300)


def test_a_rank_that_hangs_is_stopped_and_named_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(ReloadCheckError, match=r"(?s)rank 1 did not finish within 20 s; where it was:.*in check_rank1_hangs"):
        check_ranks(check_rank1_hangs, 2, timeout=20)
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("world_size", [0, 1.5, True])
def test_a_world_size_that_is_no_whole_number_is_refused(world_size):
    with pytest.raises(ReloadCheckError, match="world_size must be a whole number"):
        check_ranks(check_columns, world_size)


# --- a trainer's FSDP2 state, gathered and pushed into an engine's shards ----


def _seeds(seed: int = 1) -> list[int]:
    """The checkpoint seeds check_reload draws with (its cold load's, then
    each reload's)."""
    # and seed 0: check_reload draws it once to learn what every checkpoint holds
    return [0, seed] + [reloadsafe._C.reload_seed(seed, r) for r in range(1, RELOADS + 1)]


def _gathered_trainer_states(world_size: int) -> dict[int, dict[str, torch.Tensor]]:
    """For each of the check's seeds, what an RL trainer pushes: its model
    (a linear sharded by FSDP2 over the world) trained to that seed's weights
    (each rank writing its own shard), then gathered whole (full_tensor, an
    all-gather), as a weight sync gathers it before pushing."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    trainer = torch.nn.Linear(IN, OUT, bias=False)
    fully_shard(trainer, mesh=mesh)
    out = {}
    for seed in _seeds():
        full = _full_checkpoint(seed)["weight"]
        local = trainer.weight.to_local()
        rows = local.shape[0]
        with torch.no_grad():
            local.copy_(full.narrow(0, torch.distributed.get_rank() * rows, rows))
        out[seed] = {"weight": trainer.weight.full_tensor().detach().clone()}
    return out


def _sync_into(gathered, assign: bool):
    def load(layer: ColumnShard, ckpt: dict[str, torch.Tensor]) -> None:
        shard = ckpt["weight"].narrow(0, layer.rank * layer.weight.shape[0], layer.weight.shape[0])
        if assign:  # the sync binds the pushed tensor (the bug RL frameworks shipped)
            layer.weight = torch.nn.Parameter(shard.clone(), requires_grad=False)
        else:
            layer.weight.copy_(shard)
    return load


def check_trainer_sync(rank: int, world_size: int):
    gathered = _gathered_trainer_states(world_size)
    return check_reload(lambda: ColumnShard(rank, world_size), _x, load=_sync_into(gathered, assign=False),
                        make_checkpoint=lambda seed: gathered[seed], reloads=RELOADS, name="synced")


def check_trainer_sync_assigns(rank: int, world_size: int):
    gathered = _gathered_trainer_states(world_size)
    return check_reload(lambda: ColumnShard(rank, world_size), _x, load=_sync_into(gathered, assign=True),
                        make_checkpoint=lambda seed: gathered[seed], reloads=RELOADS, name="synced")


@pytest.mark.parametrize("world_size", WORLDS)
def test_a_trainers_gathered_state_pushed_into_the_engines_shards(world_size):
    report = check_ranks(check_trainer_sync, world_size, timeout=300)
    assert report.ok, report.table()
    bad = check_ranks(check_trainer_sync_assigns, world_size, timeout=300)
    assert sorted(bad.flagged) == list(range(world_size)), bad.table()
    assert all("weight" in names for names in bad.flagged.values()), bad.table()
