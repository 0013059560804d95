"""The targets a binary judges within its run (<results>.targets.json):
merged over runs, printed, and summarised per family for the verdict."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

# One row of a targets file: description, bytes, value, bound, comparison
# ("<=" or ">="), met, and the unit where the binary wrote it.
Target = dict[str, Any]


def targets_path(results_path: str) -> str:
    """The targets file beside a results file."""
    return os.path.splitext(results_path)[0] + ".targets.json"


def is_met(target: Target, value: float) -> bool:
    """Whether `value` meets the target's bound."""
    return bool(value <= target["bound"] if target["comparison"] == "<=" else
                value >= target["bound"])


def target_unit(target: Target) -> str:
    """"ns" (a time) or "ratio"; results written before targets said which
    were times exactly when they were upper bounds."""
    return str(target.get("unit") or ("ns" if target["comparison"] == "<=" else "ratio"))


def merge_targets(paths: list[str], out_path: str) -> str:
    """The targets of several runs of one binary: per (description, bytes),
    the median of the runs' values, judged against the bound again; returns
    out_path."""
    rows: dict[tuple[str, int], list[Target]] = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            t = json.load(f)
        for x in t["targets"]:
            rows.setdefault((x["description"], x["bytes"]), []).append(x)
    targets = []
    for _, xs in sorted(rows.items()):
        value = statistics.median(x["value"] for x in xs)
        x = dict(xs[0])
        x["value"] = value
        x["met"] = is_met(x, value)
        x["runs"] = len(xs)
        targets.append(x)
    with open(out_path, "w") as f:
        json.dump({"basis": f"median over {len(paths)} runs (one process each) of the "
                            f"per-run ratios",
                   "targets": targets}, f, indent=1)
    return out_path


def report_targets(results_path: str) -> list[Target]:
    """Prints how many of the targets beside a results file were met, and
    each missed one; returns the targets (none without a targets file)."""
    path = targets_path(results_path)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        t = json.load(f)
    targets: list[Target] = t["targets"]
    met = sum(1 for x in targets if x["met"])
    print(f"targets ({t['basis']}): {met} of {len(targets)} met")
    for x in targets:
        if not x["met"]:
            print(f"  MISSED {x['description']} at {x['bytes']} bytes: {x['value']:.3g} "
                  f"(needs {x['comparison']} {x['bound']:g})")
    return targets


def _worse(target: Target, worst: float) -> bool:
    """Whether the target's value is worse than `worst` (higher for an
    upper bound, lower for a lower bound)."""
    value = target["value"]
    return bool(value > worst if target["comparison"] == "<=" else value < worst)


def summarize_targets(targets: list[Target]) -> dict[str, dict[str, Any]]:
    """Per target description (the targets of one family share it, one row
    per size): met at all sizes, the worst value and its size, the bound."""
    families: dict[str, dict[str, Any]] = {}
    for x in targets:
        f = families.setdefault(x["description"], {
            "met": True, "worst": None, "bytes": None, "bound": x["bound"],
            "comparison": x["comparison"], "unit": target_unit(x), "rows": 0})
        f["rows"] += 1
        f["met"] = f["met"] and x["met"]
        if f["worst"] is None or _worse(x, f["worst"]):
            f["worst"], f["bytes"] = x["value"], x["bytes"]
    return families
