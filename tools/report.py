#!/usr/bin/env python3
"""Assembles the main job's report from what the battery left behind.

  tools/report.py --testlogs DIR --out DIR [--harness JSON] [--bench DIR] [--junit NAME=FILE]
                  [--more-testlogs AREA=DIR]

Reads the gtest XML and logs under the Bazel testlogs folder, the reload
harness's JSON report and the benchmark comparison (if any), and writes
OUT/report.md, OUT/report.json and copies the benchmark charts beside them.
`--more-testlogs AREA=DIR` adds another configuration's testlogs (the C++
tests against the newest torch) as one area. The report lists the torch
versions the tests recorded (testlogs.torch_versions), with the areas that
tested each.
Prints the short table that ends the main job. Exits 1 if a test failed, the
harness did not get the verdict each backend expects, or a benchmark
comparison that gates (A/B, or this machine's own stored baseline) found a
slowdown or a failed benchmark. Against another machine's baseline, or when a
baseline was recorded, benchmark differences are information only.
"""
import argparse
import glob
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testlogs as testlogs_reader  # noqa: E402

AREAS = ["utils", "conformance", "fuzz", "bench"]


def read_tests(testlogs, junit=(), more_testlogs=()):
    """Per target: area, passed/failed/skipped cases, skip reasons, fuzz
    counts; and the torch versions the cases recorded.

    The XML is read by tools/testlogs.py (shards merged under their target);
    `junit` adds NAME=FILE JUnit files (pytest's) as area NAME;
    `more_testlogs` adds AREA=DIR testlogs folders, every target as area AREA.
    """
    found = [(t, t.label[2:].split("/")[0].split(":")[0]) for t in testlogs_reader.read_testlogs(testlogs)]
    for spec in more_testlogs:
        area, _, folder = spec.partition("=")
        for t in testlogs_reader.read_testlogs(folder):
            t.package = area
            t.label = f"{t.label} ({area})"
            found.append((t, area))
    for spec in junit:
        name, _, path = spec.partition("=")
        found.append((testlogs_reader.read_junit(path, f"{name} ({os.path.basename(path)})", package=name), name))
    targets = {}
    for target, area in found:
        t = {"area": area, "passed": target.count("passed"), "failed": target.count("failed"),
             "skipped": target.count("skipped"), "properties": {},
             "skips": [f"{c.name}: {c.message}" for c in target.cases if c.status == "skipped"]}
        for log in target.logs:
            # RapidCheck prints "OK, passed N tests" per property.
            with open(log, errors="replace") as f:
                text = f.read()
            for segment in text.split("[ RUN      ] ")[1:]:
                name = segment.split("\n", 1)[0].strip()
                m = re.search(r"OK, passed (\d+) tests", segment)
                if m:
                    t["properties"][name] = int(m.group(1))
        targets[target.label] = t
    for target, area in found:
        target.package = area
    versions = testlogs_reader.torch_versions([target for target, _ in found])
    return targets, versions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testlogs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--harness")
    ap.add_argument("--bench")
    ap.add_argument("--junit", action="append", default=[], metavar="NAME=FILE",
                    help="a JUnit XML file (pytest's) whose cases count as area NAME")
    ap.add_argument("--more-testlogs", action="append", default=[], metavar="AREA=DIR",
                    help="another Bazel testlogs folder whose targets count as area AREA")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    targets, torch_versions = read_tests(args.testlogs, args.junit, args.more_testlogs)
    areas: dict[str, dict[str, int]] = {}
    for t in targets.values():
        a = areas.setdefault(t["area"], {"passed": 0, "failed": 0, "skipped": 0})
        for k in a:
            a[k] += t[k]
    skips = [f"{label} {s}" for label, t in targets.items() for s in t["skips"]]
    fuzz = {f"{label} {p}": n for label, t in targets.items() for p, n in t["properties"].items()}

    harness = None
    if args.harness and os.path.exists(args.harness):
        with open(args.harness) as f:
            harness = json.load(f)
    bench = read_bench(args.bench, args.out) if args.bench else None

    md = ["# reloadsafe report", ""]
    md += ["## Torch versions tested", "", "| torch | areas |", "| --- | --- |"]
    md += [f"| {v} | {', '.join(areas)} |" for v, areas in sorted(torch_versions.items())] or \
        ["| (none recorded) | |"]
    md.append("")
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
               "| backend | normal | direct | tensors read (declared/undeclared) | verdict |",
               "| --- | --- | --- | --- | --- |"]
        for b in harness["backends"]:
            def cell(m):
                s = "error" if m.get("error") else ("kept" if m["violation_count"] == 0
                                                    else f"{m['violation_count']} violations")
                if m.get("warnings"):
                    s += f", {len(m['warnings'])} warnings"
                return s + ("" if m["expected_to_pass"] else " (not claimed)")
            normal = b["modes"]["normal"]
            reads = f"{normal.get('declared_reads', '-')}/{normal.get('undeclared_reads', '-')}"
            verdict = ("flagged (negative control)" if b["ok"] else "NOT FLAGGED") if b["negative_control"] \
                else ("pass" if b["ok"] else "FAIL")
            md.append(f"| {b['name']} | {cell(normal)} | {cell(b['modes']['direct'])} | {reads} | {verdict} |")
    if bench:
        md += [""] + bench_markdown(bench)

    failed = sum(a["failed"] for a in areas.values())
    harness_bad = harness is not None and not all(b["ok"] for b in harness["backends"])
    bench_bad = bench is not None and bench["failed"]
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump({"torch_versions": torch_versions, "areas": areas, "skips": skips, "fuzz_cases": fuzz, "harness": harness, "bench": bench},
                  f, indent=2)

    print("\n| area | passed | failed | skipped |\n| --- | ---: | ---: | ---: |")
    for area, a in sorted(areas.items()):
        print(f"| {area} | {a['passed']} | {a['failed']} | {a['skipped']} |")
    if harness:
        ok = sum(b["ok"] for b in harness["backends"])
        print(f"\nreload harness: {ok}/{len(harness['backends'])} backends as expected")
    if bench:
        for v in bench["verdicts"]:
            print(f"benchmarks {v['binary']}: {bench_line(v)}")
    print("\ntorch tested: " + ("; ".join(f"{v} ({', '.join(a)})" for v, a in sorted(torch_versions.items()))
                                 or "none recorded"))
    total = {k: sum(a[k] for a in areas.values()) for k in ("passed", "failed", "skipped")}
    print(f"\nbattery: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    # Correctness (tests, harness) and, where the comparison gates (A/B or
    # this machine's own baseline), benchmark regressions.
    return 1 if failed or harness_bad or bench_bad else 0


# --- benchmarks ----------------------------------------------------------------

MODES = {
    "ab": "A/B against {base} in the same run",
    "baseline": "against this machine's stored baseline ({base})",
    "other-machine baseline": "against another machine's baseline ({base}): information only",
    "none": "no baseline for this machine",
}


def read_bench(folder, out):
    """bench/compare.py's verdicts (<binary>.verdict.json), its exit status,
    and the charts, copied beside the report."""
    verdicts = []
    for path in sorted(glob.glob(os.path.join(folder, "*.verdict.json"))):
        with open(path) as f:
            verdicts.append(json.load(f))
    rc_path = os.path.join(folder, "compare.rc")
    rc = None
    if os.path.exists(rc_path):
        with open(rc_path) as f:
            rc = int(f.read().strip() or 1)
    charts = []
    for png in sorted(glob.glob(os.path.join(folder, "**", "*.png"), recursive=True)):
        if os.path.dirname(os.path.abspath(png)) != os.path.abspath(out):
            shutil.copy(png, out)
        charts.append(os.path.basename(png))
    for v in verdicts:
        v["charts"] = [os.path.basename(c) for c in v.get("charts", [])]
    gated_bad = any(v.get("gates") and not v.get("passed") for v in verdicts)
    errors = any(v.get("errors") for v in verdicts)
    # compare.py exits 1 only on what gates (or failed runs); no verdict at
    # all with a failing exit status means the benchmarks did not build or run.
    failed = gated_bad or errors or (rc not in (None, 0) and not verdicts)
    logs = [name for name in ("compare.txt", "bench.log")
            if os.path.exists(os.path.join(folder, name))]
    return {"verdicts": verdicts, "exit_status": rc, "failed": bool(failed),
            "charts": sorted(set(charts)), "logs": logs,
            "folder": os.path.relpath(folder, out)}


def bench_line(v):
    mode = v.get("mode", "none")
    if v.get("recorded"):
        return f"baseline recorded for this machine ({v['recorded']}; commit it)"
    if v.get("errors"):
        return f"{len(v['errors'])} benchmark(s) failed"
    if mode in ("ab", "baseline"):
        few = sum(c.get("few runs", 0) for c in v.get("families", {}).values())
        unjudged = (f"; {few} moved beyond the threshold with too few repetitions to judge "
                    f"(few runs: information)" if few else "")
        return ("no regression" if not v.get("slower") else
                f"REGRESSION in {len(v['slower'])} benchmark(s)") + \
            f" ({MODES[mode].format(base=v.get('base'))}{unjudged})"
    return MODES[mode].format(base=v.get("base"))


def fmt_ratio(t):
    if t["worst"] is None:
        return "-"
    unit = t.get("unit") or ("ns" if t["comparison"] == "<=" else "ratio")
    if unit == "ns":
        return f"{t['worst']:.0f} ns (<= {t['bound']:.0f})"
    size = t["bytes"]
    human = f"{size >> 20} MiB" if size and size % (1 << 20) == 0 else f"{size} B"
    where = f" at {human}" if size else ""
    return f"{t['worst']:.2f}{where} ({t['comparison']} {t['bound']:.2f})"


def bench_markdown(bench):
    md = ["## Benchmarks", ""]
    for v in bench["verdicts"]:
        md += [f"### {v['binary']} on {v.get('kind')} ({v.get('machine_description', '')})", "",
               bench_line(v), ""]
        if v.get("targets"):
            md += ["| target | met | worst ratio |", "| --- | --- | --- |"]
            for desc, t in v["targets"].items():
                md.append(f"| {desc} | {'met' if t['met'] else '**missed**'} | {fmt_ratio(t)} |")
            md.append("")
        if v.get("families"):
            title = "regression verdict" if v.get("gates") else "difference (information)"
            md += [f"| family | {title} |", "| --- | --- |"]
            for fam, counts in sorted(v["families"].items()):
                bad = counts.get("SLOWER", 0) + counts.get("error", 0)
                cell = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                md.append(f"| {fam} | {'**' + cell + '**' if bad else cell} |")
            md.append("")
        for c in v.get("charts", []):
            md.append(f"- chart: [{c}]({c})")
        md.append("")
    if bench["logs"]:
        md.append("Tables and the build and benchmark output: " +
                  ", ".join(f"[{n}]({bench['folder']}/{n})" for n in bench["logs"]))
    return md


if __name__ == "__main__":
    sys.exit(main())
