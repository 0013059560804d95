"""Running a benchmark binary: its command line and OMP_NUM_THREADS, one
repetition per process (Note [Repetitions are processes]), and the runs of
one binary merged into <results>/<binary>.json with its targets."""

from __future__ import annotations

import os
import subprocess

from .baselines import recorded_threads
from .options import Options
from .results import merge_runs
from .targets import merge_targets, targets_path

# Note [Repetitions are processes]
# Benchmarks of a microsecond or less (replace_parameter at 4-16 KiB, the
# in_own_storage decision) differ by 30-70% from one process to the next on
# the same machine and code (measured: in place at 16 KiB 456-705 ns over six
# processes, each process's own repetitions within a few percent), through
# heap and code layout. Repetitions inside one process hide that spread, so a
# baseline recorded that way had min..max ranges that the next process fell
# outside of: a same-machine, same-code run was flagged SLOWER. Every run
# compare.py makes is therefore N processes of one repetition each, and the
# ranges compared are ranges over processes.


def baseline_threads(args: Options, binary: str) -> str | None:
    """OMP_NUM_THREADS for a run: --threads, else the environment's, else the
    one this machine kind's stored baseline of this binary was recorded with
    (so that a comparison is like for like), else None (LibTorch's default).
    The series of the binaries set their own thread counts (one thread, or
    all cores); this only affects what they leave at LibTorch's default."""
    if args.threads is not None:
        return str(args.threads)
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    kind = args.kind or os.environ.get("RELOADSAFE_BENCH_KIND")
    if kind:
        kinds = [kind]
    else:
        kinds = os.listdir(args.baselines) if os.path.isdir(args.baselines) else []
    found = recorded_threads(args.baselines, kinds, os.path.basename(binary))
    if found and (kind or len(set(found)) == 1):
        return found[0]
    return None


def binary_command(binary: str, args: Options, out: str, targets: str,
                   repetitions: int) -> list[str]:
    """The command line of one run of `binary`, writing results to `out`
    and its targets to `targets`."""
    cmd = [binary, f"--benchmark_repetitions={repetitions}",
           "--benchmark_enable_random_interleaving=true",
           "--benchmark_display_aggregates_only=true",
           f"--benchmark_out={out}", "--benchmark_out_format=json",
           f"--reloadsafe_targets_out={targets}"]
    if args.min_time is not None:
        cmd.append(f"--benchmark_min_time={args.min_time}")
    if args.filter:
        cmd.append(f"--benchmark_filter={args.filter}")
    return cmd + list(args.binary_args)


def run_binary(binary: str, args: Options, results_dir: str, repetitions: int | None = None,
               tag: str = "") -> str:
    """Runs one binary; returns its results JSON path (<results>/<name><tag>.json,
    targets beside it as .targets.json)."""
    out = os.path.join(results_dir, os.path.basename(binary) + tag + ".json")
    cmd = binary_command(binary, args, out, targets_path(out), repetitions or args.repetitions)
    env = dict(os.environ)
    threads = baseline_threads(args, binary)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    prefix = f"OMP_NUM_THREADS={threads} " if threads is not None else ""
    print("[compare] " + prefix + " ".join(cmd), flush=True)
    log = args.log_file
    subprocess.run(cmd, check=True, env=env, stdout=log,
                   stderr=subprocess.STDOUT if log else None)
    return out


def merge_outputs(paths: list[str], out_path: str) -> str:
    """merge_runs and merge_targets of one binary's runs (each run's targets
    beside its results as .targets.json); returns out_path."""
    merge_runs(paths, out_path)
    merge_targets([targets_path(p) for p in paths], targets_path(out_path))
    return out_path


def run_separately(binary: str, args: Options) -> str:
    """Runs `binary` --repetitions times, one repetition per process, and
    merges the runs into <results>/<name>.json (targets: the median of the
    runs' ratios). Note [Repetitions are processes]: the stored-baseline
    comparison and the recording both sample process-to-process variation,
    as the A/B run does."""
    name = os.path.basename(binary)
    outputs = [run_binary(binary, args, args.results_dir, repetitions=1, tag=f".{i}")
               for i in range(args.repetitions)]
    return merge_outputs(outputs, os.path.join(args.results_dir, name + ".json"))
