"""One binary's results judged: against the A/B base side, this machine's
stored baseline or another machine's (information), or recorded as this
machine's baseline; printed, charted, and written as <binary>.verdict.json."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from . import charts as charting
from .baselines import (
    baseline_path,
    check_context,
    describe_machine,
    find_baseline,
    machine_of,
    same_kernel,
    write_baseline,
)
from .names import family_of, matches_filter
from .options import Options
from .paths import from_top
from .results import Context, Stats, binary_name_of, load_results
from .rule import (
    MIN_RUNS_TO_GATE,
    Row,
    compare,
    gating_verdicts,
    parse_informational,
    parse_kernel_dependent,
    parse_references,
)
from .tables import print_table
from .targets import Target, report_targets, summarize_targets

# What the current run is compared with.
AB, BASELINE, OTHER_MACHINE, NONE = "ab", "baseline", "other-machine baseline", "none"


@dataclass(frozen=True)
class Current:
    """The results being judged, and where this machine's baseline of them is."""

    path: str
    context: Context
    stats: dict[str, Stats]
    name: str
    kind: str
    machine: str
    own_file: str

    @property
    def record_cmd(self) -> str:
        return (f"bench/compare.py --update-baseline {self.name}   "
                f"(writes {from_top(self.own_file)}; commit it)")


@dataclass(frozen=True)
class Base:
    """What the current run is compared with: the mode (AB, BASELINE,
    OTHER_MACHINE or NONE), its file (None for NONE) and its results."""

    mode: str
    path: str | None
    context: Context
    stats: dict[str, Stats]

    @property
    def same_machine(self) -> bool:
        """Whether the verdicts gate (A/B, or this machine's baseline)."""
        return self.mode in (AB, BASELINE)


@dataclass(frozen=True)
class Verdict:
    """<binary>.verdict.json, which tools/report.py reads; its fields in the
    file's order (`recorded` only when a baseline was recorded)."""

    binary: str
    kind: str
    machine: str
    machine_description: str
    results: str
    mode: str
    base: str | None
    gates: bool
    slower: list[str]
    errors: list[str]
    families: dict[str, dict[str, int]]
    targets: dict[str, dict[str, Any]]
    charts: list[str]
    threshold: float
    recorded: str | None
    passed: bool

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["recorded"] is None:
            del data["recorded"]
        return data


def load_current(results_path: str, args: Options) -> Current:
    """The results at `results_path`, their binary, machine kind and machine;
    exits when the kind is known from nowhere."""
    context, stats = load_results(results_path)
    name = binary_name_of(context, results_path)
    kind = args.kind or os.environ.get("RELOADSAFE_BENCH_KIND") or context.get("machine_kind")
    if not kind:
        sys.exit(f"[compare] {results_path} has no machine_kind in its context: give --kind")
    machine = machine_of(context)
    own_file = baseline_path(args.baselines, kind, machine, name)
    return Current(results_path, context, stats, name, kind, machine, own_file)


def choose_base(cur: Current, args: Options, base_results: str | None) -> tuple[str, str | None]:
    """(mode, file) of what `cur` is compared with; prints the binary's heading."""
    if base_results is not None:
        print(f"\n== {cur.name}: working tree vs {args.base} (A/B, {args.repetitions} interleaved "
              f"runs each; kind {cur.kind}, {describe_machine(cur.context)})")
        return AB, base_results
    base_file, same = find_baseline(args.baselines, cur.kind, cur.machine, cur.name)
    if base_file is None:
        mode = NONE
    else:
        mode = BASELINE if same else OTHER_MACHINE
    print(f"\n== {cur.name} (kind {cur.kind}, machine {cur.machine}; baseline "
          f"{from_top(base_file) if base_file else 'none'})")
    return mode, base_file


def load_base(cur: Current, args: Options, base_results: str | None) -> Base:
    """The base side or stored baseline of `cur`, with the notes and warnings
    about it printed."""
    mode, path = choose_base(cur, args, base_results)
    context, stats = load_results(path) if path else ({}, {})
    if mode == OTHER_MACHINE:
        then = ("this run is recorded as this machine's baseline"
                if records_missing(cur, mode, args) and runs_of(cur) >= MIN_RUNS_TO_GATE
                else f"record a baseline for this machine with: {cur.record_cmd}")
        print(f"[compare] the stored baseline was recorded on another machine "
              f"({describe_machine(context)}; this one: {describe_machine(cur.context)}): "
              f"differences are shown for information and never fail; {then}")
    elif mode == NONE and not args.update_baseline and not args.record_missing:
        print(f"[compare] no baseline for this machine yet: {cur.record_cmd}")
    for w in check_context(context, cur.context):
        if mode != OTHER_MACHINE or not w.startswith(("cpu_model", "cpu_id", "gpu")):
            print(f"[compare] warning: {w}")
    return Base(mode, path, context, stats)


def compare_rows(cur: Current, base: Base, args: Options) -> list[Row]:
    """The rows of `cur` against `base` with their verdicts as they count;
    prints the table."""
    base_stats = base.stats
    if args.filter:  # a filtered run is compared with the same part of the baseline
        base_stats = {n: s for n, s in base_stats.items() if matches_filter(args.filter, n)}
    references = parse_references(cur.context) or parse_references(base.context)
    informational = parse_informational(cur.context) or parse_informational(base.context)
    kernel_dependent = parse_kernel_dependent(cur.context) or parse_kernel_dependent(base.context)
    rows = gating_verdicts(compare(base_stats, cur.stats, args.threshold, references),
                           base.same_machine, informational,
                           other_kernel=not same_kernel(base.context, cur.context),
                           kernel_dependent=kernel_dependent)
    print_table(rows, args.threshold, gating=base.same_machine)
    return rows


