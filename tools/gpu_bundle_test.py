"""The GPU bundle on a machine without a GPU, as it would start on one.

tools/gpu_bundle.sh builds the bundle; it is copied to a folder outside the
checkout and its gpu_check.sh is run with an environment that holds nothing
of Bazel's (no runfiles, no LD_LIBRARY_PATH, a bare PATH): every binary and
the Python package must start, and every GPU test must report a skip whose
reason is "no CUDA device". A loader error, a missing symbol or an
ImportError fails. Run by tools/test.sh with the set-up's venv:

    ~/.cache/reloadsafe/venv/bin/python -m pytest tools/gpu_bundle_test.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bare_env(home: str) -> dict[str, str]:
    """What a fresh shell on another machine has: no Bazel, no runfiles, no
    library path; the Python with torch is named by PYTHON."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "PYTHON": sys.executable, "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> str:
    build = tmp_path_factory.mktemp("build") / "gpu_bundle"
    subprocess.run([os.path.join(TOP, "tools", "gpu_bundle.sh"), "--fast", "--out", str(build)], check=True, cwd=TOP)
    # Carried elsewhere, as to the GPU machine: nothing may point back here.
    there = tmp_path_factory.mktemp("there") / "gpu_bundle"
    shutil.copytree(build, there, symlinks=False)
    shutil.rmtree(build)
    return str(there)


def _check(bundle: str, out: str, *args: str) -> tuple[int, str, str]:
    p = subprocess.run([os.path.join(bundle, "gpu_check.sh"), "--no-gpu", "--out", out, *args],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_bare_env(out),
                       cwd=out)
    summary = ""
    if os.path.exists(os.path.join(out, "summary.md")):
        with open(os.path.join(out, "summary.md")) as f:
            summary = f.read()
    return p.returncode, p.stdout, summary


def _rows(summary: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("part", "---"):
            rows[cells[0]] = (cells[1], cells[3])
    return rows


def test_the_bundle_is_self_contained(bundle: str) -> None:
    for name in ("cuda_graph_reload_test", "cuda_graph_test", "file_loader_device_test", "reload_harness", "copy_bench"):
        path = os.path.join(bundle, "bin", name)
        assert os.access(path, os.X_OK), name
        rpath = subprocess.run(["patchelf", "--print-rpath", path], stdout=subprocess.PIPE, text=True).stdout.strip()
        assert rpath == "$ORIGIN/../lib", f"{name} looks for libraries in {rpath}"
        needed = subprocess.run(["patchelf", "--print-needed", path], stdout=subprocess.PIPE, text=True).stdout
        assert "_S" not in needed, f"{name} needs Bazel's per-library objects: {needed}"
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(bundle) for f in fs)
    assert size < 48 << 20, f"the bundle is {size >> 20} MiB; it must travel in well under 64 MiB"


def test_every_part_starts_and_each_gpu_test_skips_for_want_of_a_device(bundle: str, tmp_path) -> None:
    rc, log, summary = _check(bundle, str(tmp_path))
    assert rc == 0, log
    rows = _rows(summary)
    for part in ("load cuda_graph_reload_test", "load cuda_graph_test", "load file_loader_device_test",
                 "load reload_harness", "load copy_bench", "load python package"):
        assert rows[part][0] == "ok", (part, rows[part])
    assert "CUDA linked (aten::mm has a CUDA kernel, graph step linked)" in rows["load reload_harness"][1]
    for part in ("cuda_graph_reload_test", "cuda_graph_test", "file_loader_device_test", "harness", "python", "bench",
                 "zoo"):
        assert rows[part][0] == "ok (skipped)", (part, rows[part])
        assert "no CUDA device" in rows[part][1], (part, rows[part])
    assert " 0 failed" in summary
    with tarfile.open(os.path.join(str(tmp_path), "results.tar.gz")) as tar:
        names = tar.getnames()
    assert "results/cuda_graph_test.xml" in names and "results/python_cuda.xml" in names
    assert len(os.listdir(str(tmp_path))) <= 8  # what comes back from a GPU machine


def test_the_extension_builds_there_for_another_python(bundle: str, tmp_path) -> None:
    # What happens on a GPU machine whose Python is not this one's: the
    # bindings compiled there against its headers, linked with the core.
    rc, log, summary = _check(bundle, str(tmp_path), "--rebuild-ext", "--parts", "python")
    assert rc == 0, log
    rows = _rows(summary)
    assert rows["package build"][0] == "ok", rows
    assert rows["load python package"][0] == "ok" and "package_site" in rows["load python package"][1], rows
    assert rows["python"][0] == "ok (skipped)", rows


def test_a_library_that_does_not_load_fails_the_check_and_is_not_run_again(bundle: str, tmp_path) -> None:
    broken = str(tmp_path / "broken")
    shutil.copytree(bundle, broken)
    libs = os.listdir(os.path.join(broken, "lib"))
    assert libs, "the bundle carries Google Benchmark's library"
    for f in libs:
        # Broken rather than removed: this machine has the library too, and
        # the bundle's copy is found first (RPATH $ORIGIN/../lib).
        with open(os.path.join(broken, "lib", f), "wb") as lib:
            lib.write(b"not a shared library")
    out = str(tmp_path / "out")
    os.makedirs(out)
    rc, log, summary = _check(broken, out, "--parts", "bench")
    assert rc == 1, log
    rows = _rows(summary)
    assert rows["load copy_bench"][0] == "FAIL" and "error while loading shared libraries" in rows["load copy_bench"][1]
    assert rows["bench"][0] == "not run", rows
