"""compare.py's command line: the parser, Options from it, and main()."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from typing import Any, TextIO

from . import bazel, runs
from .ab import run_ab
from .charts import import_pyplot
from .judge import process
from .options import Options
from .paths import DEFAULT_BASELINES, TOP
from .rule import MIN_RUNS_TO_GATE


def build_parser(description: str | None) -> argparse.ArgumentParser:
    """The argument parser; `description`: the text --help shows first."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", nargs="+",
                   help="benchmark name (copy_bench), binary path, or results .json")
    p.add_argument("--base", metavar="GIT_REF",
                   help="A/B: build this commit's benchmarks in a separate worktree and run them "
                   "interleaved with the working tree's; gate on the working tree vs it")
    p.add_argument("--base-dir", help="where the base worktree lives (default: "
                   "$RELOADSAFE_CACHE/ab-base, kept for the next run)")
    p.add_argument("--kind", help="machine kind of the baseline (default: $RELOADSAFE_BENCH_KIND, "
                   "else the binary's machine_kind)")
    p.add_argument("--repetitions", type=int, default=5,
                   help="repetitions (with --base: interleaved runs of each side)")
    p.add_argument("--min-time", type=float, help="seconds per repetition "
                   "(--benchmark_min_time; default Google Benchmark's 0.5)")
    p.add_argument("--filter", help="--benchmark_filter regex")
    p.add_argument("--threads", type=int,
                   help="OMP_NUM_THREADS for the binaries (default: $OMP_NUM_THREADS, else the "
                   "baseline's, else LibTorch's default)")
    p.add_argument("--threshold", type=float, default=0.25,
                   help="slowdown that fails, as a fraction (default 0.25)")
    p.add_argument("--update-baseline", action="store_true",
                   help="record the results as this machine's baseline (with --filter: "
                   "replace only the benchmarks that ran)")
    p.add_argument("--record-missing", action="store_true",
                   help="record this machine's baseline if it has none (even where other machines of "
                   f"its kind have one), from {MIN_RUNS_TO_GATE} or more runs")
    p.add_argument("--force", action="store_true",
                   help="with --update-baseline: record even an unoptimised build")
    p.add_argument("--baselines", default=DEFAULT_BASELINES, help=argparse.SUPPRESS)
    p.add_argument("--results-dir", help="where results JSON go (default: a new temporary folder)")
    p.add_argument("--charts", help="folder for PNG charts (default: the results folder)")
    p.add_argument("--no-charts", action="store_true")
    p.add_argument("--no-build", action="store_true", help="do not run bazel build first")
    p.add_argument("--log", help="file for the build and benchmark output (default: the terminal)")
    p.epilog = "Arguments after -- go to the benchmark binaries (e.g. -- --reloadsafe_large)."
    return p


def parse_args(argv: list[str] | None,
               description: str | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed flags and the arguments after -- (for the binaries)."""
    p = build_parser(description)
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    ns = p.parse_args(argv)
    if ns.base and ns.update_baseline:
        p.error("--base compares two builds; record a baseline without it")
    return ns, passthrough


def results_folder(ns: argparse.Namespace) -> str:
    """--results-dir, created if need be, else a new temporary folder."""
    results_dir: str = ns.results_dir or tempfile.mkdtemp(prefix="reloadsafe_bench_")
    os.makedirs(results_dir, exist_ok=True)
    return results_dir


def make_options(ns: argparse.Namespace, results_dir: str, binary_args: list[str],
                 log_file: TextIO | None) -> Options:
    """Options from the parsed flags."""
    return Options(
        bench=tuple(ns.bench), results_dir=results_dir, baselines=ns.baselines,
        repetitions=ns.repetitions, threshold=ns.threshold, base=ns.base, base_dir=ns.base_dir,
        kind=ns.kind, min_time=ns.min_time, filter=ns.filter, threads=ns.threads,
        update_baseline=ns.update_baseline, record_missing=ns.record_missing, force=ns.force,
        charts=None if ns.no_charts else (ns.charts or results_dir), no_build=ns.no_build,
        binary_args=tuple(binary_args), log_file=log_file)


def pyplot_for(opts: Options) -> Any:
    """matplotlib.pyplot when charts are drawn and it is installed (saying so
    when it is not); else None."""
    if opts.charts is None:
        return None
    plt = import_pyplot()
    if plt is None:
        print("[compare] matplotlib is not installed: charts skipped "
              "(pip install matplotlib, or apt-get install python3-matplotlib)")
    return plt


def run_stored(opts: Options, plt: Any) -> bool:
    """Without --base: runs each BENCH that is not a results file (building
    the named ones first) and judges each against the stored baselines."""
    names = [s for s in opts.bench
             if not s.endswith(".json") and os.sep not in s and not os.path.exists(s)]
    if names and not opts.no_build:
        bazel.build(names, TOP, opts.log_file)
    ok = True
    for spec in opts.bench:
        if spec.endswith(".json"):
            results = spec
        else:
            results = runs.run_separately(bazel.resolve_binary(spec), opts)
        ok = process(results, opts, plt) and ok
    return ok


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """Runs compare.py with `argv` (without the program's name; None: the
    command line's); returns the exit status: 1 if anything failed."""
    ns, binary_args = parse_args(argv, description)
    results_dir = results_folder(ns)  # first: --log may be in it
    with contextlib.ExitStack() as stack:
        log_file = stack.enter_context(open(ns.log, "a")) if ns.log else None
        opts = make_options(ns, results_dir, binary_args, log_file)
        plt = pyplot_for(opts)
        ok = run_ab(opts.bench, opts, plt) if opts.base else run_stored(opts, plt)
        print(f"\n[compare] results in {opts.results_dir}")
    return 0 if ok else 1
