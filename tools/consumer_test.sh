#!/usr/bin/env bash
# The external-repository path, end to end: builds and tests the example
# consumer workspace (conformance/harness/example_consumer: its own WORKSPACE,
# reloadsafe as a local_repository, one backend) with its own Bazel server.
#
#   tools/consumer_test.sh JUNIT_XML [extra bazel flags]
#
# Checks, and writes as JUnit XML (one case each) to JUNIT_XML:
#   passing_backend_passes  `bazel test //:my_kernels_reload_test` passes; its
#                           test.xml has the test ReloadHarness.fused_qkv and
#                           its log the harness's table with fused_qkv: pass.
#   violation_fails         `bazel test //:rebuilt_reload_test` (a backend that
#                           rebuilds its fused weight) fails; its test.xml has
#                           a failure naming the tensor `qkv`.
# Exit status 1 if a check failed. Used by tools/test.sh; run tools/setup.sh
# first. The machine's user.bazelrc (disk cache, sandbox folder) is copied into the consumer.
set -uo pipefail
top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: tools/consumer_test.sh JUNIT_XML [bazel flags]" >&2; exit 2; }
xml="$1"
shift
consumer="$top/conformance/harness/example_consumer"
cd "$consumer" || exit 1
if [ -f "$top/user.bazelrc" ]; then
  cmp -s "$top/user.bazelrc" user.bazelrc || cp "$top/user.bazelrc" user.bazelrc
fi
# The consumer's server exits a minute after its last command: it is used once
# per test run, and three builds may share this machine.
bzl() { bazel --max_idle_secs=60 "$@"; }

bzl test "$@" //:my_kernels_reload_test
pass_rc=$?
# Expected to fail: its output is shown only when the check below fails.
rebuilt_log="$(mktemp)"
trap 'rm -f "$rebuilt_log"' EXIT
bzl test "$@" //:rebuilt_reload_test > "$rebuilt_log" 2>&1
fail_rc=$?
testlogs="$(bzl info "$@" bazel-testlogs)"
python3 - "$top/tools" "$xml" "$testlogs" "$pass_rc" "$fail_rc" <<'PY' || { cat "$rebuilt_log"; exit 1; }
"""Judges the two runs from their exit codes, test.xml and test.log."""
import sys
from xml.sax.saxutils import escape

tools, out, logs_dir = sys.argv[1:4]
pass_rc, fail_rc = int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, tools)
from testlogs import read_testlogs  # noqa: E402  (tools/testlogs.py)

targets = {t.label: t for t in read_testlogs(logs_dir)}


def read(target):
    """The cases of //:target and its log; none where it left no test.xml."""
    t = targets.get("//:" + target)
    if t is None:
        return [], ""
    return t.cases, "".join(open(p, errors="replace").read() for p in t.logs)


def passing():
    if pass_rc != 0:
        return f"bazel test //:my_kernels_reload_test exited {pass_rc}"
    cases, log = read("my_kernels_reload_test")
    names = [c.name for c in cases]
    if "ReloadHarness.fused_qkv" not in names:
        return f"test.xml lists {names}, not ReloadHarness.fused_qkv"
    if any(c.status == "failed" for c in cases):
        return "test.xml has failures"
    rows = [line for line in log.splitlines() if line.startswith("fused_qkv ")]
    if "verdict" not in log or not rows or not rows[-1].rstrip().endswith("pass"):
        return "the test log has no harness table with fused_qkv's verdict pass"
    return None


def failing():
    if fail_rc != 3:  # bazel test: 3 when a test failed
        return f"bazel test //:rebuilt_reload_test exited {fail_rc}, not 3 (a failed test)"
    cases, log = read("rebuilt_reload_test")
    failed = {c.name: c for c in cases if c.status == "failed"}
    if "ReloadHarness.fused_qkv_rebuilt" not in failed:
        return f"test.xml has no failure for ReloadHarness.fused_qkv_rebuilt (cases: {[c.name for c in cases]})"
    if "qkv address" not in failed["ReloadHarness.fused_qkv_rebuilt"].text:
        return "the failure does not name the tensor qkv"
    if "FAIL" not in log:
        return "the test log has no table with the FAIL verdict"
    return None


results = [("passing_backend_passes", passing()), ("violation_fails", failing())]
with open(out, "w") as f:
    f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n'
            f'<testsuite name="consumer" tests="{len(results)}" '
            f'failures="{sum(1 for _, e in results if e)}">\n')
    for name, error in results:
        f.write(f'  <testcase classname="consumer" name="{name}">')
        if error:
            f.write(f'<failure message="{escape(error, {chr(34): "&quot;"})}"/>')
        f.write("</testcase>\n")
    f.write("</testsuite>\n</testsuites>\n")
for name, error in results:
    print(f"[consumer] {name}: {'FAIL: ' + error if error else 'ok'}")
sys.exit(1 if any(e for _, e in results) else 0)
PY
