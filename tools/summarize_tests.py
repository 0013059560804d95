#!/usr/bin/env python3
"""Summarises test results: Bazel's testlogs, plus any JUnit XML files.

  tools/summarize_tests.py [--json OUT] [--markdown OUT] TESTLOGS_DIR [PACKAGE ...]
                           [--junit [NAME=]FILE ...] [--pytest-xml AREA=FILE ...]
                           [--testlogs AREA=DIR ...]

Prints a table of test cases by package (passed, failed, skipped), lists every
skipped case with its reason and every failed case, and ends with the line
'tests: N passed, N failed, N skipped'. Exits 1 if any case failed.

Sharded tests count once, under their target's name. `--junit NAME=FILE` adds
the cases of a JUnit XML file (pytest's --junitxml, for example) under
package NAME (default: the file's name without .xml); it may be repeated.
--pytest-xml AREA=FILE is the same for pytest's --junitxml file. A missing or
unreadable file counts as one failed case. `--testlogs AREA=DIR` adds every
target of another Bazel testlogs folder (another configuration's, such as
--config=torch2.15) under the one area AREA.

The torch versions the cases recorded (testlogs.torch_versions) end the
output, each with the areas that tested it ('torch tested: 2.11.0+cu130
(tools, python); 2.15.0+cu132 (cpp-torch2.15, python-torch2.15)').
The XML is read by tools/testlogs.py.
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testlogs  # noqa: E402


def junit_target(spec):
    name, sep, path = spec.partition("=")
    if not sep:
        path, name = spec, os.path.splitext(os.path.basename(spec))[0]
    return testlogs.read_junit(path, f"{name} ({os.path.basename(path)})", package=name)


def case_label(target, case):
    return f"{target.label} {case.name}" if case.name else target.label


def summarize(targets):
    """(rows by package, skipped [(case, reason)], failed [case])."""
    rows: collections.OrderedDict[str, collections.Counter[str]] = collections.OrderedDict()
    skipped, failed = [], []
    for target in targets:
        row = rows.setdefault(target.package, collections.Counter())
        for case in target.cases:
            row[case.status] += 1
            if case.status == "skipped":
                skipped.append((case_label(target, case), case.message))
            elif case.status == "failed":
                failed.append(case_label(target, case))
    return rows, skipped, failed


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("testlogs")
    ap.add_argument("packages", nargs="*")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--junit", action="append", default=[], metavar="[NAME=]FILE")
    ap.add_argument("--pytest-xml", action="append", default=[], metavar="AREA=FILE",
                    dest="junit")
    ap.add_argument("--testlogs", action="append", default=[], metavar="AREA=DIR",
                    dest="more_testlogs")
    args = ap.parse_args(argv)

    targets = testlogs.read_testlogs(args.testlogs, args.packages or None)
    for spec in args.more_testlogs:
        area, sep, folder = spec.partition("=")
        if not sep or not area:
            ap.error(f"--testlogs takes AREA=DIR, not {spec!r}")
        for target in testlogs.read_testlogs(folder):
            target.package = area
            targets.append(target)
    targets += [junit_target(spec) for spec in args.junit]
    rows, skipped, failed = summarize(targets)

    total: collections.Counter[str] = collections.Counter()
    lines = ["| area | passed | failed | skipped |", "| --- | ---: | ---: | ---: |"]
    for package, row in rows.items():
        total.update(row)
        lines.append(f"| {package} | {row['passed']} | {row['failed']} | {row['skipped']} |")
    lines.append(f"| **total** | {total['passed']} | {total['failed']} | {total['skipped']} |")
    out = "\n".join(lines)
    if skipped:
        out += "\n\nSkipped:\n" + "\n".join(f"- {n}: {r}" for n, r in skipped)
    if failed:
        out += "\n\nFailed:\n" + "\n".join(f"- {n}" for n in failed)
    print(out)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(out + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"areas": rows, "total": total, "skipped": skipped, "failed": failed,
                       "torch_versions": testlogs.torch_versions(targets)}, f, indent=2)
    versions = testlogs.torch_versions(targets)
    if versions:
        print("\ntorch tested: " + "; ".join(f"{v} ({', '.join(areas)})" for v, areas in sorted(versions.items())))
    print(f"\ntests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
