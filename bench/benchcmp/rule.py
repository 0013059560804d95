"""The comparison rule: each benchmark's verdict (SLOWER, machine, faster,
ok, ...) against the base side or baseline, as compare.py's docstring states
it, and Row, one benchmark's line of a comparison."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .names import parse_name, sort_key
from .results import Context, Stats


@dataclass(frozen=True)
class Reference:
    """From a context's reloadsafe_references: benchmarks under `prefix` are
    measured against the limit `limit` ("a/" or alternatives "a/|b/")."""

    prefix: str
    limit: str

    @property
    def alternatives(self) -> list[str]:
        return limit_prefixes(self.limit)


@dataclass(frozen=True)
class Row:
    """One benchmark compared: its stats on both sides (None where it is
    missing), current median over base median (nan when either has none),
    that ratio relative to its limit's (None without a limit in both runs),
    and the verdict."""

    name: str
    base: Stats | None
    cur: Stats | None
    ratio: float
    relative: float | None
    verdict: str


def parse_references(context: Context) -> list[Reference]:
    """The references of a context's reloadsafe_references ("prefix=limit;...")."""
    refs = []
    for item in context.get("reloadsafe_references", "").split(";"):
        prefix, sep, limit = item.partition("=")
        if sep and prefix and limit:
            refs.append(Reference(prefix, limit))
    return refs


def limit_prefixes(limit: str) -> list[str]:
    """The alternatives of a reference's limit ("a/|b/" -> ["a/", "b/"])."""
    return [p for p in limit.split("|") if p]


def limit_of(name: str, references: Sequence[Reference], stats: Mapping[str, Stats | None],
             also_in: Container[str] | None = None) -> str | None:
    """The benchmark of `stats` that `name` is measured against: under one of
    its reference's limit prefixes, with the same bytes; of several
    alternatives, the fastest (lowest median) among those also in `also_in`
    (when given); None if none."""
    size = parse_name(name).size
    for ref in references:
        alternatives = ref.alternatives
        if not name.startswith(ref.prefix) or any(name.startswith(a) for a in alternatives):
            continue
        found = [other for other in stats
                 if any(other.startswith(a) for a in alternatives)
                 and parse_name(other).size == size
                 and (also_in is None or other in also_in)]
        if found:
            return min(found, key=lambda n: (_median_or_inf(stats[n]), n))
    return None


def _median_or_inf(s: Stats | None) -> float:
    return s.median if s is not None and s.times else math.inf


def is_limit(name: str, references: Iterable[Reference]) -> bool:
    """Whether `name` is itself a limit of one of the references."""
    return any(name.startswith(a) for ref in references for a in ref.alternatives)


# Note [Too few runs to gate]
# "Ranges apart" is what tells a change from noise, and it needs enough runs
# on each side to mean that. With the same code on both sides, any order of
# the m + n times is equally likely, so the current m all land above the base
# n by chance once in C(m + n, m): once in 2 for one run each, once in 21 for
# 2 runs against a 5-run baseline (the main job's --quick), which over the
# ~240 benchmarks of the main job often flags an untouched one on a shared
# machine (it did in both --quick runs of one session). With 3 runs a side it
# is once in 20 (3 against 3) to once in 56 (3 against 5), and the median
# threshold cuts it further. So a side with
# fewer than MIN_RUNS_TO_GATE runs makes the verdict "few runs": reported,
# never a failure.
MIN_RUNS_TO_GATE = 3


def classify(base: Stats | None, cur: Stats | None, threshold: float,
             relative: float | None = None, limit: bool = False) -> str:
    """SLOWER, faster, ok, new, missing, error, or (not failing) machine /
    limit slower / limit faster / few runs, for one benchmark; see
    compare.py's docstring and Note [Too few runs to gate].

    `relative`: (current median / its limit's current median) over (baseline
    median / the limit's baseline median), when the benchmark has a limit
    measured in both runs. `limit`: the benchmark is itself a limit."""
    if cur is None:
        return "missing"
    if cur.error:
        return "error"
    if base is None or base.error or not base.times:
        return "new"
    if not cur.times:
        return "error"
    few = min(len(base.times), len(cur.times)) < MIN_RUNS_TO_GATE
    if cur.median > base.median * (1 + threshold) and cur.min > base.max:
        if limit:
            return "limit slower"
        if relative is not None and relative <= 1 + threshold:
            return "machine"  # its limit slowed down about as much
        return "few runs" if few else "SLOWER"
    if cur.median * (1 + threshold) < base.median and cur.max < base.min:
        if limit:
            return "limit faster"
        return "few runs" if few else "faster"
    return "ok"


def _relative(name: str, ratio: float, base_stats: Mapping[str, Stats],
              cur_stats: Mapping[str, Stats], references: Sequence[Reference]) -> float | None:
    """`ratio` over the ratio of name's limit (current over base), when that
    limit ran on both sides; else None."""
    lim = limit_of(name, references, cur_stats, also_in=base_stats)
    if lim is None or lim not in base_stats or math.isnan(ratio):
        return None
    cur_lim, base_lim = cur_stats[lim], base_stats[lim]
    if not (cur_lim.times and base_lim.times):
        return None
    return ratio / (cur_lim.median / base_lim.median)


def compare(base_stats: Mapping[str, Stats], cur_stats: Mapping[str, Stats], threshold: float,
            references: Sequence[Reference] = ()) -> list[Row]:
    """The current run's rows sorted by name (sort_key), then the baseline's
    benchmarks the current run lacks."""
    rows = []
    for name, cur in sorted(cur_stats.items(), key=lambda kv: sort_key(kv[0])):
        base = base_stats.get(name)
        ratio = cur.median / base.median if base and base.times and cur.times else math.nan
        relative = _relative(name, ratio, base_stats, cur_stats, references)
        verdict = classify(base, cur, threshold, relative, is_limit(name, references))
        rows.append(Row(name, base, cur, ratio, relative, verdict))
    for name, base in sorted(base_stats.items(), key=lambda kv: sort_key(kv[0])):
        if name not in cur_stats:
            rows.append(Row(name, base, None, math.nan, None, "missing"))
    return rows


def parse_informational(context: Context) -> list[str]:
    """Name prefixes from a context's reloadsafe_informational ("a/;b/"):
    benchmarks whose speed depends on state outside the code."""
    return [p for p in str(context.get("reloadsafe_informational", "")).split(";") if p]


def parse_kernel_dependent(context: Context) -> list[str]:
    """Name prefixes from a context's reloadsafe_kernel_dependent ("a/;b/"):
    benchmarks whose speed depends on the operating system's kernel."""
    return [p for p in str(context.get("reloadsafe_kernel_dependent", "")).split(";") if p]


def gating_verdicts(rows: Iterable[Row], same_machine: bool,
                    informational: Sequence[str] = (), other_kernel: bool = False,
                    kernel_dependent: Sequence[str] = ()) -> list[Row]:
    """The rows' verdicts as they count: against another machine's baseline,
    SLOWER and faster become "differs"; for a benchmark the binary calls
    informational, "varies"; with `other_kernel` (the baseline was recorded
    under another kernel), for a benchmark the binary calls kernel
    dependent, "other kernel" (all information, never a failure)."""
    out = []
    for row in rows:
        if row.verdict in ("SLOWER", "faster"):
            if not same_machine:
                row = dataclasses.replace(row, verdict="differs")
            elif any(row.name.startswith(p) for p in informational):
                row = dataclasses.replace(row, verdict="varies")
            elif other_kernel and any(row.name.startswith(p) for p in kernel_dependent):
                row = dataclasses.replace(row, verdict="other kernel")
        out.append(row)
    return out
