"""PNG charts of a comparison, with matplotlib when it can be imported:
throughput by series and size, and each benchmark's median against the
base's."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .names import parse_name
from .results import Stats
from .rule import Row

# (bytes, stats) of one series; the series of one panel, by name.
Points = list[tuple[int, Stats]]
Series = dict[str, Points]


def import_pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None if it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def _destination(group: str) -> str:
    """The folder after the family ("BM_FileCopy/cpu/warm" -> "cpu")."""
    return group.split("/")[1] if "/" in group else ""


def throughput_panels(stats: Mapping[str, Stats]) -> tuple[dict[str, Series], dict[str, Series]]:
    """(panels by group, limits by destination) of the benchmarks with a size
    and a throughput; limits (family BM_Limit) whose destination has no
    panel of its own get one."""
    panels: dict[str, Series] = {}
    limits: dict[str, Series] = {}
    for name, s in stats.items():
        group, series, size = parse_name(name)
        if size is None or not s.bps:
            continue
        family, _, rest = group.partition("/")
        if family == "BM_Limit":
            limits.setdefault(rest, {}).setdefault(series, []).append((size, s))
        else:
            panels.setdefault(group, {}).setdefault(series, []).append((size, s))
    used = {_destination(group) for group in panels} & set(limits)
    for dest, series_of in limits.items():
        if dest not in used:
            panels["BM_Limit/" + dest] = series_of
    return panels, limits


def _draw_throughput(ax: Any, group: str, series: Series, overlay: Series) -> None:
    """One panel: each series's median GB/s by size with min..max error
    bars, the overlaid limits dashed."""
    lines = ([(k, v, "-o") for k, v in sorted(series.items())] +
             [(f"limit: {k}", v, "--") for k, v in sorted(overlay.items())])
    for label, points, style in lines:
        points.sort(key=lambda p: p[0])
        xs = [p[0] for p in points]
        ys = [p[1].median_bps / 1e9 for p in points]
        lo = [(p[1].median_bps - p[1].bps[0]) / 1e9 for p in points]
        hi = [(p[1].bps[-1] - p[1].median_bps) / 1e9 for p in points]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, capsize=2, label=label, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(group)
    ax.set_xlabel("bytes")
    ax.set_ylabel("GB/s (median, min..max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _save(plt: Any, fig: Any, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def chart_throughput(plt: Any, stats: Mapping[str, Stats], title: str, path: str) -> bool:
    """Throughput by series and size: one panel per group (e.g. destination
    and cache), limits (family BM_Limit) dashed in every panel of their
    destination. False (and no file) when nothing has a throughput."""
    panels, limits = throughput_panels(stats)
    if not panels:
        return False
    n = len(panels)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.5 * rows), squeeze=False)
    for ax, (group, series) in zip(axes.flat, sorted(panels.items()), strict=False):
        overlay = limits.get(_destination(group), {}) if not group.startswith("BM_Limit") else {}
        _draw_throughput(ax, group, series, overlay)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title)
    _save(plt, fig, path)
    return True


def chart_vs_baseline(plt: Any, rows: Sequence[Row], threshold: float, title: str,
                      path: str) -> bool:
    """Each benchmark's median time over the base's, as bars (SLOWER red,
    faster green), with the threshold. False (and no file) without ratios."""
    rows = [r for r in rows if not math.isnan(r.ratio)]
    if not rows:
        return False
    colors = {"SLOWER": "tab:red", "faster": "tab:green"}
    fig, ax = plt.subplots(figsize=(10, 0.22 * len(rows) + 1.5))
    ax.barh(range(len(rows)), [r.ratio for r in rows],
            color=[colors.get(r.verdict, "tab:blue") for r in rows])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.0 + threshold, color="tab:red", linestyle="--", linewidth=0.8,
               label=f"threshold (+{threshold:.0%})")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.name for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("median time / baseline median time (>1: slower)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(plt, fig, path)
    return True