def draw_charts(plt: Any, cur: Current, mode: str, rows: list[Row], args: Options) -> list[str]:
    """The binary's charts in args.charts (when charts are drawn); their paths."""
    if plt is None or not args.charts:
        return []
    os.makedirs(args.charts, exist_ok=True)
    drawn = []
    tp = os.path.join(args.charts, f"{cur.name}_throughput.png")
    title = f"{cur.name} on {cur.kind} ({describe_machine(cur.context)})"
    if charting.chart_throughput(plt, cur.stats, title, tp):
        print(f"[compare] chart: {tp}")
        drawn.append(tp)
    vb = os.path.join(args.charts, f"{cur.name}_vs_{'base' if mode == AB else 'baseline'}.png")
    title = (f"{cur.name}: working tree vs {args.base}" if mode == AB
             else f"{cur.name} on {cur.kind} vs baseline")
    if charting.chart_vs_baseline(plt, rows, args.threshold, title, vb):
        print(f"[compare] chart: {vb}")
        drawn.append(vb)
    return drawn


def record(cur: Current, args: Options, errors: list[str]) -> tuple[bool, str | None]:
    """Records `cur` as this machine's baseline unless a benchmark failed or
    the build is unoptimised (without --force): (passed, the file recorded)."""
    if errors:
        print(f"[compare] not recording a baseline with failed benchmarks: {errors}")
        return False, None
    if cur.context.get("reloadsafe_build", "opt") != "opt" and not args.force:
        print("[compare] not recording a baseline from an unoptimised build (--force to "
              "override)")
        return False, None
    try:
        write_baseline(cur.path, cur.own_file, merge=bool(args.filter),
                       kernel_dependent=tuple(parse_kernel_dependent(cur.context)))
    except ValueError as e:
        print(f"[compare] {e}")
        return False, None
    print(f"[compare] baseline recorded for this machine: "
          f"{from_top(cur.own_file)} (commit it to keep it)")
    return True, from_top(cur.own_file)


def runs_of(cur: Current) -> int:
    """The fewest repetitions any benchmark of `cur` has (0 without any)."""
    return min((len(s.times) for s in cur.stats.values()), default=0)


def records_missing(cur: Current, mode: str, args: Options) -> bool:
    """Whether --record-missing asks to record `cur`: this machine has no
    baseline of its own (none at all, or only other machines')."""
    return args.record_missing and mode in (NONE, OTHER_MACHINE)


def conclude(cur: Current, mode: str, args: Options, errors: list[str],
             slower: list[str]) -> tuple[bool, str | None]:
    """Records a baseline when asked to (--update-baseline; or
    --record-missing where this machine has none, from enough runs to gate
    on), else says what is slower: (passed, the file recorded)."""
    if args.update_baseline:
        return record(cur, args, errors)
    if records_missing(cur, mode, args):
        if runs_of(cur) >= MIN_RUNS_TO_GATE:
            return record(cur, args, errors)
        # A baseline of too few runs would never gate (Note [Too few runs to
        # gate]) and would stand in the way of a later, fuller run.
        print(f"[compare] not recording a baseline from {runs_of(cur)} run(s): one needs "
              f"{MIN_RUNS_TO_GATE} or more to gate on (to record it anyway: {cur.record_cmd})")
        return not errors, None
    if slower:
        print(f"[compare] {len(slower)} benchmark(s) slower than the "
              f"{'base' if mode == AB else 'baseline'} beyond {args.threshold:.0%}")
    return not errors and not slower, None


def families_of(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per benchmark family, how many of its rows have each verdict."""
    families: dict[str, dict[str, int]] = {}
    for row in rows:
        fam = families.setdefault(family_of(row.name), {})
        fam[row.verdict] = fam.get(row.verdict, 0) + 1
    return families


def make_verdict(cur: Current, base: Base, args: Options, rows: list[Row],
                 targets: list[Target], charts: list[str]) -> Verdict:
    """The verdict of `cur` before anything is recorded (not yet passed)."""
    return Verdict(
        binary=cur.name, kind=cur.kind, machine=cur.machine,
        machine_description=describe_machine(cur.context), results=cur.path, mode=base.mode,
        base=args.base if base.mode == AB else (from_top(base.path) if base.path else None),
        gates=base.same_machine, slower=[r.name for r in rows if r.verdict == "SLOWER"],
        errors=[r.name for r in rows if r.verdict == "error"], families=families_of(rows),
        targets=summarize_targets(targets), charts=charts, threshold=args.threshold,
        recorded=None, passed=False)


def process(results_path: str, args: Options, plt: Any, base_results: str | None = None) -> bool:
    """Compares (or records) one results file; returns True if it passes.

    base_results: the A/B base side's results (then no stored baseline is
    used)."""
    cur = load_current(results_path, args)
    base = load_base(cur, args, base_results)
    rows = compare_rows(cur, base, args)
    targets = report_targets(results_path)
    charts = draw_charts(plt, cur, base.mode, rows, args)
    verdict = make_verdict(cur, base, args, rows, targets, charts)
    passed, recorded = conclude(cur, base.mode, args, verdict.errors, verdict.slower)
    verdict = dataclasses.replace(verdict, recorded=recorded, passed=passed)
    with open(os.path.join(args.results_dir, f"{cur.name}.verdict.json"), "w") as f:
        json.dump(verdict.to_json(), f, indent=1)
    return passed
