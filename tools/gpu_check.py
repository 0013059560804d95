#!/usr/bin/env python3
"""The GPU check: every GPU part of reloadsafe, from an unpacked GPU bundle
(tools/gpu_bundle.sh), on a machine with a GPU, torch and no Bazel.

    OUT=results ./gpu_check.sh            # there: seven minutes at most
    OUT=results ./gpu_check.sh --no-gpu   # a machine without a GPU: every part
                                          # must start and skip with its reason

Parts, in order of value, each with its own time limit (cut to what is left
of --budget):

  load       every binary starts and the Python package imports (a part whose
             binary or package does not load is reported once and not run)
  graph      cuda_graph_reload_test and cuda_graph_test: graph replay after each
             of the harness's default reloads per backend and mode, the
             device quarantine, the kernel-argument audit; and
             file_loader_device_test: a safetensors file loaded into device
             tensors through the staging ring, no device allocation, a
             captured graph reading the new bytes (gtest XML)
  harness    reload_harness --device cuda over every registered backend: the
             protocol with its CUDA graph step (JSON)
  python     check_reload(device="cuda") on every Python sample and negative
             control, and the package's other CUDA tests (JUnit XML)
  bench      copy_bench's CUDA series, the pinned H2D limit first (JSON)
  zoo        the bug zoo's pairs checked on the CPU and on CUDA, verdicts side
             by side (OUT/zoo_cpu_cuda.md); fails where CUDA catches less than
             the CPU or a fixed layer fails there

Writes OUT/summary.md (with "N passed, N failed, N skipped") and
OUT/results.tar.gz (logs, XML, JSON) and exits 1 on any failure. With
--no-gpu a part passes only by skipping with its reason, "no CUDA device";
a loader error, a missing symbol or an ImportError fails it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # testlogs.py lies beside this file, in the checkout and in the bundle

from testlogs import read_cases  # noqa: E402

GRAPH_TESTS = ("cuda_graph_reload_test", "cuda_graph_test", "file_loader_device_test")
# Loader failures: the dynamic linker's, and Python's.
LOAD_ERRORS = re.compile(
    r"error while loading shared libraries|undefined symbol|cannot open shared object|ImportError|"
    r"ModuleNotFoundError|GLIBC_[0-9.]+' not found|GLIBCXX_[0-9.]+' not found"
)
NO_DEVICE = "no CUDA device"
PARTS = ("graph", "harness", "python", "bench", "zoo")


class Check:
    def __init__(self, out: str, no_gpu: bool, budget: float) -> None:
        self.out = out
        self.work = os.path.join(out, "results")
        os.makedirs(self.work, exist_ok=True)
        self.no_gpu = no_gpu
        self.deadline = time.monotonic() + budget
        self.rows: list[tuple[str, str, float, str]] = []  # part, status, seconds, detail
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.unloadable: set[str] = set()
        self.env = self._environment()

    # --- environment -------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        """LibTorch's and the CUDA runtime's libraries from this Python's torch
        (found without importing it), and the bundle's own lib/."""
        env = dict(os.environ)
        dirs = [os.path.join(HERE, "lib")]
        purelib = sysconfig.get_paths()["purelib"]
        for site in dict.fromkeys([purelib] + [p for p in sys.path if p.endswith("-packages")]):
            torch_lib = os.path.join(site, "torch", "lib")
            if os.path.isdir(torch_lib):
                dirs.append(torch_lib)
                dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
                break
        if os.environ.get("LD_LIBRARY_PATH"):
            dirs.append(os.environ["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(dict.fromkeys(dirs))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def left(self, limit: float) -> float:
        return max(1.0, min(limit, self.deadline - time.monotonic()))

    # --- running ------------------------------------------------------------

    def run(self, name: str, argv: list[str], limit: float, env: dict[str, str] | None = None) -> tuple[int, str, float]:
        """Runs argv with a time limit; its output goes to results/<name>.log.
        Returns (exit status, output, seconds); 124 when it ran out of time."""
        start = time.monotonic()
        log = os.path.join(self.work, name + ".log")
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               env=env or self.env, timeout=self.left(limit), cwd=self.work)
            rc, text = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout or b""
            rc, text = 124, (out.decode(errors="replace") if isinstance(out, bytes) else out) + "\n[gpu_check] time limit reached\n"
        except OSError as e:
            rc, text = 127, f"[gpu_check] cannot start {argv[0]}: {e}\n"
        with open(log, "w") as f:
            f.write(" ".join(argv) + "\n" + text)
        return rc, text, time.monotonic() - start

    def row(self, part: str, status: str, seconds: float, detail: str) -> None:
        detail = " ".join(detail.split())  # one line: it is a table cell
        self.rows.append((part, status, seconds, detail))
        print(f"[gpu_check] {part}: {status} ({seconds:.1f} s) {detail}", flush=True)

    def count(self, status: str, n: int = 1) -> None:
        self.counts[status] += n

    # --- parts ---------------------------------------------------------------

    def load(self) -> None:
        """Every binary starts: a listing that needs nothing but the libraries."""
        probes = {
            **{t: ["--gtest_list_tests"] for t in GRAPH_TESTS},
            "reload_harness": ["--build-info"],
            "copy_bench": ["--benchmark_list_tests", "--benchmark_filter=BM_Limit/cpu/memcpy"],
        }
        for binary, args in probes.items():
            path = os.path.join(HERE, "bin", binary)
            if not os.path.exists(path):
                self.unloadable.add(binary)
                self.count("failed")
                self.row(f"load {binary}", "FAIL", 0, "not in the bundle")
                continue
            rc, text, secs = self.run(f"load_{binary}", [path] + args, 60)
            if rc != 0 or LOAD_ERRORS.search(text):
                why = _first_line(text, LOAD_ERRORS) or f"exit {rc}"
            elif binary == "reload_harness" and "CUDA linked" not in text:
                why = "CUDA is not linked in: " + text.strip()[-200:]
            else:
                self.count("passed")
                detail = text.strip().splitlines()[-1] if binary == "reload_harness" else "starts"
                self.row(f"load {binary}", "ok", secs, detail)
                continue
            self.unloadable.add(binary)
            self.count("failed")
            self.row(f"load {binary}", "FAIL", secs, why)

    def package(self, rebuild: bool = False) -> dict[str, str] | None:
        """The environment in which `import reloadsafe` loads the bundle's
        package; its extension is rebuilt here (ext/build_ext.sh) when the
        bundle's was built for another Python."""
        site = os.path.join(HERE, "python")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        start = time.monotonic()
        if rebuild or not glob.glob(os.path.join(site, "reloadsafe", "_C" + suffix)):
            built = os.path.join(self.out, "package_site")
            shutil.rmtree(built, ignore_errors=True)
            shutil.copytree(site, built)
            for old in glob.glob(os.path.join(built, "reloadsafe", "_C.*.so")):
                os.remove(old)
            rc, text, _ = self.run("build_ext", ["bash", os.path.join(HERE, "ext", "build_ext.sh"), sys.executable,
                                                 os.path.join(built, "reloadsafe", "_C" + suffix)], 200)
            if rc != 0:
                self.count("failed")
                self.row("package build", "FAIL", time.monotonic() - start,
                         _first_line(text, re.compile("error|Error")) or f"exit {rc}")
                return None
            self.row("package build", "ok", time.monotonic() - start, f"extension built for this Python ({suffix})")
            site = built
        env = dict(self.env, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # Imports, then one small check on the CPU with a violation, so the
        # extension's report and table code runs before any GPU part does.
        probe = (
            "import torch, reloadsafe\n"
            "class Rebuilt(torch.nn.Linear):\n"
            "    def process_weights_after_loading(self):\n"
            "        self.scale = self.weight.abs().amax(0)\n"
            "    def forward(self, x):\n"
            "        return torch.nn.functional.linear(x, self.weight / self.scale)\n"
            "r = reloadsafe.check_reload(lambda: Rebuilt(8, 4, bias=False), torch.randn(2, 8), reloads=2)\n"
            "assert not r.ok and 'scale' in r.table(), r.table()\n"
            "print(reloadsafe.__file__, torch.__version__)\n"
        )
        rc, text, secs = self.run("load_python", [sys.executable, "-c", probe], 90, env)
        if rc != 0:
            self.count("failed")
            self.row("load python package", "FAIL", secs, _first_line(text, LOAD_ERRORS) or f"exit {rc}")
            return None
        self.count("passed")
        self.row("load python package", "ok", secs, text.strip().splitlines()[-1])
        return env

    def gtest(self, binary: str, limit: float) -> None:
        if binary in self.unloadable:
            self.row(binary, "not run", 0, "did not load")
            return
        xml = os.path.join(self.work, binary + ".xml")
        rc, text, secs = self.run(binary, [os.path.join(HERE, "bin", binary), f"--gtest_output=xml:{xml}"], limit)
        self.junit(binary, xml, rc, text, secs)

    def junit(self, part: str, xml: str, rc: int, text: str, secs: float) -> None:
        # The project's one JUnit reader (tools/testlogs.py, beside this file
        # in the bundle); a run that wrote no file has no results.
        cases = read_cases(xml) if os.path.exists(xml) else []
        if not cases:
            self.count("failed")
            self.row(part, "FAIL", secs, ("time limit reached" if rc == 124 else _first_line(text, LOAD_ERRORS)) or f"exit {rc}, no results")
            return
        passed = sum(1 for c in cases if c.status == "passed")
        failed = [c for c in cases if c.status == "failed"]
        skipped = [c for c in cases if c.status == "skipped"]
        self.count("passed", passed)
        self.count("failed", len(failed))
        self.count("skipped", len(skipped))
        if self.no_gpu:
            # A test that needs no device may pass; every one that needs it
            # must skip and say it is for want of a device.
            vague = [c for c in skipped if NO_DEVICE not in c.message]
            ok = not failed and not vague and skipped and rc != 124
            if not ok:
                self.count("failed")
            reason = skipped[0].message if skipped else ""
            self.row(part, "ok (skipped)" if ok else "FAIL", secs,
                     f"{len(skipped)} skipped, {passed} passed: {reason[:120]}" if ok else
                     f"expected every GPU test to skip with '{NO_DEVICE}': " +
                     ("; ".join(f"{c.name} {c.status} {c.message[:80]}" for c in (failed + vague)[:3]) or "nothing skipped"))
            return
        ok = not failed and rc != 124
        detail = f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped"
        if failed:
            detail += ": " + "; ".join(f"{c.name}: {c.message[:160]}" for c in failed[:3])
        if rc == 124:
            detail += " (time limit reached)"
        self.row(part, "ok" if ok else "FAIL", secs, detail)

    def skipped_for_want_of_a_device(self, part: str, rc: int, text: str, secs: float) -> None:
        """With --no-gpu, a command that needs a device must exit 2 naming
        NO_DEVICE: a skip; anything else fails the part."""
        ok = rc == 2 and NO_DEVICE in text
        self.count("skipped" if ok else "failed")
        self.row(part, "ok (skipped)" if ok else "FAIL", secs, _first_line(text, re.compile(NO_DEVICE)) if ok else
                 f"expected exit 2 naming '{NO_DEVICE}', got exit {rc}: {text.strip()[-200:]}")

    def harness(self) -> None:
        if "reload_harness" in self.unloadable:
            self.row("harness", "not run", 0, "did not load")
            return
        path = os.path.join(HERE, "bin", "reload_harness")
        js = os.path.join(self.work, "harness_cuda.json")
        rc, text, secs = self.run("harness_cuda", [path, "--device", "cuda", "--reloads", "20", "--json", js], 120)
        if self.no_gpu:
            self.skipped_for_want_of_a_device("harness", rc, text, secs)
            return
        ok = rc == 0 and os.path.exists(js)
        self.count("passed" if ok else "failed")
        table = [line for line in text.splitlines() if "|" in line]
        self.row("harness", "ok" if ok else "FAIL", secs, f"exit {rc}; {len(table)} table rows" + ("" if ok else ": " + text.strip()[-300:]))

    def python(self, env: dict[str, str] | None) -> None:
        if env is None:
            self.row("python", "not run", 0, "the package did not load")
            return
        xml = os.path.join(self.work, "python_cuda.xml")
        tests = os.path.join(HERE, "python_tests")
        # The test files with CUDA tests (others may read the checkout, which
        # is not here).
        files = []
        for path in sorted(glob.glob(os.path.join(tests, "test_*.py"))):
            with open(path) as f:
                if "cuda" in f.read():
                    files.append(path)
        rc, text, secs = self.run("python_cuda", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files,
                                                  "-k", "cuda", f"--junitxml={xml}", "--rootdir", tests], 240, env)
        self.junit("python", xml, rc, text, secs)

    def bench(self) -> None:
        if "copy_bench" in self.unloadable:
            self.row("bench", "not run", 0, "did not load")
            return
        js = os.path.join(self.work, "copy_bench_cuda.json")
        sizes = "bytes:(16777216|67108864)(/|$)"  # manual-time benchmarks end in /manual_time
        flt = f"BM_Limit/cuda_[a-z]+/pinned_h2d/{sizes}|BM_FileCopy/cuda_[a-z]+/warm/.*/{sizes}"
        argv = [os.path.join(HERE, "bin", "copy_bench"), f"--benchmark_filter={flt}", "--benchmark_repetitions=2",
                "--benchmark_min_time=0.05", f"--benchmark_out={js}", "--benchmark_out_format=json"]
        if self.no_gpu:
            rc, text, secs = self.run("copy_bench_cuda", argv[:1] + ["--benchmark_list_tests", argv[1]], 60)
            ok = NO_DEVICE in text or "no CUDA device visible" in text
            self.count("skipped" if ok else "failed")
            self.row("bench", "ok (skipped)" if ok else "FAIL", secs,
                     _first_line(text, re.compile("CUDA destination")) if ok else text.strip()[-200:])
            return
        rc, text, secs = self.run("copy_bench_cuda", argv, 90)
        ran = 0
        try:
            with open(js) as f:
                ran = len(json.load(f).get("benchmarks", []))
        except (OSError, ValueError):
            pass
        ok = rc == 0 and ran > 0  # a filter that matches nothing is a failure, not a pass
        self.count("passed" if ok else "failed")
        targets = [line.strip() for line in text.splitlines() if "pinned H2D" in line]
        self.row("bench", "ok" if ok else "FAIL", secs, f"{ran} results; " + (targets[-1] if targets else f"exit {rc}") +
                 ("" if ok else ": " + text.strip()[-200:]))

    def zoo(self, env: dict[str, str] | None) -> None:
        if env is None:
            self.row("zoo", "not run", 0, "the package did not load")
            return
        tests = os.path.join(HERE, "python_tests")
        env = dict(env, PYTHONPATH=tests + os.pathsep + env.get("PYTHONPATH", ""))
        table = os.path.join(self.out, "zoo_cpu_cuda.md")
        rc, text, secs = self.run("zoo", [sys.executable, "-m", "zoo.table", "--devices", "cpu,cuda", table], 180, env)
        if self.no_gpu:
            self.skipped_for_want_of_a_device("zoo", rc, text, secs)
            return
        totals = [line.strip() for line in text.splitlines() if " total " in line]
        ok = rc == 0 and os.path.exists(table)
        self.count("passed" if ok else "failed")
        detail = "; ".join(totals)
        if not ok:
            detail += ": " + (_first_line(text, re.compile("verdicts differ|Error|error")) or text.strip()[-300:])
        self.row("zoo", "ok" if ok else "FAIL", secs, detail)

    # --- results -------------------------------------------------------------

    def finish(self, started: float) -> int:
        failed = self.counts["failed"]
        machine = _machine(self.env)
        lines = ["# GPU check", "", "```", machine, "```", "",
                 "| part | status | seconds | detail |", "| --- | --- | --- | --- |"]
        lines += [f"| {p} | {s} | {secs:.1f} | {d.replace('|', '/')} |" for p, s, secs, d in self.rows]
        lines += ["", f"{self.counts['passed']} passed, {failed} failed, {self.counts['skipped']} skipped", "",
                  f"wall time: {time.monotonic() - started:.0f} s" + (" (--no-gpu)" if self.no_gpu else ""), ""]
        summary = "\n".join(lines)
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write(summary)
        with open(os.path.join(self.work, "machine.txt"), "w") as f:
            f.write(machine + "\n")
        with tarfile.open(os.path.join(self.out, "results.tar.gz"), "w:gz") as tar:
            tar.add(self.work, arcname="results")
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(os.path.join(self.out, "package_site"), ignore_errors=True)
        print(summary, flush=True)
        return 1 if failed else 0


def _first_line(text: str, pattern: re.Pattern[str]) -> str:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:300]
    return ""


