"""Google Benchmark JSON: one benchmark's repetitions as Stats (medians, min,
max, throughput), and several runs of a binary merged into one file."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

# A results file's "context" object (machine, build, references, ...).
Context = dict[str, Any]
# One entry of a results file's "benchmarks" array.
Entry = dict[str, Any]

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


@dataclass(frozen=True)
class Stats:
    """One benchmark's repetitions: time per iteration (ns) and throughput
    (bytes per second), each sorted; the error message of a failed one."""

    name: str
    times: list[float]
    bps: list[float]
    label: str = ""
    error: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "times", sorted(self.times))
        object.__setattr__(self, "bps", sorted(self.bps))

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan

    @property
    def min(self) -> float:
        return self.times[0] if self.times else math.nan

    @property
    def max(self) -> float:
        return self.times[-1] if self.times else math.nan

    @property
    def median_bps(self) -> float:
        return statistics.median(self.bps) if self.bps else 0.0


@dataclass
class _Repetitions:
    """What load_results gathers for one name before it becomes Stats."""

    times: list[float] = field(default_factory=list)
    bps: list[float] = field(default_factory=list)
    label: str = ""
    error: str = ""

    def add(self, entry: Entry, name: str) -> None:
        if entry.get("error_occurred"):
            self.error = entry.get("error_message", "error")
            return
        self.times.append(time_of(entry, name) * UNIT_NS[entry.get("time_unit", "ns")])
        if "bytes_per_second" in entry:
            self.bps.append(entry["bytes_per_second"])
        self.label = entry.get("label", "")


def time_of(entry: Entry, name: str) -> float:
    """The time a benchmark is judged by: its process CPU time when it was
    measured so (MeasureProcessCPUTime(): the name ends in /process_time; a
    one-thread benchmark that preemption by other processes must not
    inflate), else its real (or manual) time."""
    if name.endswith("/process_time") and "cpu_time" in entry:
        return float(entry["cpu_time"])
    return float(entry["real_time"])


def iterations(data: dict[str, Any]) -> list[Entry]:
    """The individual repetitions of a results file (run_type "iteration"),
    without the aggregates Google Benchmark adds."""
    return [b for b in data.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]


def load_results(path: str) -> tuple[Context, dict[str, Stats]]:
    """The JSON a benchmark binary wrote: (context, {name: Stats}).

    Only the individual repetitions are used; the aggregates Google Benchmark
    adds are recomputed here, with min and max.
    """
    with open(path) as f:
        data = json.load(f)
    runs: dict[str, _Repetitions] = {}
    for entry in iterations(data):
        name: str = entry["run_name"] if "run_name" in entry else entry["name"]
        runs.setdefault(name, _Repetitions()).add(entry, name)
    stats = {n: Stats(n, r.times, r.bps, r.label, r.error) for n, r in runs.items()}
    return data.get("context", {}), stats


def merge_runs(paths: list[str], out_path: str) -> str:
    """Writes the runs at `paths` (one repetition each, or more) as one
    Google Benchmark JSON with all their repetitions, the first run's context;
    returns out_path."""
    merged: dict[str, Any] | None = None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if merged is None:
            merged = {"context": data.get("context", {}), "benchmarks": []}
        merged["benchmarks"] += iterations(data)
    with open(out_path, "w") as f:
        json.dump(merged or {"context": {}, "benchmarks": []}, f, indent=1)
    return out_path


def binary_name_of(context: Context, results_path: str) -> str:
    """The binary a results file is of: its context's executable, else the
    file's name (less a ".head" suffix)."""
    exe = context.get("executable")
    if exe:
        return os.path.basename(exe)
    name = os.path.splitext(os.path.basename(results_path))[0]
    return name[:-len(".head")] if name.endswith(".head") else name
