#!/usr/bin/env python3
"""Tests of tools/testlogs.py (and summarize_tests.py on top of it) with the
XML that Bazel, GoogleTest and pytest write."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import summarize_tests  # noqa: E402
import testlogs  # noqa: E402

GTEST_SHARD_1 = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="0" disabled="0" errors="0" name="AllTests">
  <testsuite name="StorageFitProps" tests="2" failures="0" disabled="0" skipped="0" errors="0">
    <testcase name="ExtentAgrees" status="run" result="completed" time="1" classname="StorageFitProps" />
    <testcase name="ViewFits" status="run" result="completed" time="1" classname="StorageFitProps" />
  </testsuite>
</testsuites>
"""
GTEST_SHARD_2 = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="1" disabled="0" errors="0" name="AllTests">
  <testsuite name="StorageFitProps" tests="2" failures="1" disabled="0" skipped="0" errors="0">
    <testcase name="Places" status="run" result="completed" time="1" classname="StorageFitProps">
      <failure message="a.cc:10&#x0A;Expected equality" type=""><![CDATA[a.cc:10]]></failure>
    </testcase>
    <testcase name="Mutants" status="run" result="completed" time="1" classname="StorageFitProps" />
  </testsuite>
</testsuites>
"""
GTEST_SKIPS = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" name="AllTests">
  <testsuite name="CudaGraph" tests="3">
    <testcase name="Replays" status="run" result="skipped" time="0" classname="CudaGraph">
      <skipped message="g.cc:5&#x0A;no CUDA device is visible"><![CDATA[g.cc:5]]></skipped>
    </testcase>
    <testcase name="Old" status="run" result="skipped" time="0" classname="CudaGraph" />
    <testcase name="DISABLED_Slow" status="notrun" time="0" classname="CudaGraph" />
    <testcase name="Counted" status="run" result="completed" time="0" classname="CudaGraph" replays="7">
      <properties><property name="captures" value="2"/></properties>
    </testcase>
  </testsuite>
</testsuites>
"""
# What Bazel writes for a test that is not a gtest binary (sh_test).
BAZEL_SH_FAILED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
<testsuite name="fuzz/layout_fuzzer_test" tests="1" failures="0" errors="1">
<testcase name="fuzz/layout_fuzzer_test" status="run" duration="31" time="31"><error message="exited with error code 1"></error></testcase>
</testsuite>
</testsuites>
"""
CRASHED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="x" tests="1" failures="0" errors="1"></testsuite></testsuites>
"""
PYTEST = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="4" time="0.5">
<testcase classname="tests.test_api" name="test_replace" time="0.1" />
<testcase classname="tests.test_api" name="test_cuda" time="0.0"><skipped type="pytest.skip" message="CUDA is not available">tests/test_api.py:9: CUDA is not available</skipped></testcase>
<testcase classname="tests.test_api" name="test_bad" time="0.0"><failure message="AssertionError: 1 != 2">trace</failure></testcase>
<testcase classname="tests.test_api" name="test_setup" time="0.0"><error message="fixture failed">trace</error></testcase>
</testsuite></testsuites>
"""
# //tools:torch_version_test's gtest XML and pytest's, each with the
# torch_version property (gtest writes it on the case, pytest's
# record_testsuite_property on the suite).
TORCH_VERSION_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" name="AllTests"><testsuite name="LibTorch" tests="1">
<testcase name="HeadersAreTheVersionTheRepositoryRuleRead" status="run" result="completed"
 classname="LibTorch" torch_version="%s" />
</testsuite></testsuites>
"""
PYTEST_TORCH = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="2">
<properties><property name="torch_version" value="%s" /></properties>
<testcase classname="test_package" name="test_extension_matches_this_torch" />
<testcase classname="test_check" name="test_other" />
</testsuite></testsuites>
"""


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


class TestlogsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = os.path.join(self.tmp.name, "testlogs")
        write(self.root, "fuzz/storage_fit_props_test/shard_1_of_2/test.xml", GTEST_SHARD_1)
        write(self.root, "fuzz/storage_fit_props_test/shard_1_of_2/test.log", "log 1")
        write(self.root, "fuzz/storage_fit_props_test/shard_2_of_2/test.xml", GTEST_SHARD_2)
        write(self.root, "fuzz/storage_fit_props_test/shard_2_of_2/test.log", "log 2")
        write(self.root, "fuzz/layout_fuzzer_test/test.xml", BAZEL_SH_FAILED)
        write(self.root, "utils/cuda/graph_test/test.xml", GTEST_SKIPS)
        write(self.root, "utils/crashed_test/test.xml", CRASHED)
        write(self.root, "utils/garbled_test/test.xml", "<testsuites><testcase")
        write(self.root, "bench/runs_test/run_1_of_2/test.xml", GTEST_SHARD_1)
        write(self.root, "bench/runs_test/shard_1_of_2_run_2_of_2/test.xml", GTEST_SHARD_1)
        self.pytest = write(self.tmp.name, "pytest.xml", PYTEST)

    def tearDown(self):
        self.tmp.cleanup()

    def by_label(self, **kwargs):
        return {t.label: t for t in testlogs.read_testlogs(self.root, **kwargs)}

    def test_shards_and_runs_are_merged_under_the_target(self):
        targets = self.by_label()
        self.assertEqual(sorted(targets), [
            "//bench:runs_test",
            "//fuzz:layout_fuzzer_test",
            "//fuzz:storage_fit_props_test",
            "//utils/cuda:graph_test",
            "//utils:crashed_test",
            "//utils:garbled_test",
        ])
        props = targets["//fuzz:storage_fit_props_test"]
        self.assertEqual(props.package, "fuzz")
        self.assertEqual((props.count("passed"), props.count("failed"), props.count("skipped")),
                         (3, 1, 0))
        self.assertEqual([os.path.basename(os.path.dirname(p)) for p in props.logs],
                         ["shard_1_of_2", "shard_2_of_2"])
        failed = [c for c in props.cases if c.status == "failed"]
        self.assertEqual(failed[0].name, "StorageFitProps.Places")
        self.assertEqual(failed[0].message, "Expected equality")
        self.assertEqual(failed[0].text, "a.cc:10\nExpected equality\na.cc:10")
        self.assertEqual(targets["//bench:runs_test"].count("passed"), 4)

    def test_skips_with_their_reasons_and_recorded_properties(self):
        graph = self.by_label()["//utils/cuda:graph_test"]
        status = {c.name: (c.status, c.message) for c in graph.cases}
        self.assertEqual(status["CudaGraph.Replays"], ("skipped", "no CUDA device is visible"))
        self.assertEqual(status["CudaGraph.Old"], ("skipped", ""))
        self.assertEqual(status["CudaGraph.DISABLED_Slow"], ("skipped", ""))
        self.assertEqual(status["CudaGraph.Counted"], ("passed", ""))
        counted = [c for c in graph.cases if c.name == "CudaGraph.Counted"][0]
        self.assertEqual(counted.properties["replays"], "7")
        self.assertEqual(counted.properties["captures"], "2")

    def test_non_gtest_crashed_and_unreadable_files(self):
        targets = self.by_label()
        sh = targets["//fuzz:layout_fuzzer_test"]
        self.assertEqual([(c.status, c.message) for c in sh.cases],
                         [("failed", "exited with error code 1")])
        self.assertEqual([c.status for c in targets["//utils:crashed_test"].cases], ["failed"])
        garbled = targets["//utils:garbled_test"].cases
        self.assertEqual(len(garbled), 1)
        self.assertEqual(garbled[0].status, "failed")
        self.assertIn("unreadable XML", garbled[0].message)

    def test_package_filter(self):
        self.assertEqual(sorted(self.by_label(packages=["fuzz"])),
                         ["//fuzz:layout_fuzzer_test", "//fuzz:storage_fit_props_test"])

    def test_pytest_junitxml(self):
        target = testlogs.read_junit(self.pytest, "//python:tests", package="python")
        status = {c.name: (c.status, c.message) for c in target.cases}
        self.assertEqual(status, {
            "tests.test_api.test_replace": ("passed", ""),
            "tests.test_api.test_cuda": ("skipped", "CUDA is not available"),
            "tests.test_api.test_bad": ("failed", "AssertionError: 1 != 2"),
            "tests.test_api.test_setup": ("failed", "fixture failed"),
        })

    def test_summary_counts_shards_once_and_adds_junit_files(self):
        out_json = os.path.join(self.tmp.name, "summary.json")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            rc = summarize_tests.main([self.root, "--json", out_json,
                                       "--junit", "python=" + self.pytest])
        self.assertEqual(rc, 1)
        with open(out_json) as f:
            summary = json.load(f)
        self.assertEqual(summary["areas"]["fuzz"], {"passed": 3, "failed": 2})
        self.assertEqual(summary["areas"]["python"], {"passed": 1, "failed": 2, "skipped": 1})
        self.assertEqual(summary["areas"]["utils"], {"passed": 1, "failed": 2, "skipped": 3})
        self.assertIn("//fuzz:storage_fit_props_test StorageFitProps.Places", summary["failed"])
        self.assertNotIn("shard", stdout.getvalue())
        self.assertIn("tests: 9 passed, 6 failed, 4 skipped", stdout.getvalue())

    def test_torch_versions_and_a_second_testlogs_folder_as_one_area(self):
        newest = os.path.join(self.tmp.name, "testlogs-newest")
        write(newest, "tools/torch_version_test/test.xml", TORCH_VERSION_XML % "2.15.0+cu132")
        write(newest, "utils/layer_test/test.xml", GTEST_SHARD_1)
        write(self.root, "tools/torch_version_test/test.xml", TORCH_VERSION_XML % "2.11.0+cu130")
        pytest_newest = write(self.tmp.name, "pytest-newest.xml", PYTEST_TORCH % "2.15.0+cu132")
        self.assertEqual(testlogs.torch_versions(testlogs.read_testlogs(self.root)),
                         {"2.11.0+cu130": ["tools"]})
        out_json = os.path.join(self.tmp.name, "summary.json")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            summarize_tests.main([self.root, "bench", "tools", "--json", out_json,
                                  "--testlogs", "cpp-newest=" + newest,
                                  "--junit", "python-newest=" + pytest_newest])
        with open(out_json) as f:
            summary = json.load(f)
        self.assertEqual(summary["areas"]["cpp-newest"], {"passed": 3})
        self.assertEqual(summary["areas"]["python-newest"], {"passed": 2})
        self.assertEqual(summary["torch_versions"], {"2.11.0+cu130": ["tools"],
                                                     "2.15.0+cu132": ["cpp-newest", "python-newest"]})
        self.assertIn("torch tested: 2.11.0+cu130 (tools); 2.15.0+cu132 (cpp-newest, python-newest)",
                      stdout.getvalue())

    def test_summary_of_passing_results_exits_zero(self):
        with contextlib.redirect_stdout(io.StringIO()):
            rc = summarize_tests.main([self.root, "bench"])
        self.assertEqual(rc, 0)


if __name__ == "__main__":
    unittest.main()
