"""Checks across ranks: ``check_reload`` on every rank of a real
``torch.distributed`` world on the CPU, one report with each rank's verdict.

An engine runs its layers sharded over ranks: each rank's weight loader
narrows the checkpoint to its shard, and a trainer's state reaches every
rank of the engine. ``check_ranks`` starts a world of processes (gloo), runs
a check function on each rank and gathers their reports::

    def check(rank, world_size):  # at module level: each rank imports it
        return reloadsafe.check_reload(lambda: ColumnShard(rank, world_size), x,
                                       make_checkpoint=full_checkpoint)

    report = reloadsafe.check_ranks(check, world_size=2)
    assert report.ok, report.table()

Each rank's check runs on its own: its loads and forwards must not wait on
other ranks (a loader narrows by rank; a forward computes the rank's part,
without the all-reduce an engine adds after it), because how many loads and
forwards a check makes follows what it finds on that rank. What gathers
across ranks (a trainer's sharded state, an all-gather) runs in the check
function before ``check_reload``.

A rank that raises, dies or does not finish within ``timeout`` ends the
check with a ``ReloadCheckError`` naming it, with the end of what it printed
(for a rank that hung, where each of its threads was), and the verdicts of
the ranks that finished.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from .errors import ReloadCheckError, ReloadViolation

__all__ = ["RankResult", "RanksReport", "check_ranks"]

#: What a rank's check is: (rank, world size) -> a ReloadReport.
RankCheck = Callable[[int, int], Any]

#: Seconds the other ranks get to finish once one raised or died.
_GRACE = 10.0


@dataclasses.dataclass(frozen=True)
class RankResult:
    """One rank's verdict, as its check reported it."""

    rank: int
    ok: bool
    flagged: list[str]
    errors: list[str]
    table: str


class RanksReport:
    """The verdicts of every rank of a ``check_ranks`` world, in rank order.
    ``ok`` when every rank's check is."""

    def __init__(self, ranks: list[RankResult]) -> None:
        self.ranks = ranks

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.ranks)

    @property
    def flagged(self) -> dict[int, list[str]]:
        """Per rank, what its check flagged (ranks that flagged nothing left out)."""
        return {r.rank: r.flagged for r in self.ranks if r.flagged}

    def table(self) -> str:
        """Each rank's table, under its rank."""
        out = []
        for r in self.ranks:
            out.append(f"rank {r.rank} of {len(self.ranks)}: {'pass' if r.ok else 'FAIL'}\n")
            out.extend(f"  {line}\n" for line in r.table.rstrip("\n").splitlines())
        return "".join(out)

    def raise_for_violations(self) -> RanksReport:
        """Raises ``ReloadViolation`` with the table unless ``ok``."""
        if not self.ok:
            raise ReloadViolation(self.table(), self)
        return self

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<RanksReport ranks={len(self.ranks)} ok={self.ok}>"


