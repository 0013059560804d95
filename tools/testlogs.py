#!/usr/bin/env python3
"""One reader for test results in JUnit XML, as written by Bazel, GoogleTest
and pytest.

  targets = read_testlogs("bazel-testlogs")          # every Bazel test target
  target = read_junit("results.xml", "//python:tests", package="python")
  torch_versions(targets)                            # {"2.11.0+cu130": ["utils", ...]}

A Bazel testlogs folder holds `<package>/<target>/test.xml` per test, or, for
a sharded test (or one run several times), one folder per shard or run:
`<package>/<target>/shard_1_of_2/test.xml`. Shards and runs are merged into
one Target named after the test (`//fuzz:storage_fit_props_test`), never
reported as targets of their own.

Each test case is passed, failed or skipped:
  - failed: a <failure> or <error> child (its message's last line in
    `message`, all of it and the element's text in `text`);
  - skipped: a <skipped> child (pytest, gtest >= 1.10), `result="skipped"`
    (gtest) or `status="notrun"` (a disabled gtest test); the reason is the
    message's last line, or the element's text;
  - passed otherwise.
A file with no <testcase> at all (a test binary that crashed before writing
its cases) counts as one case, failed when its suite reports failures or
errors. An unreadable file counts as one failed case.
"""
import dataclasses
import os
import re
import xml.etree.ElementTree as ET

# Folders Bazel adds below a test's folder: shard_1_of_2, run_2_of_3, and
# both at once.
_SPLIT_DIR = re.compile(r"((shard|run)_\d+_of_\d+_?)+")


@dataclasses.dataclass
class Case:
    """One test case."""
    name: str                 # "Suite.Test" (classname.name); "" for a whole file
    status: str               # "passed", "failed" or "skipped"
    message: str = ""         # skip reason or failure message, one line
    properties: dict = dataclasses.field(default_factory=dict)  # recorded values
    text: str = ""            # a failure whole: its message, then its element's text


@dataclasses.dataclass
class Target:
    """The cases of one test target, all its shards and runs together."""
    label: str                # "//fuzz:storage_fit_props_test"
    package: str              # first path component: "fuzz"
    cases: list = dataclasses.field(default_factory=list)
    logs: list = dataclasses.field(default_factory=list)  # test.log of each shard/run

    def count(self, status):
        return sum(1 for c in self.cases if c.status == status)


def _last_line(text):
    text = (text or "").strip()
    return text.splitlines()[-1].strip() if text else ""


def _case(node):
    classname, name = node.get("classname", ""), node.get("name", "")
    full = f"{classname}.{name}" if classname else name
    props = {k: v for k, v in node.attrib.items()
             if k not in ("classname", "name", "status", "result", "time", "timestamp", "file", "line")}
    for prop in node.iter("property"):
        if prop.get("name") is not None:
            props[prop.get("name")] = prop.get("value")
    failure = node.find("failure")
    if failure is None:
        failure = node.find("error")
    if failure is not None:
        text = "\n".join(part for part in (failure.get("message"), failure.text) if part)
        return Case(full, "failed", _last_line(failure.get("message") or failure.text), props, text)
    skipped = node.find("skipped")
    if skipped is not None or node.get("result") == "skipped" or node.get("status") == "notrun":
        reason = ""
        if skipped is not None:
            reason = _last_line(skipped.get("message")) or _last_line(skipped.text)
        return Case(full, "skipped", reason, props)
    return Case(full, "passed", "", props)


def read_cases(path):
    """The cases of one JUnit XML file (Bazel, gtest or pytest --junitxml)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        return [Case("", "failed", f"unreadable XML: {e}")]
    cases = []
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites or [root]:
        # Properties of a suite (pytest's record_testsuite_property) hold for
        # each of its cases, unless the case records its own.
        shared = {p.get("name"): p.get("value") for p in suite.findall("properties/property")
                  if p.get("name") is not None}
        for node in suite.findall("testcase") if suites else root.iter("testcase"):
            case = _case(node)
            case.properties = {**shared, **case.properties}
            cases.append(case)
    if cases:
        return cases
    bad = sum(int(s.get("failures", 0) or 0) + int(s.get("errors", 0) or 0) for s in suites)
    return [Case("", "failed" if bad else "passed")]


def read_junit(path, label, package=None):
    """A Target holding the cases of one JUnit XML file, e.g. pytest's."""
    return Target(label=label, package=package or label.lstrip("/").split(":")[0].split("/")[0],
                  cases=read_cases(path))


def target_of(testlogs, folder):
    """(label, package) of the test whose results are in `folder`."""
    parts = os.path.relpath(folder, testlogs).split(os.sep)
    while len(parts) > 1 and _SPLIT_DIR.fullmatch(parts[-1]):
        parts.pop()
    return "//" + "/".join(parts[:-1]) + ":" + parts[-1], parts[0]


def read_testlogs(testlogs, packages=None):
    """Every test target under a Bazel testlogs folder, sorted by label.

    `packages`: only targets whose first path component is one of these.
    """
    targets: dict[str, Target] = {}
    for folder, _, files in os.walk(testlogs, followlinks=True):
        if "test.xml" not in files:
            continue
        label, package = target_of(testlogs, folder)
        if packages and package not in packages:
            continue
        target = targets.setdefault(label, Target(label=label, package=package))
        target.cases += read_cases(os.path.join(folder, "test.xml"))
        if "test.log" in files:
            target.logs.append(os.path.join(folder, "test.log"))
    for target in targets.values():
        target.logs.sort()
    return [targets[label] for label in sorted(targets)]


def torch_versions(targets):
    """The torch versions the targets' cases recorded (the `torch_version`
    property of //tools:torch_version_test and of the Python package's tests),
    each with the packages that recorded it: {"2.15.0+cu132": ["python"]}."""
    found: dict[str, list[str]] = {}
    for target in targets:
        for case in target.cases:
            version = case.properties.get("torch_version")
            if version and target.package not in found.setdefault(version, []):
                found[version].append(target.package)
    return found
