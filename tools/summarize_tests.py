#!/usr/bin/env python3
"""Summarises Bazel test results from the gtest XML files under bazel-testlogs.

  tools/summarize_tests.py [--json OUT] [--markdown OUT] [--pytest-xml AREA=FILE ...]
                           TESTLOGS_DIR [PACKAGE ...]

--pytest-xml adds the cases of a pytest --junitxml file as area AREA (a
missing or unreadable file counts as one failure).

Prints a table of test cases by package (passed, failed, skipped), lists every
skipped case with its reason, and ends with the line
'tests: N passed, N failed, N skipped'. Exits 1 if any case failed.
"""
import argparse
import collections
import json
import os
import sys
import xml.etree.ElementTree as ET


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("testlogs")
    ap.add_argument("packages", nargs="*")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--pytest-xml", action="append", default=[], metavar="AREA=FILE")
    args = ap.parse_args()

    rows = collections.OrderedDict()
    skipped = []
    failed = []
    for root, _, files in sorted(os.walk(args.testlogs)):
        if "test.xml" not in files:
            continue
        target = os.path.relpath(root, args.testlogs)
        package = target.split("/")[0]
        if args.packages and package not in args.packages:
            continue
        try:
            tree = ET.parse(os.path.join(root, "test.xml"))
        except ET.ParseError:
            failed.append((target, "(unreadable test.xml)"))
            continue
        row = rows.setdefault(package, collections.Counter())
        cases = tree.getroot().iter("testcase")
        any_case = False
        for case in cases:
            any_case = True
            name = f"//{target.rsplit('/', 1)[0]}:{target.rsplit('/', 1)[-1]} {case.get('classname', '')}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                row["failed"] += 1
                failed.append((name, ""))
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                row["skipped"] += 1
                node = case.find("skipped")
                reason = (node.get("message") if node is not None else "") or ""
                skipped.append((name, reason.strip().splitlines()[-1] if reason.strip() else ""))
            else:
                row["passed"] += 1
        if not any_case:  # a test without gtest cases (sh_test): one result
            suite = tree.getroot().find(".//testsuite")
            bad = suite is not None and int(suite.get("failures", 0)) + int(suite.get("errors", 0)) > 0
            row["failed" if bad else "passed"] += 1
            if bad:
                failed.append((target, ""))

    for spec in args.pytest_xml:
        area, _, path = spec.partition("=")
        row = rows.setdefault(area, collections.Counter())
        try:
            tree = ET.parse(path)
        except (OSError, ET.ParseError):
            row["failed"] += 1
            failed.append((f"{area} (no readable pytest XML at {path})", ""))
            continue
        for case in tree.getroot().iter("testcase"):
            name = f"{area} {case.get('classname', '')}::{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                row["failed"] += 1
                failed.append((name, ""))
            elif case.find("skipped") is not None:
                row["skipped"] += 1
                reason = (case.find("skipped").get("message") or "").strip()
                skipped.append((name, reason.splitlines()[-1] if reason else ""))
            else:
                row["passed"] += 1

    total = collections.Counter()
    lines = ["| area | passed | failed | skipped |", "| --- | ---: | ---: | ---: |"]
    for package, row in rows.items():
        total.update(row)
        lines.append(f"| {package} | {row['passed']} | {row['failed']} | {row['skipped']} |")
    lines.append(f"| **total** | {total['passed']} | {total['failed']} | {total['skipped']} |")
    out = "\n".join(lines)
    if skipped:
        out += "\n\nSkipped:\n" + "\n".join(f"- {n}: {r}" for n, r in skipped)
    if failed:
        out += "\n\nFailed:\n" + "\n".join(f"- {n}" for n, _ in failed)
    print(out)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(out + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"areas": rows, "total": total, "skipped": skipped,
                       "failed": [n for n, _ in failed]}, f, indent=2)
    print(f"\ntests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