def _machine(env: dict[str, str]) -> str:
    lines = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", f"host: {' '.join(os.uname()[2:5])}"]
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30)
        lines += [f"gpu: {g}" for g in smi.stdout.strip().splitlines()] or ["gpu: none"]
    except (OSError, subprocess.TimeoutExpired):
        lines.append("gpu: none (no nvidia-smi)")
    torch = subprocess.run([sys.executable, "-c", "import torch, sys; print('torch:', torch.__version__, 'cuda:', "
                            "torch.version.cuda, 'python:', sys.version.split()[0])"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines.append(torch.stdout.strip().splitlines()[-1] if torch.stdout.strip() else "torch: not importable")
    info = os.path.join(HERE, "BUILD_INFO")
    if os.path.exists(info):
        with open(info) as f:
            lines += ["bundle: " + line for line in f.read().strip().splitlines()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for summary.md and results.tar.gz (default $OUT)")
    parser.add_argument("--no-gpu", action="store_true", help="on a machine without a GPU: every part must start and skip")
    parser.add_argument("--budget", type=float, default=420, help="seconds for the whole check (default 420)")
    parser.add_argument("--rebuild-ext", action="store_true",
                        help="build the Python extension here even if the bundle's matches this Python")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run after load (default: all of {','.join(PARTS)})")
    args = parser.parse_args()
    if not args.out:
        parser.error("set OUT or pass --out: the folder for summary.md and results.tar.gz")
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()
    parts = set(args.parts.split(",")) if args.parts else set()
    unknown = parts - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {','.join(sorted(unknown))}: the parts are {','.join(PARTS)}")
    check = Check(os.path.abspath(args.out), args.no_gpu, args.budget)
    check.load()
    env = check.package(args.rebuild_ext) if parts & {"python", "zoo"} else None
    if "graph" in parts:
        for t in GRAPH_TESTS:
            check.gtest(t, 150 if t == "cuda_graph_test" else 60)
    if "harness" in parts:
        check.harness()
    if "python" in parts:
        check.python(env)
    if "bench" in parts:
        check.bench()
    if "zoo" in parts:
        check.zoo(env)
    return check.finish(started)


if __name__ == "__main__":
    sys.exit(main())
