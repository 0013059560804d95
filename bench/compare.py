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
--record-missing records this machine's baseline when it has none (the main
job does this) instead of comparing with nothing.

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
  ok      anything else; new / missing / error: benchmarks in only one of the
          two runs, or that failed (an error also makes the exit status 1).
  differs SLOWER or faster against another machine's baseline (information).
  varies  SLOWER or faster for a benchmark the binary lists in its context's
          reloadsafe_informational (name prefixes): its speed depends on state
          outside the code, such as the page cache's folio sizes after
          readahead (information).

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

import argparse
import json
import os
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script it is there; imported from elsewhere, maybe not
    sys.path.insert(0, _HERE)

# (Stats, Row, parse_name, classify, limit_of, is_limit and machine_of are
# imported for compare_test, which uses them as compare.<name>, as are
# merge_runs and merge_targets.)
from benchcmp import bazel, runs  # noqa: E402
from benchcmp.baselines import (  # noqa: E402, F401
    baseline_path,
    check_context,
    describe_machine,
    find_baseline,
    machine_of,
    write_baseline,
)
from benchcmp.charts import chart_throughput, chart_vs_baseline, import_pyplot  # noqa: E402
from benchcmp.names import family_of, matches_filter, parse_name  # noqa: E402, F401
from benchcmp.paths import DEFAULT_BASELINES, TOP  # noqa: E402
from benchcmp.results import Stats, binary_name_of, load_results, merge_runs  # noqa: E402, F401
from benchcmp.rule import (  # noqa: E402, F401
    Row,
    classify,
    compare,
    gating_verdicts,
    is_limit,
    limit_of,
    parse_informational,
    parse_references,
)
from benchcmp.tables import print_table  # noqa: E402
from benchcmp.targets import merge_targets, report_targets, summarize_targets  # noqa: E402, F401

# --- the A/B run ---------------------------------------------------------------

def base_worktree(ref, where, log):
    """A git worktree of commit `ref` at `where` (created, or moved to ref when
    it is already one), with this checkout's user.bazelrc (the disk cache)."""
    commit = subprocess.run(["git", "rev-parse", "--verify", ref + "^{commit}"], cwd=TOP,
                            check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "worktree", "prune"], cwd=TOP, check=True)
    if os.path.exists(os.path.join(where, ".git")):
        subprocess.run(["git", "checkout", "--quiet", "--force", "--detach", commit], cwd=where,
                       check=True, stdout=log, stderr=subprocess.STDOUT if log else None)
    else:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--force", "--detach", where, commit], cwd=TOP,
                       check=True, stdout=log, stderr=subprocess.STDOUT if log else None)
    rc = os.path.join(TOP, "user.bazelrc")
    if os.path.exists(rc):
        with open(rc) as src, open(os.path.join(where, "user.bazelrc"), "w") as dst:
            dst.write(src.read())
    return commit


