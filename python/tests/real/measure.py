"""Verdict, flagged names and wall time of check_reload(..., reloads=10) for
every layer in real_layers.py, as a table.

    bazel build //python:package
    PYTHONPATH=bazel-bin/python/package_site ~/.cache/reloadsafe/venv/bin/python \\
        python/tests/real/measure.py [--reloads 10] [--repeat 3]

The time is the median of ``--repeat`` runs of the whole check (both modes,
every cold load included). A layer whose library is missing is listed as skipped.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reloadsafe  # noqa: E402

import real_layers as rl  # noqa: E402


def _verdict(cls, report) -> str:
    if report.errors:
        return "error"
    if cls.expected is None:
        return "pass" if report.ok else "FLAGGED (wrong)"
    return "flagged" if not report.ok else "MISSED (wrong)"


def main() -> int:
    """Runs every layer and prints the table; exits 1 if a verdict is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    x = torch.randn(*rl.INPUT_SHAPE, generator=torch.Generator().manual_seed(0))
    rows = []
    wrong = 0
    for cls in rl.ALL:
        if cls.library is not None and importlib.util.find_spec(cls.library) is None:
            rows.append((cls.__name__, "skipped", f"({cls.library} missing)", ""))
            continue
        times = []
        report = None
        for _ in range(args.repeat):
            start = time.perf_counter()
            report = reloadsafe.check_reload(cls, x, reloads=args.reloads)
            times.append(time.perf_counter() - start)
        assert report is not None, "--repeat must be at least 1"
        verdict = _verdict(cls, report)
        wrong += "wrong" in verdict
        flagged = ", ".join(report.flagged) if report.flagged else "-"
        if report.errors:
            flagged = report.errors[0][:100]
        rows.append((cls.__name__, verdict, flagged, f"{statistics.median(times):.2f} s"))
    widths = [max(len(r[i]) for r in rows + [("layer", "verdict", "flagged", "time")]) for i in range(4)]
    widths[2] = min(widths[2], 110)
    header = ("layer", "verdict", "flagged", f"time (reloads={args.reloads})")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeat} runs")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
