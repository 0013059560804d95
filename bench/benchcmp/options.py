"""What a compare.py command line asks for, once parsed (Options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Options:
    """The command line's flags (see cli.py's parser for each), with the
    defaults filled in: the results folder exists, `charts` is None when no
    charts are drawn, `log_file` is the open --log file (None: the terminal),
    `binary_args` are the arguments after --."""

    bench: tuple[str, ...]
    results_dir: str
    baselines: str
    repetitions: int = 5
    threshold: float = 0.25
    base: str | None = None
    base_dir: str | None = None
    kind: str | None = None
    min_time: float | None = None
    filter: str | None = None
    threads: int | None = None
    update_baseline: bool = False
    record_missing: bool = False
    force: bool = False
    charts: str | None = None
    no_build: bool = False
    binary_args: tuple[str, ...] = ()
    log_file: TextIO | None = None
