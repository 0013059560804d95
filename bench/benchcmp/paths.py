"""Where the repository, its bench folder and the stored baselines are."""

from __future__ import annotations

import os

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = os.path.dirname(BENCH_DIR)
DEFAULT_BASELINES = os.path.join(BENCH_DIR, "baselines")


def from_top(path: str) -> str:
    """`path` relative to the repository's top folder, as messages show it."""
    return os.path.relpath(path, TOP)
