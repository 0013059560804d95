#!/usr/bin/env python3
"""Tests of tools/include_layers.py: the tree's C++ files (the paths given as
arguments, from the top of the checkout) keep the layer order, and each kind
of finding fires on a small tree planted with it."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import include_layers  # noqa: E402

# Files named on the command line (Bazel passes every C++ file of the
# checked folders); read before unittest parses the command line.
TREE = sys.argv[1:]
del sys.argv[1:]


def inc(*paths: str) -> str:
    return "".join(f'#include "{p}"\n' for p in paths) + "#include <vector>\n"


# A tree that keeps the order: one file or two per layer.
CLEAN = {
    "utils/layer.h": inc(),
    "utils/layer.cc": inc("utils/layer.h"),
    "conformance/case_runner.h": inc("utils/layer.h"),
    "conformance/ops/operations.inc": inc(),
    "conformance/trace/read_trace.h": inc("utils/layer.h", "conformance/trace/internal/call_state.h"),
    "conformance/trace/read_trace.cc": inc("conformance/trace/read_trace.h",
                                           "conformance/trace/internal/call_match.h"),
    "conformance/trace/internal/call_state.h": inc(),
    "conformance/trace/internal/call_match.h": inc("conformance/trace/internal/call_state.h"),
    "conformance/trace/named_tensor.h": inc(),
    "conformance/trace/capture.h": inc("conformance/trace/read_trace.h",
                                       "conformance/trace/named_tensor.h"),
    "conformance/trace/read_trace_test.cc": inc("conformance/trace/capture.h"),
    "conformance/harness/subject.h": inc("conformance/trace/named_tensor.h"),
    "conformance/harness/report.h": inc("conformance/harness/subject.h"),
    "conformance/harness/protocol.h": inc("conformance/harness/report.h",
                                          "conformance/trace/capture.h"),
    "conformance/harness/internal/all_close.h": inc(),
    "conformance/harness/values.cc": inc("conformance/harness/internal/all_close.h"),
    "conformance/harness/harness.h": inc("conformance/harness/protocol.h", "utils/layer.h"),
    "conformance/harness/harness_main.cc": inc("conformance/harness/harness.h"),
    "conformance/harness/backends/sample_backends.cc": inc("conformance/harness/harness.h"),
    "python/src/module.cc": inc("conformance/harness/harness.h", "conformance/case_runner.h"),
}

# (what is planted, file, its new text, what the finding says)
PLANTED = [
    ("the trace includes the harness", "conformance/trace/read_trace.cc",
     inc("conformance/trace/read_trace.h", "conformance/harness/subject.h"),
     "conformance/trace/read_trace.cc (trace) includes conformance/harness/subject.h "
     "(harness: subject), which is not below it"),
    ("the subject interface includes the capture", "conformance/harness/subject.h",
     inc("conformance/trace/named_tensor.h", "conformance/trace/capture.h"),
     "conformance/harness/subject.h (harness: subject) includes conformance/trace/capture.h "
     "(trace: capture), which is not below it"),
    ("the read trace includes the capture", "conformance/trace/read_trace.cc",
     inc("conformance/trace/read_trace.h", "conformance/trace/capture.h"),
     "conformance/trace/read_trace.cc (trace) includes conformance/trace/capture.h (trace: capture)"),
    ("the trace includes the cases, beside it", "conformance/trace/read_trace.h",
     inc("conformance/case_runner.h"),
     "conformance/trace/read_trace.h (trace) includes conformance/case_runner.h (cases)"),
    ("the utilities include the trace", "utils/layer.cc", inc("conformance/trace/read_trace.h"),
     "utils/layer.cc (utils) includes conformance/trace/read_trace.h (trace)"),
    ("a harness layer includes one above it", "conformance/harness/report.h",
     inc("conformance/harness/protocol.h"),
     "conformance/harness/report.h (harness: report) includes conformance/harness/protocol.h "
     "(harness: protocol)"),
    ("the protocol includes a backend's command", "conformance/harness/protocol.h",
     inc("conformance/harness/report.h", "conformance/harness/harness.h"),
     "(harness: protocol) includes conformance/harness/harness.h (harness: harness)"),
    ("the harness includes the trace's internal header", "conformance/harness/subject.h",
     inc("conformance/trace/read_trace.h", "conformance/trace/internal/call_match.h"),
     "conformance/harness/subject.h: includes conformance/trace/internal/call_match.h, "
     "internal to conformance/trace/"),
    ("a cycle of two", "conformance/trace/internal/call_state.h",
     inc("conformance/trace/internal/call_match.h"),
     "include cycle: conformance/trace/internal/call_match.h -> "
     "conformance/trace/internal/call_state.h -> conformance/trace/internal/call_match.h"),
    ("a header includes itself", "utils/layer.h", inc("utils/layer.h"),
     "include cycle: utils/layer.h -> utils/layer.h"),
    ("a header that is not there", "conformance/harness/harness.h",
     inc("conformance/harness/protocol.h", "conformance/harness/gone.h"),
     "conformance/harness/harness.h: includes conformance/harness/gone.h, which is not among"),
    ("a file of no layer", "conformance/newpart/thing.h", inc(),
     "conformance/newpart/thing.h: in no layer"),
]


class PlantedTest(unittest.TestCase):
    def test_the_clean_tree_has_no_finding(self) -> None:
        self.assertEqual(include_layers.check(CLEAN), [])

    def test_each_planted_flaw_is_found(self) -> None:
        for what, path, text, finding in PLANTED:
            with self.subTest(what):
                tree = dict(CLEAN, **{path: text})
                findings = include_layers.check(tree)
                self.assertTrue(any(finding in f for f in findings), f"{finding!r} not in {findings}")

    def test_a_cycle_through_three_files_is_reported_once(self) -> None:
        tree = dict(CLEAN)
        tree["conformance/trace/read_trace.h"] = inc("conformance/trace/internal/call_match.h")
        tree["conformance/trace/internal/call_state.h"] = inc("conformance/trace/read_trace.h")
        self.assertEqual(include_layers.check(tree), [
            "include cycle: conformance/trace/internal/call_match.h -> "
            "conformance/trace/internal/call_state.h -> conformance/trace/read_trace.h -> "
            "conformance/trace/internal/call_match.h"
        ])

    def test_only_quoted_includes_of_the_checked_folders_count(self) -> None:
        tree = dict(CLEAN)
        tree["conformance/trace/read_trace.cc"] += '#include <conformance/harness/subject.h>\n'
        tree["conformance/trace/read_trace.cc"] += '#include "fuzz/spec_model.h"\n'
        tree["conformance/trace/read_trace.cc"] += '// #include "conformance/harness/subject.h"\n'
        self.assertEqual(include_layers.check(tree), [])


class TreeTest(unittest.TestCase):
    def test_the_tree_keeps_the_layer_order(self) -> None:
        files = include_layers.read(TREE)
        # Every layer has files here, so a data list that lost a folder
        # cannot pass by checking nothing.
        for layer in include_layers.LAYERS:
            with self.subTest(layer.name):
                self.assertTrue(any(include_layers.layers_of(p) == [layer.name] for p in files),
                                f"no file of layer {layer.name} among the {len(files)} given")
        findings = include_layers.check(files)
        self.assertEqual(findings, [], "\n" + "\n".join(findings))


if __name__ == "__main__":
    unittest.main()