def default_base_dir():
    cache = os.environ.get("RELOADSAFE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "reloadsafe")
    return os.path.join(cache, "ab-base")


def interleaved_order(rounds):
    """The sides of an A/B run, round by round: base, head, head, base, base,
    head, ... (ABBA), so neither side always runs first after a pause."""
    order = []
    for r in range(rounds):
        order += [("base", "head"), ("head", "base")][r % 2]
    return order


def process(results_path, args, plt, base_results=None):
    """Compares (or records) one results file; returns True if it passes.

    base_results: the A/B base side's results (then no stored baseline is
    used)."""
    cur_ctx, cur = load_results(results_path)
    name = binary_name_of(cur_ctx, results_path)
    kind = args.kind or os.environ.get("RELOADSAFE_BENCH_KIND") or cur_ctx.get("machine_kind")
    if not kind:
        sys.exit(f"[compare] {results_path} has no machine_kind in its context: give --kind")
    machine = machine_of(cur_ctx)
    own_file = baseline_path(args.baselines, kind, machine, name)
    record_cmd = (f"bench/compare.py --update-baseline {name}   "
                  f"(writes {os.path.relpath(own_file, TOP)}; commit it)")
    verdict = {"binary": name, "kind": kind, "machine": machine,
               "machine_description": describe_machine(cur_ctx), "results": results_path}

    if base_results is not None:
        mode = "ab"
        base_file, same = base_results, True
        print(f"\n== {name}: working tree vs {args.base} (A/B, {args.repetitions} interleaved "
              f"runs each; kind {kind}, {describe_machine(cur_ctx)})")
    else:
        base_file, same = find_baseline(args.baselines, kind, machine, name)
        if base_file is None:
            mode = "none"
        else:
            mode = "baseline" if same else "other-machine baseline"
        print(f"\n== {name} (kind {kind}, machine {machine}; baseline "
              f"{os.path.relpath(base_file, TOP) if base_file else 'none'})")
    base_ctx, base = load_results(base_file) if base_file else ({}, {})
    if mode == "other-machine baseline":
        print(f"[compare] the stored baseline was recorded on another machine "
              f"({describe_machine(base_ctx)}; this one: {describe_machine(cur_ctx)}): "
              f"differences are shown for information and never fail. Record a baseline for "
              f"this machine with: {record_cmd}")
    elif mode == "none" and not args.update_baseline and not args.record_missing:
        print(f"[compare] no baseline for this machine yet: {record_cmd}")
    for w in check_context(base_ctx, cur_ctx):
        if mode != "other-machine baseline" or not w.startswith(("cpu_model", "cpu_id", "gpu")):
            print(f"[compare] warning: {w}")
    if args.filter:  # a filtered run is compared with the same part of the baseline
        base = {n: s for n, s in base.items() if matches_filter(args.filter, n)}
    references = parse_references(cur_ctx) or parse_references(base_ctx)
    informational = parse_informational(cur_ctx) or parse_informational(base_ctx)
    rows = gating_verdicts(compare(base, cur, args.threshold, references), same, informational)
    print_table(rows, args.threshold, gating=same)

    targets = report_targets(results_path)

    charts = []
    if plt is not None and args.charts:
        os.makedirs(args.charts, exist_ok=True)
        tp = os.path.join(args.charts, f"{name}_throughput.png")
        if chart_throughput(plt, cur, f"{name} on {kind} ({describe_machine(cur_ctx)})", tp):
            print(f"[compare] chart: {tp}")
            charts.append(tp)
        vb = os.path.join(args.charts, f"{name}_vs_{'base' if mode == 'ab' else 'baseline'}.png")
        title = (f"{name}: working tree vs {args.base}" if mode == "ab"
                 else f"{name} on {kind} vs baseline")
        if chart_vs_baseline(plt, rows, args.threshold, title, vb):
            print(f"[compare] chart: {vb}")
            charts.append(vb)

    errors = [r.name for r in rows if r.verdict == "error"]
    slower = [r.name for r in rows if r.verdict == "SLOWER"]
    families = {}
    for row in rows:
        fam = families.setdefault(family_of(row.name), {})
        fam[row.verdict] = fam.get(row.verdict, 0) + 1
    verdict.update(mode=mode, base=(args.base if mode == "ab" else
                                    (os.path.relpath(base_file, TOP) if base_file else None)),
                   gates=mode in ("ab", "baseline"), slower=slower, errors=errors,
                   families=families, targets=summarize_targets(targets), charts=charts,
                   threshold=args.threshold)

    ok = not errors and not slower
    if args.update_baseline or (args.record_missing and mode == "none"):
        if errors:
            print(f"[compare] not recording a baseline with failed benchmarks: {errors}")
            ok = False
        elif cur_ctx.get("reloadsafe_build", "opt") != "opt" and not args.force:
            print("[compare] not recording a baseline from an unoptimised build (--force to "
                  "override)")
            ok = False
        else:
            write_baseline(results_path, own_file, merge=bool(args.filter))
            print(f"[compare] baseline recorded for this machine: "
                  f"{os.path.relpath(own_file, TOP)} (commit it to keep it)")
            verdict["recorded"] = os.path.relpath(own_file, TOP)
            ok = True
    elif slower:
        print(f"[compare] {len(slower)} benchmark(s) slower than the "
              f"{'base' if mode == 'ab' else 'baseline'} beyond {args.threshold:.0%}")
    verdict["passed"] = ok
    with open(os.path.join(args.results_dir, f"{name}.verdict.json"), "w") as f:
        json.dump(verdict, f, indent=1)
    return ok


def run_ab(specs, args, plt):
    """--base: builds both sides, runs them interleaved, compares each binary
    of the working tree with the base's. Returns True if all pass."""
    names = [s for s in specs if not s.endswith(".json")]
    if len(names) != len(specs) or any(os.sep in s for s in names):
        sys.exit("[compare] --base takes benchmark names (copy_bench), not paths or results")
    log = args.log_file
    where = args.base_dir or default_base_dir()
    commit = base_worktree(args.base, where, log)
    print(f"[compare] base: {args.base} = {commit[:12]} in {where}", flush=True)
    # A benchmark the base does not have yet runs on the working tree only:
    # every one of its benchmarks is "new".
    on_base = [n for n in names if bazel.has_benchmark(n, where)]
    for n in names:
        if n not in on_base:
            print(f"[compare] {args.base} has no //bench:{n}: its benchmarks are new", flush=True)
    if not args.no_build:
        bazel.build(names, TOP, log)
        bazel.build(on_base, where, log)
        bazel.stop_bazel(where)
    ok = True
    for name in names:
        sides = {"head": bazel.resolve_binary(name, TOP)}
        if name in on_base:
            sides["base"] = bazel.resolve_binary(name, where)
        outputs = {"head": [], "base": []}
        for i, side in enumerate(interleaved_order(args.repetitions)):
            if side in sides:
                outputs[side].append(runs.run_binary(sides[side], args, args.results_dir,
                                                repetitions=1, tag=f".{side}.{i // 2}"))
        head = runs.merge_outputs(outputs["head"], os.path.join(args.results_dir, f"{name}.json"))
        base = runs.merge_outputs(outputs["base"], os.path.join(args.results_dir, f"{name}.base.json"))
        ok = process(head, args, plt, base_results=base) and ok
    return ok


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                   help="record this machine's baseline if it has none, instead of comparing")
    p.add_argument("--force", action="store_true",
                   help="with --update-baseline: record even an unoptimised build")
    p.add_argument("--baselines", default=DEFAULT_BASELINES, help=argparse.SUPPRESS)
    p.add_argument("--results-dir", help="where results JSON go (default: a new temporary folder)")
    p.add_argument("--charts", help="folder for PNG charts (default: the results folder)")
    p.add_argument("--no-charts", action="store_true")
    p.add_argument("--no-build", action="store_true", help="do not run bazel build first")
    p.add_argument("--log", help="file for the build and benchmark output (default: the terminal)")
    p.epilog = "Arguments after -- go to the benchmark binaries (e.g. -- --reloadsafe_large)."
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    args = p.parse_args(argv)
    args.binary_args = passthrough
    if args.base and args.update_baseline:
        p.error("--base compares two builds; record a baseline without it")

    args.results_dir = args.results_dir or tempfile.mkdtemp(prefix="reloadsafe_bench_")
    os.makedirs(args.results_dir, exist_ok=True)
    args.log_file = open(args.log, "a") if args.log else None
    if args.no_charts:
        args.charts = None
        plt = None
    else:
        args.charts = args.charts or args.results_dir
        plt = import_pyplot()
        if plt is None:
            print("[compare] matplotlib is not installed: charts skipped "
                  "(pip install matplotlib, or apt-get install python3-matplotlib)")

    if args.base:
        ok = run_ab(args.bench, args, plt)
    else:
        names = [s for s in args.bench
                 if not s.endswith(".json") and os.sep not in s and not os.path.exists(s)]
        if names and not args.no_build:
            bazel.build(names, TOP, args.log_file)
        ok = True
        for spec in args.bench:
            if spec.endswith(".json"):
                results = spec
            else:
                results = runs.run_separately(bazel.resolve_binary(spec), args)
            ok = process(results, args, plt) and ok
    print(f"\n[compare] results in {args.results_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
