#!/usr/bin/env python3
"""Runs reloadsafe's benchmarks repeatedly and compares them with a baseline.

    bench/compare.py --base main copy_bench replace_bench   # A/B: the CI regression check
    bench/compare.py copy_bench replace_bench          # against this machine's stored baseline
    bench/compare.py --update-baseline copy_bench      # record this machine's baseline
    bench/compare.py results/copy_bench.json           # compare a finished run
    bench/compare.py copy_bench -- --reloadsafe_large  # arguments for the binary

Each BENCH is a benchmark name (built with `bazel build -c opt //bench:NAME`
and run from bazel-bin), a path to a benchmark binary (on a machine without
Bazel), or a results JSON file written by one (compared as it is). A binary
runs N times (--repetitions), one repetition per process (Note [Repetitions
are processes]), with --benchmark_enable_random_interleaving=true, and writes
Google Benchmark JSON, with the machine context, to --results-dir; the runs
are merged into <binary>.json, the targets are the medians of the runs'.

A/B (--base REF): builds the benchmarks of git commit REF in a separate
worktree (the same Bazel disk cache, so unchanged code is not recompiled) and
those of the working tree, runs both sides alternately (ABBA...) in one run,
one repetition per invocation, and judges the working tree against REF with
the rule below. Both sides see the same machine at the same time: this is
the check that works on any machine, CI runners included.

Stored baselines live in bench/baselines/<kind>/<machine>/<binary>.json
(Google Benchmark JSON, as the binary wrote it). The kind is --kind, else
$RELOADSAFE_BENCH_KIND, else the machine_kind the binary reports in its
context ("cpu-2core" on a 2-core machine without a GPU, the GPU's name such as
"nvidia-h200" with one); <machine> is the CPU model (with, on x86, its family
and model numbers) as a slug, plus the GPU model where there is one
("amd-epyc-family-25-model-1", "intel-xeon-platinum-8480-family-6-model-143__nvidia-h200").
Only a baseline of the same machine gates. A baseline of the same kind but
another CPU or GPU model is compared for information (verdict "differs", never
a failure), with the command that records one for this machine.
--record-missing records this machine's baseline when it has none, beside
other machines' or alone (the main job does this), from 3 runs or more.

The rule (time per iteration, per benchmark, over the repetitions):
  SLOWER  median > baseline median * (1 + threshold)  AND  min > baseline max
          AND, for a benchmark measured against a limit of the same run (the
          binary's context lists them as reloadsafe_references: a copy
          strategy against memcpy, a replace_parameter path against memcpy),
          its slowdown relative to that limit, (median / limit median) over
          the baseline's (median / limit median), is also > 1 + threshold.
          The slowdown is beyond the threshold, the two runs' min..max ranges
          do not overlap, and it is not the machine as a whole being slower.
          Any SLOWER benchmark makes the exit status 1.
  machine the first two conditions hold, but the limit slowed about as much
          (reported, never fails).
  limit slower / limit faster: a limit itself moved (reported, never fails).
  faster  the mirror image of the first two conditions (reported).
  few runs  SLOWER or faster, but a side has fewer than 3 repetitions: too
          few for ranges apart to tell a change from noise (reported, never
          fails; rule.py's Note [Too few runs to gate]).
  ok      anything else; new / missing / error: benchmarks in only one of the
          two runs, or that failed (an error also makes the exit status 1).
  differs SLOWER or faster against another machine's baseline (information).
  varies  SLOWER or faster for a benchmark the binary lists in its context's
          reloadsafe_informational (name prefixes): its speed depends on state
          outside the code, such as the page cache's folio sizes after
          readahead (information).
  other kernel  SLOWER or faster for a benchmark the binary lists in its
          context's reloadsafe_kernel_dependent (reads through the page
          cache), against a baseline recorded under another kernel
          (information; A/B judges it).

A limit may have alternatives ("memcpy/|stream_copy/"): the fastest of those
measured in both runs is used.

Besides the tables, each binary's verdict goes to <results>/<binary>.verdict.json
(mode, verdict counts per benchmark family, targets per family, charts), which
tools/report.py reads.

Threads: LibTorch's copy_ runs on OMP_NUM_THREADS threads. A run uses
--threads, else $OMP_NUM_THREADS, else the value the baseline was recorded
with (its context's omp_env), so that both sides of a comparison match.

Charts (PNG, with matplotlib if it can be imported; otherwise the command says
so and skips them): <binary>_throughput.png (throughput by series and size,
limits dashed) and <binary>_vs_baseline.png (each benchmark's median time
against its baseline's).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script it is there; imported from elsewhere, maybe not
    sys.path.insert(0, _HERE)

from benchcmp import cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """compare.py with `argv` (without the program's name; None: the command
    line's); returns its exit status. The code is in benchcmp/ (cli.py)."""
    return cli.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
