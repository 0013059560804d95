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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def results(times_by_name, kind="testkind", unit="us", error=None, build="opt"):
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
    return {"context": {"executable": "/x/fake_bench", "machine_kind": kind,
                        "reloadsafe_build": build},
            "benchmarks": benchmarks}


class ClassifyTest(unittest.TestCase):
    def stats(self, times):
        return compare.Stats("b", times, [])

    def test_table(self):
        cases = [
            # (baseline times, current times, verdict)
            ("same", [10, 11, 12], [10, 11, 12], "ok"),
            ("slower, ranges apart", [10, 11, 12], [20, 21, 22], "SLOWER"),
            ("slower but ranges overlap", [10, 11, 30], [20, 21, 22], "ok"),
            ("ranges apart, within threshold", [10, 10, 10], [12, 12, 12], "ok"),
            ("just past threshold", [10, 10, 10], [12.6, 12.6, 12.6], "SLOWER"),
            ("faster", [20, 21, 22], [10, 11, 12], "faster"),
            ("one repetition each", [10], [13], "SLOWER"),
        ]
        for name, base, cur, verdict in cases:
            with self.subTest(name):
                self.assertEqual(
                    compare.classify(self.stats(base), self.stats(cur), 0.25), verdict)

    def test_relative_to_limit(self):
        base, cur = self.stats([10, 11, 12]), self.stats([20, 21, 22])
        # The limit slowed as much: the machine, not the code.
        self.assertEqual(compare.classify(base, cur, 0.25, relative=1.05), "machine")
        self.assertEqual(compare.classify(base, cur, 0.25, relative=1.6), "SLOWER")
        self.assertEqual(compare.classify(base, cur, 0.25, limit=True), "limit slower")

    def test_references_pair_by_size(self):
        refs = compare.parse_references(
            {"reloadsafe_references": "BM_R/in_place/=BM_R/memcpy/;BM_R/placed/=BM_R/memcpy/"})
        stats = {"BM_R/memcpy/bytes:8/real_time": None, "BM_R/memcpy/bytes:16/real_time": None}
        self.assertEqual(compare.limit_of("BM_R/in_place/bytes:16/real_time", refs, stats),
                         "BM_R/memcpy/bytes:16/real_time")
        self.assertIsNone(compare.limit_of("BM_R/in_place/bytes:32/real_time", refs, stats))
        self.assertIsNone(compare.limit_of("BM_R/memcpy/bytes:8/real_time", refs, stats))
        self.assertTrue(compare.is_limit("BM_R/memcpy/bytes:8/real_time", refs))

    def test_new_missing_error(self):
        s = self.stats([1])
        self.assertEqual(compare.classify(None, s, 0.25), "new")
        self.assertEqual(compare.classify(s, None, 0.25), "missing")
        self.assertEqual(compare.classify(s, compare.Stats("b", [], [], error="x"), 0.25), "error")


class ParseNameTest(unittest.TestCase):
    def test_names(self):
        self.assertEqual(
            compare.parse_name("BM_FileCopy/cpu/warm/pread/bytes:1048576/manual_time"),
            ("BM_FileCopy/cpu/warm", "pread", 1048576))
        self.assertEqual(compare.parse_name("BM_Replace/memcpy/bytes:4096/real_time"),
                         ("BM_Replace", "memcpy", 4096))
        self.assertEqual(compare.parse_name("BM_InOwnStorage/decision_unplaced/real_time"),
                         ("BM_InOwnStorage", "decision_unplaced", None))


class FilterTest(unittest.TestCase):
    def test_filter(self):
        self.assertTrue(compare.matches_filter("cpu/warm", "BM_FileCopy/cpu/warm/pread/bytes:1"))
        self.assertFalse(compare.matches_filter("-cpu/warm", "BM_FileCopy/cpu/warm/pread"))
        self.assertTrue(compare.matches_filter("bytes:4096/|decision", "BM_InOwnStorage/decision"))


class MainTest(unittest.TestCase):
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

    def test_update_then_gate(self):
        base = self.write("base.json", results({"BM_A/bytes:8/real_time": [10, 11, 12]}))
        rc, out = self.run_main("--update-baseline", base)
        self.assertEqual(rc, 0, out)
        recorded = os.path.join(self.baselines, "testkind", "fake_bench.json")
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
        self.assertTrue(os.path.exists(os.path.join(self.baselines, "other", "fake_bench.json")))
        os.environ["RELOADSAFE_BENCH_KIND"] = "fromenv"
        try:
            self.run_main("--update-baseline", base)
        finally:
            del os.environ["RELOADSAFE_BENCH_KIND"]
        self.assertTrue(os.path.exists(os.path.join(self.baselines, "fromenv", "fake_bench.json")))

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
        args = type("Args", (), {"threads": None, "kind": None, "baselines": self.baselines})
        saved = os.environ.pop("OMP_NUM_THREADS", None)
        try:
            self.assertEqual(compare.baseline_threads(args, "/x/fake_bench"), "1")
            args.threads = 4
            self.assertEqual(compare.baseline_threads(args, "/x/fake_bench"), "4")
            args.threads = None
            self.assertIsNone(compare.baseline_threads(args, "/x/other_bench"))
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
        _, stats = compare.load_results(os.path.join(self.baselines, "testkind", "fake_bench.json"))
        self.assertEqual(stats["BM_A/real_time"].median, 1000)  # us -> ns, kept
        self.assertEqual(stats["BM_B/real_time"].median, 5000)  # replaced


if __name__ == "__main__":
    unittest.main()
