#!/usr/bin/env python3
"""Assembles the main job's report from what the battery left behind.

  tools/report.py --testlogs DIR --out DIR [--harness JSON] [--bench DIR]

Reads the gtest XML and logs under the Bazel testlogs folder, the reload
harness's JSON report and the benchmark comparison (if any), and writes
OUT/report.md, OUT/report.json and copies the benchmark charts beside them.
Prints the short table that ends the main job. Exits 1 if a test failed or the
harness did not get the verdict each backend expects; benchmark slowdowns are
reported, and gated by bench/compare.py itself.
"""
import argparse
import glob
import json
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET

AREAS = ["utils", "conformance", "fuzz", "bench"]


def read_tests(testlogs):
    """Per target: passed/failed/skipped cases, skip reasons, fuzz counts."""
    targets = {}
    for xml_path in sorted(glob.glob(os.path.join(testlogs, "**", "test.xml"), recursive=True)):
        folder = os.path.dirname(xml_path)
        rel = os.path.relpath(folder, testlogs)
        label = "//" + os.path.dirname(rel) + ":" + os.path.basename(rel)
        t = {"passed": 0, "failed": 0, "skipped": 0, "skips": [], "properties": {}}
        try:
            root = ET.parse(xml_path).getroot()
        except ET.ParseError:
            t["failed"] = 1
            targets[label] = t
            continue
        cases = list(root.iter("testcase"))
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                t["failed"] += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                t["skipped"] += 1
                node = case.find("skipped")
                msg = (node.get("message") if node is not None else "") or ""
                t["skips"].append(f"{case.get('classname')}.{case.get('name')}: "
                                  + (msg.strip().splitlines()[-1] if msg.strip() else ""))
            else:
                t["passed"] += 1
        if not cases:
            suite = root.find(".//testsuite")
            bad = suite is not None and int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            t["failed" if bad else "passed"] += 1
        log = os.path.join(folder, "test.log")
        if os.path.exists(log):
            # RapidCheck prints "OK, passed N tests" per property.
            text = open(log, errors="replace").read()
            for segment in text.split("[ RUN      ] ")[1:]:
                name = segment.split("\n", 1)[0].strip()
                m = re.search(r"OK, passed (\d+) tests", segment)
                if m:
                    t["properties"][name] = int(m.group(1))
        targets[label] = t
    return targets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testlogs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--harness")
    ap.add_argument("--bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    targets = read_tests(args.testlogs)
    areas = {}
    for label, t in targets.items():
        area = label[2:].split("/")[0].split(":")[0]
        a = areas.setdefault(area, {"passed": 0, "failed": 0, "skipped": 0})
        for k in a:
            a[k] += t[k]
    skips = [f"{label} {s}" for label, t in targets.items() for s in t["skips"]]
    fuzz = {f"{label} {p}": n for label, t in targets.items() for p, n in t["properties"].items()}

    harness = json.load(open(args.harness)) if args.harness and os.path.exists(args.harness) else None
    bench = None
    if args.bench:
        # bench/compare.py's printed tables and its exit status.
        text_path, rc_path = os.path.join(args.bench, "compare.txt"), os.path.join(args.bench, "compare.rc")
        if os.path.exists(text_path):
            rc = int(open(rc_path).read().strip() or 1) if os.path.exists(rc_path) else 1
            bench = {"text": open(text_path, errors="replace").read(), "exit_status": rc}
        for png in glob.glob(os.path.join(args.bench, "**", "*.png"), recursive=True):
            if os.path.dirname(os.path.abspath(png)) != os.path.abspath(args.out):
                shutil.copy(png, args.out)

    md = ["# reloadsafe report", ""]
    md += ["## Tests by area", "", "| area | passed | failed | skipped |", "| --- | ---: | ---: | ---: |"]
    for area, a in sorted(areas.items()):
        md.append(f"| {area} | {a['passed']} | {a['failed']} | {a['skipped']} |")
    if skips:
        md += ["", "Skipped (with the reason each test gave):", ""] + [f"- {s}" for s in skips]
    if fuzz:
        md += ["", "## Fuzz properties (cases run)", "", "| property | cases |", "| --- | ---: |"]
        md += [f"| {k} | {v} |" for k, v in sorted(fuzz.items())]
    if harness:
        md += ["", f"## Reload harness ({harness['reloads']} reloads per mode, {harness['device']})", "",
               "| backend | normal | direct | verdict |", "| --- | --- | --- | --- |"]
        for b in harness["backends"]:
            def cell(m):
                s = "error" if m.get("error") else ("kept" if m["violation_count"] == 0
                                                    else f"{m['violation_count']} violations")
                return s + ("" if m["expected_to_pass"] else " (not claimed)")
            verdict = ("flagged (negative control)" if b["ok"] else "NOT FLAGGED") if b["negative_control"] \
                else ("pass" if b["ok"] else "FAIL")
            md.append(f"| {b['name']} | {cell(b['modes']['normal'])} | {cell(b['modes']['direct'])} | {verdict} |")
    if bench:
        md += ["", "## Benchmarks against the limits and the baseline", "",
               "bench/compare.py " + ("found no slowdown" if bench["exit_status"] == 0
                                      else f"exited {bench['exit_status']} (slowdown or error)"), "",
               "```"] + bench["text"].rstrip().splitlines() + ["```"]
        for png in sorted(glob.glob(os.path.join(args.out, "*.png"))):
            md.append(f"![{os.path.basename(png)}]({os.path.basename(png)})")

    failed = sum(a["failed"] for a in areas.values())
    harness_bad = harness is not None and not all(b["ok"] for b in harness["backends"])
    bench_bad = bench is not None and bench["exit_status"] != 0
    open(os.path.join(args.out, "report.md"), "w").write("\n".join(md) + "\n")
    json.dump({"areas": areas, "skips": skips, "fuzz_cases": fuzz, "harness": harness, "bench": bench},
              open(os.path.join(args.out, "report.json"), "w"), indent=2)

    print("\n| area | passed | failed | skipped |\n| --- | ---: | ---: | ---: |")
    for area, a in sorted(areas.items()):
        print(f"| {area} | {a['passed']} | {a['failed']} | {a['skipped']} |")
    if harness:
        ok = sum(b["ok"] for b in harness["backends"])
        print(f"\nreload harness: {ok}/{len(harness['backends'])} backends as expected")
    if bench:
        print("benchmarks: " + ("no slowdown against the baseline" if bench["exit_status"] == 0
                                else "slowdown or error, see the report"))
    total = {k: sum(a[k] for a in areas.values()) for k in ("passed", "failed", "skipped")}
    print(f"\nbattery: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    # The exit status is about correctness (tests, harness). A benchmark
    # slowdown is reported above; bench/compare.py is the gate that fails on it.
    del bench_bad
    return 1 if failed or harness_bad else 0


if __name__ == "__main__":
    sys.exit(main())
