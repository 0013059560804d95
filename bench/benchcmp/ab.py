"""The A/B run (--base REF): REF's benchmarks built in a worktree of their
own, both sides run alternately (ABBA...), one repetition per process, and
the working tree's results judged against the base's."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, TextIO

from . import bazel, runs
from .judge import process
from .options import Options
from .paths import TOP


def base_worktree(ref: str, where: str, log: TextIO | None) -> str:
    """A git worktree of commit `ref` at `where` (created, or moved to ref when
    it is already one), with this checkout's user.bazelrc (the disk cache);
    returns the commit."""
    commit = subprocess.run(["git", "rev-parse", "--verify", ref + "^{commit}"], cwd=TOP,
                            check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "worktree", "prune"], cwd=TOP, check=True)
    if os.path.exists(os.path.join(where, ".git")):
        subprocess.run(["git", "checkout", "--quiet", "--force", "--detach", commit], cwd=where,
                       check=True, stdout=log, stderr=subprocess.STDOUT if log else None)
    else:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--force", "--detach", where, commit], cwd=TOP,
                       check=True, stdout=log, stderr=subprocess.STDOUT if log else None)
    rc = os.path.join(TOP, "user.bazelrc")
    if os.path.exists(rc):
        with open(rc) as src, open(os.path.join(where, "user.bazelrc"), "w") as dst:
            dst.write(src.read())
    return commit


def default_base_dir() -> str:
    """$RELOADSAFE_CACHE/ab-base (default cache: $XDG_CACHE_HOME/reloadsafe,
    else ~/.cache/reloadsafe)."""
    cache = os.environ.get("RELOADSAFE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "reloadsafe")
    return os.path.join(cache, "ab-base")


def interleaved_order(rounds: int) -> list[str]:
    """The sides of an A/B run, round by round: base, head, head, base, base,
    head, ... (ABBA), so neither side always runs first after a pause."""
    order: list[str] = []
    for r in range(rounds):
        order += [("base", "head"), ("head", "base")][r % 2]
    return order


def prepare(names: list[str], args: Options, where: str) -> list[str]:
    """Checks out and builds the base at `where` and builds the working tree;
    returns the names the base has (a benchmark it lacks runs on the working
    tree only: all its benchmarks are new)."""
    assert args.base is not None
    commit = base_worktree(args.base, where, args.log_file)
    print(f"[compare] base: {args.base} = {commit[:12]} in {where}", flush=True)
    on_base = [n for n in names if bazel.has_benchmark(n, where)]
    for n in names:
        if n not in on_base:
            print(f"[compare] {args.base} has no //bench:{n}: its benchmarks are new", flush=True)
    if not args.no_build:
        bazel.build(names, TOP, args.log_file)
        bazel.build(on_base, where, args.log_file)
        bazel.stop_bazel(where)
    return on_base


def run_sides(name: str, args: Options, where: str, on_base: bool) -> tuple[str, str]:
    """Runs both sides of `name` interleaved; (head, base) merged results
    (the base's without runs when it lacks the benchmark)."""
    sides = {"head": bazel.resolve_binary(name, TOP)}
    if on_base:
        sides["base"] = bazel.resolve_binary(name, where)
    outputs: dict[str, list[str]] = {"head": [], "base": []}
    for i, side in enumerate(interleaved_order(args.repetitions)):
        if side in sides:
            outputs[side].append(runs.run_binary(sides[side], args, args.results_dir,
                                                 repetitions=1, tag=f".{side}.{i // 2}"))
    head = runs.merge_outputs(outputs["head"], os.path.join(args.results_dir, f"{name}.json"))
    base = runs.merge_outputs(outputs["base"],
                              os.path.join(args.results_dir, f"{name}.base.json"))
    return head, base


def run_ab(specs: tuple[str, ...], args: Options, plt: Any) -> bool:
    """--base: builds both sides, runs them interleaved, compares each binary
    of the working tree with the base's. Returns True if all pass."""
    names = [s for s in specs if not s.endswith(".json")]
    if len(names) != len(specs) or any(os.sep in s for s in names):
        sys.exit("[compare] --base takes benchmark names (copy_bench), not paths or results")
    where = args.base_dir or default_base_dir()
    on_base = prepare(names, args, where)
    ok = True
    for name in names:
        head, base = run_sides(name, args, where, name in on_base)
        ok = process(head, args, plt, base_results=base) and ok
    return ok
