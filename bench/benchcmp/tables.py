"""The text table of a comparison: one line per Row, then a summary of the
verdicts and what they mean."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TextIO

from .results import Stats
from .rule import MIN_RUNS_TO_GATE, Row


def fmt_time(ns: float | None) -> str:
    """A time in ns with three significant digits in s, ms, us or ns."""
    if ns is None or math.isnan(ns):
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def fmt_range(s: Stats | None) -> str:
    """min..max of a benchmark's times ("-" without any)."""
    return "-" if s is None or not s.times else f"{fmt_time(s.min)}..{fmt_time(s.max)}"


def count_verdicts(rows: Sequence[Row]) -> dict[str, int]:
    """How many rows have each verdict, in the order they first appear."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return counts


def format_row(row: Row, width: int) -> str:
    ratio = "-" if math.isnan(row.ratio) else f"{row.ratio:.3f}"
    rel = "-" if row.relative is None else f"{row.relative:.3f}"
    base = fmt_time(row.base.median if row.base else None)
    cur = fmt_time(row.cur.median if row.cur else None)
    return (f"{row.name:<{width}}  {base:>9}  {cur:>9}  {ratio:>8}  {rel:>8}  "
            f"{fmt_range(row.base):>19}  {fmt_range(row.cur):>19}  {row.verdict}")


def summary_lines(counts: dict[str, int], threshold: float, gating: bool) -> list[str]:
    """The lines below the table: the counts and what the verdicts mean."""
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if not gating:
        return [f"({summary}; differs = median more than {threshold:.0%} apart and ranges apart, "
                f"against another machine's baseline: information, not a verdict)"]
    lines = [f"({summary}; SLOWER = median more than {threshold:.0%} slower, ranges apart, and "
             f"more than {threshold:.0%} slower relative to its limit in the same run)"]
    if "few runs" in counts:
        lines.append("(few runs = SLOWER or faster, but a side has fewer than "
                     f"{MIN_RUNS_TO_GATE} repetitions, too few to tell a change from noise: "
                     "information; rerun with --repetitions 3 or more to judge)")
    if "varies" in counts:
        lines.append("(varies = SLOWER or faster, for a benchmark whose speed depends on state "
                     "outside the code (its binary's reloadsafe_informational): information)")
    if "other kernel" in counts:
        lines.append("(other kernel = SLOWER or faster, for a benchmark whose speed depends on the "
                     "kernel (its binary's reloadsafe_kernel_dependent), against a baseline recorded "
                     "under another kernel: information; A/B with --base judges it, or record this "
                     "machine's baseline again under this kernel)")
    return lines


def print_table(rows: Sequence[Row], threshold: float, out: TextIO | None = None,
                gating: bool = True) -> None:
    """Prints the rows (to `out`, else standard output) and the summary;
    `gating`: the verdicts count (else they are information only)."""
    out = out or sys.stdout
    width = max([len(r.name) for r in rows] + [9])
    print(f"{'benchmark':<{width}}  {'baseline':>9}  {'current':>9}  {'cur/base':>8}  "
          f"{'vs limit':>8}  {'baseline range':>19}  {'current range':>19}  verdict", file=out)
    for row in rows:
        print(format_row(row, width), file=out)
    for line in summary_lines(count_verdicts(rows), threshold, gating):
        print(line, file=out)