def check_ranks(check: RankCheck, world_size: int, *, timeout: float = 600.0,
                backend: str = "gloo") -> RanksReport:
    """Runs ``check(rank, world_size)`` on every rank of a new world of
    ``world_size`` processes (``torch.distributed`` initialised with
    ``backend`` over a local TCP store, one intra-op thread each) and returns
    their verdicts. ``check`` must be importable by the ranks (a function at
    a module's top level) and return the rank's ``ReloadReport``.

    Raises ``ReloadCheckError`` naming each rank that raised, died, returned
    something else than a report or did not finish within ``timeout``
    seconds (all ranks are stopped then), with the end of what it printed."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ReloadCheckError(f"check_ranks: world_size must be a whole number of at least 1, got {world_size!r}")
    if not callable(check):
        raise ReloadCheckError(f"check_ranks: check must be a function (rank, world_size) -> ReloadReport, "
                               f"got {type(check).__name__}")
    ctx = multiprocessing.get_context("spawn")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    with tempfile.TemporaryDirectory(prefix="reloadsafe-ranks-") as logs:
        procs, conns = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            log = os.path.join(logs, f"rank{rank}.log")
            p = ctx.Process(target=_rank_main, name=f"reloadsafe-rank{rank}",
                            args=(check, rank, world_size, init_method, backend, timeout, child, log))
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        results, problems = _gather(procs, conns, timeout, logs)
    verdicts = [results[r] for r in sorted(results)]
    if problems:
        finished = "; ".join(f"rank {v.rank}: {'pass' if v.ok else 'FAIL'}" for v in verdicts)
        raise ReloadCheckError("check_ranks: " + "\n".join(problems)
                               + (f"\nthe ranks that finished: {finished}" if finished else ""))
    return RanksReport(verdicts)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read().rstrip("\n").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


def _gather(procs: list[Any], conns: list[Any], timeout: float,
            logs: str) -> tuple[dict[int, RankResult], list[str]]:
    """Each rank's verdict, and what went wrong with the others; every rank
    stopped on return."""
    results: dict[int, RankResult] = {}
    problems: list[str] = []
    pending = dict(enumerate(conns))
    deadline = time.monotonic() + timeout
    stopping = False
    try:
        while pending:
            left = deadline - time.monotonic()
            waiting = list(pending.values()) + [procs[r].sentinel for r in pending]
            ready = multiprocessing.connection.wait(waiting, timeout=max(left, 0))
            for rank, conn in list(pending.items()):
                sent = conn in ready or conn.poll()
                if not sent and procs[rank].sentinel not in ready:
                    continue
                del pending[rank]
                message = _receive(conn) if sent else None
                log = os.path.join(logs, f"rank{rank}.log")
                if message is None:
                    procs[rank].join(1)
                    problems.append(f"rank {rank} died (exit code {procs[rank].exitcode}) before it "
                                    f"reported:\n{_tail(log)}")
                elif "raised" in message:
                    problems.append(f"rank {rank}'s check raised:\n{message['raised'].rstrip()}")
                else:
                    results[rank] = RankResult(rank, **message)
            if problems and not stopping:
                # A rank that raised or died may leave the others waiting on
                # it in a collective: they get a short while to finish.
                stopping = True
                deadline = min(deadline, time.monotonic() + _GRACE)
            if pending and time.monotonic() >= deadline:
                if stopping:
                    problems += [f"rank {rank} stopped (another rank ended first)" for rank in sorted(pending)]
                    break
                for rank in pending:
                    _dump_stacks(procs[rank])
                time.sleep(0.5)
                for rank in sorted(pending):
                    problems.append(f"rank {rank} did not finish within {timeout:g} s; where it was:\n"
                                    f"{_tail(os.path.join(logs, f'rank{rank}.log'))}")
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return results, problems


def _receive(conn: Any) -> dict[str, Any] | None:
    try:
        message = conn.recv()
    except (EOFError, OSError):
        return None
    return message if isinstance(message, dict) else None


def _dump_stacks(proc: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGUSR1)


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[Any]:
    """This process's stdout and stderr (the file descriptors, so that C++
    and child output land there too) into ``path``; its stacks dumped there
    on SIGUSR1."""
    with open(path, "w", buffering=1) as log:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
        yield log


def _rank_main(check: RankCheck, rank: int, world_size: int, init_method: str, backend: str,
               timeout: float, conn: Any, log_path: str) -> None:
    """One rank: the world joined, ``check`` run, its verdict sent."""
    with _output_to(log_path):
        import torch
        import torch.distributed as dist

        from .report import ReloadReport

        torch.set_num_threads(1)
        message: dict[str, Any]
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout))
            try:
                report = check(rank, world_size)
                if not isinstance(report, ReloadReport):
                    raise ReloadCheckError(f"the check returned {type(report).__name__}, not a ReloadReport "
                                           "(return check_reload's report)")
                message = {"ok": report.ok, "flagged": report.flagged, "errors": report.errors,
                           "table": report.table()}
            finally:
                dist.destroy_process_group()
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            message = {"raised": traceback.format_exc()}
        conn.send(message)
        conn.close()
