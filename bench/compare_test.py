#!/usr/bin/env python3
"""Tests of bench/compare.py's comparison rule and baseline handling, on
canned Google Benchmark JSON (no benchmark binary runs)."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from benchcmp import ab, baselines, bazel, names, paths, rule, runs, targets  # noqa: E402
from benchcmp import results as bench_results  # noqa: E402


def results(times_by_name, kind="testkind", unit="us", error=None, build="opt", cpu=None):
    """Google Benchmark JSON with one iteration entry per repetition."""
    benchmarks = []
    for name, times in times_by_name.items():
        for i, t in enumerate(times):
            b = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": len(times),
                 "repetition_index": i, "iterations": 10, "real_time": t, "cpu_time": t,
                 "time_unit": unit, "bytes_per_second": 1e6 / t}
            if error == name:
                b.update(error_occurred=True, error_message="broken")
            benchmarks.append(b)
        benchmarks.append({"name": name + "_median", "run_name": name, "run_type": "aggregate",
                           "aggregate_name": "median", "real_time": sorted(times)[len(times) // 2],
                           "time_unit": unit})
    context = {"executable": "/x/fake_bench", "machine_kind": kind, "reloadsafe_build": build}
    if cpu:
        context["cpu_model"] = cpu
    return {"context": context, "benchmarks": benchmarks}


class ClassifyTest(unittest.TestCase):
    def stats(self, times):
        return bench_results.Stats("b", times, [])

    def test_table(self):
        cases = [
            # (baseline times, current times, verdict)
            ("same", [10, 11, 12], [10, 11, 12], "ok"),
            ("slower, ranges apart", [10, 11, 12], [20, 21, 22], "SLOWER"),
            ("slower but ranges overlap", [10, 11, 30], [20, 21, 22], "ok"),
            ("ranges apart, within threshold", [10, 10, 10], [12, 12, 12], "ok"),
            ("just past threshold", [10, 10, 10], [12.6, 12.6, 12.6], "SLOWER"),
            ("faster", [20, 21, 22], [10, 11, 12], "faster"),
            # Note [Too few runs to gate]: fewer than 3 a side only informs.
            ("one repetition each", [10], [13], "few runs"),
            ("two against five", [10, 10, 11, 11, 12], [20, 21], "few runs"),
            ("five against two", [10, 11], [20, 20, 21, 21, 22], "few runs"),
            ("two against five, faster", [20, 20, 21, 21, 22], [10, 11], "few runs"),
            ("three against five", [10, 10, 11, 11, 12], [20, 21, 22], "SLOWER"),
            ("two against five, within noise", [10, 10, 11, 11, 20], [19, 21], "ok"),
        ]
        for name, base, cur, verdict in cases:
            with self.subTest(name):
                self.assertEqual(
                    rule.classify(self.stats(base), self.stats(cur), 0.25), verdict)

    def test_relative_to_limit(self):
        base, cur = self.stats([10, 11, 12]), self.stats([20, 21, 22])
        # The limit slowed as much: the machine, not the code.
        self.assertEqual(rule.classify(base, cur, 0.25, relative=1.05), "machine")
        self.assertEqual(rule.classify(base, cur, 0.25, relative=1.6), "SLOWER")
        self.assertEqual(rule.classify(base, cur, 0.25, limit=True), "limit slower")
        # A limit's own move is reported whatever the number of runs.
        one, two = self.stats([10]), self.stats([20])
        self.assertEqual(rule.classify(one, two, 0.25, limit=True), "limit slower")
        self.assertEqual(rule.classify(two, one, 0.25, limit=True), "limit faster")
        self.assertEqual(rule.classify(one, two, 0.25, relative=1.05), "machine")

    def test_references_pair_by_size(self):
        refs = rule.parse_references(
            {"reloadsafe_references": "BM_R/in_place/=BM_R/memcpy/;BM_R/placed/=BM_R/memcpy/"})
        stats = {"BM_R/memcpy/bytes:8/real_time": None, "BM_R/memcpy/bytes:16/real_time": None}
        self.assertEqual(rule.limit_of("BM_R/in_place/bytes:16/real_time", refs, stats),
                         "BM_R/memcpy/bytes:16/real_time")
        self.assertIsNone(rule.limit_of("BM_R/in_place/bytes:32/real_time", refs, stats))
        self.assertIsNone(rule.limit_of("BM_R/memcpy/bytes:8/real_time", refs, stats))
        self.assertTrue(rule.is_limit("BM_R/memcpy/bytes:8/real_time", refs))

    def test_limit_alternatives_take_the_fastest_in_both_runs(self):
        refs = rule.parse_references({"reloadsafe_references": "BM_R/a/=BM_R/memcpy/|BM_R/stream/"})
        cur = {"BM_R/memcpy/bytes:8/real_time": bench_results.Stats("m", [10], []),
               "BM_R/stream/bytes:8/real_time": bench_results.Stats("s", [5], []),
               "BM_R/a/bytes:8/real_time": bench_results.Stats("a", [12], [])}
        self.assertEqual(rule.limit_of("BM_R/a/bytes:8/real_time", refs, cur),
                         "BM_R/stream/bytes:8/real_time")
        # A base without the streaming limit: the alternative both runs have.
        base = {"BM_R/memcpy/bytes:8/real_time": None}
        self.assertEqual(rule.limit_of("BM_R/a/bytes:8/real_time", refs, cur, also_in=base),
                         "BM_R/memcpy/bytes:8/real_time")
        self.assertTrue(rule.is_limit("BM_R/stream/bytes:8/real_time", refs))
        self.assertFalse(rule.is_limit("BM_R/a/bytes:8/real_time", refs))

    def test_new_missing_error(self):
        s = self.stats([1])
        self.assertEqual(rule.classify(None, s, 0.25), "new")
        self.assertEqual(rule.classify(s, None, 0.25), "missing")
        self.assertEqual(rule.classify(s, bench_results.Stats("b", [], [], error="x"), 0.25), "error")


class ProcessTimeTest(unittest.TestCase):
    def test_process_time_benchmarks_are_judged_by_cpu_time(self):
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        data = results({"BM_A/process_time": [10], "BM_B/real_time": [10]})
        for b in data["benchmarks"]:
            if b["run_type"] == "iteration":
                b["cpu_time"] = 4  # preempted: the wall clock ran 10, the CPU 4
        path = os.path.join(d, "r.json")
        with open(path, "w") as f:
            json.dump(data, f)
        _, stats = bench_results.load_results(path)
        self.assertEqual(stats["BM_A/process_time"].times, [4000])
        self.assertEqual(stats["BM_B/real_time"].times, [10000])
        self.assertEqual(names.parse_name("BM_C/x/traced/bytes:8/process_time"),
                         ("BM_C/x", "traced", 8))


class ParseNameTest(unittest.TestCase):
    def test_names(self):
        self.assertEqual(
            names.parse_name("BM_FileCopy/cpu/warm/pread/bytes:1048576/manual_time"),
            ("BM_FileCopy/cpu/warm", "pread", 1048576))
        self.assertEqual(names.parse_name("BM_Replace/memcpy/bytes:4096/real_time"),
                         ("BM_Replace", "memcpy", 4096))
        self.assertEqual(names.parse_name("BM_InOwnStorage/decision_unplaced/real_time"),
                         ("BM_InOwnStorage", "decision_unplaced", None))


class FilterTest(unittest.TestCase):
    def test_filter(self):
        self.assertTrue(names.matches_filter("cpu/warm", "BM_FileCopy/cpu/warm/pread/bytes:1"))
        self.assertFalse(names.matches_filter("-cpu/warm", "BM_FileCopy/cpu/warm/pread"))
        self.assertTrue(names.matches_filter("bytes:4096/|decision", "BM_InOwnStorage/decision"))


class MainCase(unittest.TestCase):
    """compare.main on results files written to a temporary folder, with the
    stored baselines in a folder of their own."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.baselines = os.path.join(self.dir, "baselines")

    def write(self, name, data):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(data, f)
        return path

    def run_main(self, *argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = compare.main(["--baselines", self.baselines, "--no-charts",
                               "--results-dir", self.dir, *argv])
        return rc, out.getvalue()


class MainTest(MainCase):
    def test_update_then_gate(self):
        base = self.write("base.json", results({"BM_A/bytes:8/real_time": [10, 11, 12]}))
        rc, out = self.run_main("--update-baseline", base)
        self.assertEqual(rc, 0, out)
        recorded = os.path.join(self.baselines, "testkind", "unknown-cpu", "fake_bench.json")
        self.assertTrue(os.path.exists(recorded))

        same = self.write("same.json", results({"BM_A/bytes:8/real_time": [10, 12, 13]}))
        self.assertEqual(self.run_main(same)[0], 0)
        slow = self.write("slow.json", results({"BM_A/bytes:8/real_time": [20, 21, 22]}))
        rc, out = self.run_main(slow)
        self.assertEqual(rc, 1, out)
        self.assertIn("SLOWER", out)
        # A larger threshold lets the same slowdown pass.
        self.assertEqual(self.run_main("--threshold", "1.5", slow)[0], 0)

    def test_kind_from_flag_and_env(self):
        base = self.write("base.json", results({"BM_A/real_time": [1]}))
        self.run_main("--kind", "other", "--update-baseline", base)
        self.assertTrue(os.path.exists(os.path.join(self.baselines, "other", "unknown-cpu", "fake_bench.json")))
        os.environ["RELOADSAFE_BENCH_KIND"] = "fromenv"
        try:
            self.run_main("--update-baseline", base)
        finally:
            del os.environ["RELOADSAFE_BENCH_KIND"]
        self.assertTrue(os.path.exists(os.path.join(self.baselines, "fromenv", "unknown-cpu", "fake_bench.json")))

    def test_machine_slowdown_does_not_fail(self):
        def run(code, limit):
            data = results({"BM_A/bytes:8/real_time": code, "BM_L/bytes:8/real_time": limit})
            data["context"]["reloadsafe_references"] = "BM_A/=BM_L/"
            return data
        self.run_main("--update-baseline", self.write("b.json", run([10, 11, 12], [5, 5, 5])))
        # Everything twice as slow: the limit too.
        rc, out = self.run_main(self.write("m.json", run([20, 21, 22], [10, 10, 10])))
        self.assertEqual(rc, 0, out)
        self.assertIn("machine", out)
        self.assertIn("limit slower", out)
        # Only the code slower.
        rc, out = self.run_main(self.write("c.json", run([20, 21, 22], [5, 5, 5])))
        self.assertEqual(rc, 1, out)

    def test_errors_fail_and_are_not_recorded(self):
        bad = self.write("bad.json", results({"BM_A/real_time": [1]}, error="BM_A/real_time"))
        rc, out = self.run_main("--update-baseline", bad)
        self.assertEqual(rc, 1, out)
        self.assertFalse(os.path.exists(os.path.join(self.baselines, "testkind")))

    def test_unoptimised_build_is_not_recorded(self):
        dbg = self.write("dbg.json", results({"BM_A/real_time": [1]}, build="unoptimized"))
        self.assertEqual(self.run_main("--update-baseline", dbg)[0], 1)
        self.assertEqual(self.run_main("--update-baseline", "--force", dbg)[0], 0)

    def test_threads_follow_the_baseline(self):
        data = results({"BM_A/real_time": [1]})
        data["context"]["omp_env"] = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=(unset)"
        self.run_main("--update-baseline", self.write("base.json", data))
        args: Any = type("Args", (), {"threads": None, "kind": None, "baselines": self.baselines})
        saved = os.environ.pop("OMP_NUM_THREADS", None)
        try:
            self.assertEqual(runs.baseline_threads(args, "/x/fake_bench"), "1")
            args.threads = 4
            self.assertEqual(runs.baseline_threads(args, "/x/fake_bench"), "4")
            args.threads = None
            self.assertIsNone(runs.baseline_threads(args, "/x/other_bench"))
        finally:
            if saved is not None:
                os.environ["OMP_NUM_THREADS"] = saved

    def test_filtered_update_merges(self):
        full = self.write("full.json", results({"BM_A/real_time": [1], "BM_B/real_time": [2]}))
        self.run_main("--update-baseline", full)
        part = self.write("part.json", results({"BM_B/real_time": [5]}))
        rc, out = self.run_main("--filter", "BM_B", part)
        self.assertNotIn("missing", out)  # BM_A was filtered out, not lost
        self.run_main("--update-baseline", "--filter", "BM_B", part)
        _, stats = bench_results.load_results(os.path.join(self.baselines, "testkind", "unknown-cpu", "fake_bench.json"))
        self.assertEqual(stats["BM_A/real_time"].median, 1000)  # us -> ns, kept
        self.assertEqual(stats["BM_B/real_time"].median, 5000)  # replaced

    def test_a_filtered_update_does_not_relabel_kernel_dependent_entries(self):
        # Table: (benchmarks the filtered run records, its kernel) -> recorded.
        # The stored baseline: BM_FileCopy/a (kernel-dependent) and BM_Replace/b,
        # both under kernel A.
        cases = [
            ({"BM_Replace/b/real_time": [5]}, "A", True),  # same kernel: merged
            ({"BM_Replace/b/real_time": [5]}, "B", False),  # would relabel BM_FileCopy/a
            ({"BM_FileCopy/a/real_time": [5]}, "B", True),  # re-records every kernel-dependent one
        ]
        stored = os.path.join(self.baselines, "testkind", "unknown-cpu", "fake_bench.json")

        def run(times, kernel):
            data = results(times)
            data["context"].update(kernel=f"Linux 6.18 {kernel}", reloadsafe_kernel_dependent="BM_FileCopy/")
            return self.write(f"{kernel}.json", data)

        for times, kernel, recorded in cases:
            with self.subTest(times=times, kernel=kernel):
                self.run_main("--update-baseline", run({"BM_FileCopy/a/real_time": [1], "BM_Replace/b/real_time": [2]},
                                                       "A"))
                with open(stored) as f:
                    before = f.read()
                name = next(iter(times)).split("/real_time")[0]
                rc, out = self.run_main("--update-baseline", "--filter", name, run(times, kernel))
                with open(stored) as f:
                    after = f.read()
                self.assertEqual(rc == 0, recorded, out)
                self.assertEqual(after != before, recorded, out)
                if not recorded:
                    self.assertIn("kernel-dependent benchmarks it keeps (e.g. BM_FileCopy/a/real_time)", out)


class MachineTest(unittest.TestCase):
    def test_machine_of(self):
        cases = [
            ({"cpu_model": "AMD EPYC"}, "amd-epyc"),
            ({"cpu_model": "AMD EPYC", "cpu_id": "family 25 model 1"}, "amd-epyc-family-25-model-1"),
            ({"cpu_model": "AMD EPYC", "cpu_id": "family 25 model 17"},
             "amd-epyc-family-25-model-17"),
            ({"cpu_model": "Arm implementer 0x41 part 0xd4f", "cpu_id": ""},
             "arm-implementer-0x41-part-0xd4f"),
            ({"cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz"}, "intel-r-xeon-r-cpu-2-20ghz"),
            ({"cpu_model": "AMD EPYC", "gpu": "none (no driver)"}, "amd-epyc"),
            ({"cpu_model": "AMD EPYC", "gpu": "NVIDIA H200", "gpu_driver": "580"},
             "amd-epyc__nvidia-h200"),
            ({}, "unknown-cpu"),
        ]
        for ctx, want in cases:
            with self.subTest(want):
                self.assertEqual(baselines.machine_of(ctx), want)


class MachineBaselineTest(MainCase):
    """Stored baselines are keyed by machine; only the same machine gates."""

    def test_other_cpu_informs_never_fails(self):
        self.run_main("--update-baseline",
                      self.write("amd.json", results({"BM_A/bytes:8/real_time": [10, 11, 12]},
                                                     cpu="AMD EPYC")))
        self.assertTrue(os.path.exists(
            os.path.join(self.baselines, "testkind", "amd-epyc", "fake_bench.json")))
        slow = results({"BM_A/bytes:8/real_time": [30, 31, 32]}, cpu="Intel Xeon")
        rc, out = self.run_main(self.write("intel.json", slow))
        self.assertEqual(rc, 0, out)
        self.assertIn("differs", out)
        self.assertNotIn("SLOWER", out)
        self.assertIn("--update-baseline", out)  # says how to record one for this machine
        with open(os.path.join(self.dir, "fake_bench.verdict.json")) as f:
            v = json.load(f)
        self.assertEqual(v["mode"], "other-machine baseline")
        self.assertFalse(v["gates"])
        # The same slowdown on the machine the baseline came from fails.
        rc, out = self.run_main(self.write("amd2.json", results(
            {"BM_A/bytes:8/real_time": [30, 31, 32]}, cpu="AMD EPYC")))
        self.assertEqual(rc, 1, out)
        self.assertIn("SLOWER", out)

    def test_record_missing(self):
        data = self.write("x.json", results({"BM_A/real_time": [1, 1, 1]}, cpu="Intel Xeon"))
        rc, out = self.run_main("--record-missing", data)
        self.assertEqual(rc, 0, out)
        path = os.path.join(self.baselines, "testkind", "intel-xeon", "fake_bench.json")
        self.assertTrue(os.path.exists(path))
        with open(os.path.join(self.dir, "fake_bench.verdict.json")) as f:
            self.assertIn("recorded", json.load(f))
        # Once there, --record-missing compares (and gates) instead.
        slow = self.write("y.json", results({"BM_A/real_time": [5, 5, 5]}, cpu="Intel Xeon"))
        rc, out = self.run_main("--record-missing", slow)
        self.assertEqual(rc, 1, out)

    def test_record_missing_beside_another_machines_baseline(self):
        self.run_main("--update-baseline", self.write("amd.json", results(
            {"BM_A/real_time": [1, 1, 1]}, cpu="AMD EPYC")))
        # Two runs are too few to record: it says how to record one anyway.
        few = self.write("few.json", results({"BM_A/real_time": [3, 3]}, cpu="Intel Xeon"))
        rc, out = self.run_main("--record-missing", few)
        self.assertEqual(rc, 0, out)
        self.assertNotIn("recorded as this machine's baseline", out)
        self.assertIn("--update-baseline", out)
        self.assertFalse(os.path.exists(
            os.path.join(self.baselines, "testkind", "intel-xeon", "fake_bench.json")))
        # This machine has none of its own: the run is shown against the other
        # machine's (information) and recorded as this machine's.
        data = self.write("x.json", results({"BM_A/real_time": [3, 3, 3]}, cpu="Intel Xeon"))
        rc, out = self.run_main("--record-missing", data)
        self.assertEqual(rc, 0, out)
        self.assertIn("differs", out)
        self.assertIn("recorded as this machine's baseline", out)
        self.assertNotIn("--update-baseline", out)  # nothing left to do by hand
        self.assertTrue(os.path.exists(
            os.path.join(self.baselines, "testkind", "intel-xeon", "fake_bench.json")))
        with open(os.path.join(self.dir, "fake_bench.verdict.json")) as f:
            v = json.load(f)
        self.assertEqual(v["mode"], "other-machine baseline")
        self.assertIn("recorded", v)
        # From then on this machine's own baseline gates.
        slow = self.write("y.json", results({"BM_A/real_time": [9, 9, 9]}, cpu="Intel Xeon"))
        rc, out = self.run_main("--record-missing", slow)
        self.assertEqual(rc, 1, out)
        self.assertIn("SLOWER", out)

    def test_record_missing_needs_enough_runs_to_gate(self):
        cases = [([1, 1], False), ([1, 1, 1], True)]
        for times, recorded in cases:
            with self.subTest(runs=len(times)):
                cpu = f"Cpu {len(times)}"
                rc, out = self.run_main("--record-missing", self.write(
                    "x.json", results({"BM_A/real_time": times}, cpu=cpu)))
                self.assertEqual(rc, 0, out)
                path = os.path.join(self.baselines, "testkind", f"cpu-{len(times)}",
                                    "fake_bench.json")
                self.assertEqual(os.path.exists(path), recorded, out)
                if not recorded:
                    self.assertIn("not recording a baseline from 2 run(s)", out)
                    self.assertIn("--update-baseline", out)  # says how to record one anyway
                else:
                    self.assertIn("baseline recorded for this machine", out)
        # An explicit --update-baseline records whatever it is given.
        rc, out = self.run_main("--update-baseline", self.write(
            "z.json", results({"BM_A/real_time": [1, 1]}, cpu="Cpu 2")))
        self.assertEqual(rc, 0, out)
        self.assertTrue(os.path.exists(
            os.path.join(self.baselines, "testkind", "cpu-2", "fake_bench.json")))


class InterleaveTest(unittest.TestCase):
    def test_abba(self):
        self.assertEqual(ab.interleaved_order(3),
                         ["base", "head", "head", "base", "base", "head"])

    def test_merge_runs_and_targets(self):
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        paths, tpaths = [], []
        for i, (t, ratio) in enumerate([(10, 0.8), (12, 0.95), (11, 0.92)]):
            p = os.path.join(d, f"r{i}.json")
            with open(p, "w") as f:
                json.dump(results({"BM_A/bytes:8/real_time": [t]}), f)
            paths.append(p)
            tp = os.path.join(d, f"r{i}.targets.json")
            with open(tp, "w") as f:
                json.dump({"basis": "one run", "targets": [
                    {"description": "a / limit", "bytes": 8, "value": ratio, "bound": 0.9,
                     "comparison": ">=", "met": ratio >= 0.9, "benchmark": "BM_A"}]}, f)
            tpaths.append(tp)
        merged = bench_results.merge_runs(paths, os.path.join(d, "m.json"))
        _, stats = bench_results.load_results(merged)
        self.assertEqual(stats["BM_A/bytes:8/real_time"].times, [10000, 11000, 12000])
        targets.merge_targets(tpaths, os.path.join(d, "m.targets.json"))
        with open(os.path.join(d, "m.targets.json")) as f:
            t = json.load(f)["targets"]
        self.assertEqual(len(t), 1)
        self.assertAlmostEqual(t[0]["value"], 0.92)  # the median of the runs' ratios
        self.assertTrue(t[0]["met"])
        self.assertEqual(t[0]["runs"], 3)


class FakeRunsCase(unittest.TestCase):
    """compare.main with the build and the binaries replaced by canned results."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.saved = [(m, n, getattr(m, n)) for m, n in
                      ((ab, "base_worktree"), (bazel, "build"), (bazel, "resolve_binary"),
                       (runs, "run_binary"), (bazel, "stop_bazel"), (bazel, "has_benchmark"))]
        bazel.stop_bazel = lambda cwd: None
        bazel.has_benchmark = lambda name, cwd: True
        self.calls = []
        ab.base_worktree = lambda ref, where, log: "0" * 40
        bazel.build = lambda names, cwd, log: None
        bazel.resolve_binary = lambda spec, cwd=paths.TOP: os.path.join(
            "/base" if cwd != paths.TOP else "/head", spec)

    def tearDown(self):
        for m, n, f in self.saved:
            setattr(m, n, f)

    baselines_dir = "none"  # under self.dir: A/B needs no stored baseline

    def fake_runs(self, times, context=None):
        """run_binary writing `times[side]` (a list, one per call) as the
        results, with `context`'s entries added to the binary's; each call's
        side goes to self.calls, its repetitions to self.repetitions."""
        counters = {"head": 0, "base": 0}
        self.repetitions: list[int | None] = []

        def run(binary, args, results_dir, repetitions=None, tag=""):
            side = "base" if binary.startswith("/base") else "head"
            self.calls.append(side)
            self.repetitions.append(repetitions)
            t = times[side][counters[side] % len(times[side])]
            counters[side] += 1
            data = results({"BM_A/bytes:8/real_time": [t], "BM_L/bytes:8/real_time": [5]})
            data["context"]["executable"] = binary
            data["context"]["reloadsafe_references"] = "BM_A/=BM_L/"
            data["context"].update(context or {})
            out = os.path.join(results_dir, os.path.basename(binary) + tag + ".json")
            with open(out, "w") as f:
                json.dump(data, f)
            return out
        runs.run_binary = run

    def run_main(self, *argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = compare.main(["--no-charts", "--results-dir", self.dir,
                               "--baselines", os.path.join(self.dir, self.baselines_dir), *argv])
        return rc, out.getvalue()


class ABTest(FakeRunsCase):
    """--base: both sides run interleaved and are judged against each other."""

    def test_head_slower_than_base_fails(self):
        self.fake_runs({"head": [20, 21, 22], "base": [10, 11, 12]})
        rc, out = self.run_main("--base", "main", "--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 1, out)
        self.assertIn("SLOWER", out)
        self.assertEqual(self.calls, ["base", "head", "head", "base", "base", "head"])
        with open(os.path.join(self.dir, "fake_bench.verdict.json")) as f:
            v = json.load(f)
        self.assertEqual(v["mode"], "ab")
        self.assertTrue(v["gates"])
        self.assertEqual(v["slower"], ["BM_A/bytes:8/real_time"])
        _, merged = bench_results.load_results(os.path.join(self.dir, "fake_bench.json"))
        self.assertEqual(len(merged["BM_A/bytes:8/real_time"].times), 3)

    def test_same_speed_passes_and_no_baseline_is_needed(self):
        self.fake_runs({"head": [10, 11, 12], "base": [11, 10, 12]})
        rc, out = self.run_main("--base", "main", "--repetitions", "4", "fake_bench")
        self.assertEqual(rc, 0, out)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "none")))

    def test_ranges_overlapping_pass(self):
        self.fake_runs({"head": [10, 30, 31], "base": [11, 12, 29]})
        rc, out = self.run_main("--base", "main", "--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 0, out)

    def test_a_benchmark_the_base_lacks_runs_on_the_working_tree_as_new(self):
        self.fake_runs({"head": [10, 11, 12], "base": [1]})
        bazel.has_benchmark = lambda name, cwd: cwd == paths.TOP
        rc, out = self.run_main("--base", "main", "--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 0, out)
        self.assertEqual(self.calls, ["head", "head", "head"])
        with open(os.path.join(self.dir, "fake_bench.verdict.json")) as f:
            v = json.load(f)
        self.assertEqual(v["mode"], "ab")
        self.assertEqual({k for fam in v["families"].values() for k in fam}, {"new"})


class InformationalTest(unittest.TestCase):
    def test_informational_prefixes_vary_and_never_gate(self):
        base, cur = bench_results.Stats("x", [10, 11, 12], []), bench_results.Stats("x", [30, 31, 32], [])
        rows = [rule.Row("BM_F/reread/a", base, cur, 3.0, 3.0, "SLOWER"),
                rule.Row("BM_F/warm/a", base, cur, 3.0, 3.0, "SLOWER"),
                rule.Row("BM_F/reread/b", cur, base, 0.3, 0.3, "faster")]
        ctx = {"reloadsafe_informational": "BM_F/reread/;BM_G/"}
        self.assertEqual(rule.parse_informational(ctx), ["BM_F/reread/", "BM_G/"])
        got = [r.verdict for r in rule.gating_verdicts(rows, True, rule.parse_informational(ctx))]
        self.assertEqual(got, ["varies", "SLOWER", "varies"])
        got = [r.verdict for r in rule.gating_verdicts(rows, False, ["BM_F/reread/"])]
        self.assertEqual(got, ["differs", "differs", "differs"])


class KernelDependentTest(unittest.TestCase):
    def rows(self):
        base, cur = bench_results.Stats("x", [10, 11, 12], []), bench_results.Stats("x", [30, 31, 32], [])
        return [rule.Row("BM_FileCopy/cpu/warm/a", base, cur, 3.0, 3.0, "SLOWER"),
                rule.Row("BM_Replace/a", base, cur, 3.0, 3.0, "SLOWER"),
                rule.Row("BM_FileCopy/cpu/cold/a", cur, base, 0.3, 0.3, "faster"),
                rule.Row("BM_FileCopy/cpu/warm/b", base, base, 1.0, 1.0, "ok")]

    def test_under_another_kernel_only_the_kernel_dependent_benchmarks_stop_gating(self):
        # Table: (same machine, other kernel) -> verdicts.
        cases = [
            (True, True, ["other kernel", "SLOWER", "other kernel", "ok"]),
            (True, False, ["SLOWER", "SLOWER", "faster", "ok"]),
            (False, True, ["differs", "differs", "differs", "ok"]),
        ]
        ctx = {"reloadsafe_kernel_dependent": "BM_FileCopy/"}
        for same_machine, other_kernel, want in cases:
            with self.subTest(same_machine=same_machine, other_kernel=other_kernel):
                got = rule.gating_verdicts(self.rows(), same_machine, other_kernel=other_kernel,
                                           kernel_dependent=rule.parse_kernel_dependent(ctx))
                self.assertEqual([r.verdict for r in got], want)

    def test_the_kernel_is_the_release_without_the_build_details(self):
        a = {"kernel": "Linux 6.18.44-fc-v657 x86_64"}
        self.assertTrue(baselines.same_kernel(a, dict(a)))
        self.assertFalse(baselines.same_kernel(a, {"kernel": "Linux 6.18.44-fc-v1272 x86_64"}))
        self.assertTrue(baselines.same_kernel(a, {}))  # a baseline without one: nothing to tell


class StoredBaselineRunTest(FakeRunsCase):
    """Without --base, each repetition is a process of its own (Note
    [Repetitions are processes]), recorded and compared as such."""

    baselines_dir = "baselines"

    def test_recorded_and_compared_over_processes(self):
        self.fake_runs({"head": [10, 14, 12]})
        rc, out = self.run_main("--record-missing", "--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 0, out)
        self.assertEqual(self.repetitions, [1, 1, 1])
        recorded = os.path.join(self.dir, "baselines", "testkind", "unknown-cpu", "fake_bench.json")
        _, stats = bench_results.load_results(recorded)
        self.assertEqual(sorted(stats["BM_A/bytes:8/real_time"].times), [10000, 12000, 14000])
        # A process inside the baseline's spread of processes is not a regression...
        self.fake_runs({"head": [13, 14, 13]})
        rc, out = self.run_main("--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 0, out)
        # ...every process beyond it is.
        self.fake_runs({"head": [30, 31, 32]})
        rc, out = self.run_main("--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 1, out)
        self.assertIn("SLOWER", out)

    def test_a_kernel_dependent_benchmark_does_not_gate_against_another_kernels_baseline(self):
        def under(kernel):
            return {"kernel": f"Linux 6.18.44-{kernel} x86_64", "reloadsafe_kernel_dependent": "BM_A/"}

        self.fake_runs({"head": [10, 14, 12]}, under("fc-v657"))
        rc, out = self.run_main("--record-missing", "--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 0, out)
        self.fake_runs({"head": [30, 31, 32]}, under("fc-v1272"))
        rc, out = self.run_main("--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 0, out)
        self.assertIn("other kernel", out)
        self.assertIn("kernel differs from the baseline's", out)
        self.fake_runs({"head": [30, 31, 32]}, under("fc-v657"))  # the same kernel still gates
        rc, out = self.run_main("--repetitions", "3", "fake_bench")
        self.assertEqual(rc, 1, out)
        self.assertIn("SLOWER", out)


if __name__ == "__main__":
    unittest.main()
