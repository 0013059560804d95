"""Repository rule that finds LibTorch and exposes it as @libtorch.

Any torch from SUPPORTED_TORCH[0] to SUPPORTED_TORCH[1] (2.11 to 2.15) is
accepted; the rule reads the version of the one it finds and picks what that
version needs (the C++ standard, see CXX_STANDARDS). Outside the range the
fetch stops with an error naming the range. The C++ ABI, the CUDA runtime
libraries and the Python version follow the torch that is found.

Where LibTorch comes from, first match wins:
  1. RELOADSAFE_LIBTORCH: an unpacked LibTorch distribution, or the `torch`
     folder of a Python installation (both have include/ and lib/).
  2. RELOADSAFE_PYTHON (the interpreter //python's extension is built for,
     see third_party/python/python.bzl): that interpreter's `torch` package.
  3. The `torch` package of a Python environment that tools/setup.sh creates
     in the per-machine cache:
     ${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}/${RELOADSAFE_VENV:-venv}/lib/python3.*/site-packages/torch
     (`venv` holds the default torch; `--config=torch2.15` in .bazelrc sets
     RELOADSAFE_VENV=venv-torch2.15, the newest).
     One torch for both sides: the Python extension (//python) and the C++
     binaries load the very libraries `import torch` loads.

Run-time library search: a torch package's own libraries carry an RPATH into
the sibling `nvidia/*/lib` folders (the CUDA runtime, cuDNN, NCCL, ... from the
nvidia-* packages). Binaries built here get an RPATH to torch/lib and to those
same folders (and to a CUDA Toolkit's, if any), and the link resolves the
libraries LibTorch needs through them (-rpath-link).

The rule declares the variables it reads, so Bazel reruns it when they change.

Targets:
  @libtorch//:torch_cpu   ATen, c10 and the C++ frontend, CPU libraries only.
  @libtorch//:torch_cuda  adds libtorch_cuda and libc10_cuda.
  @libtorch//:version.bzl LIBTORCH_VERSION, as the installation reports it
                          (2.15.0+cu132); LIBTORCH_SERIES ("2.15");
                          LIBTORCH_CXX_STANDARD ("c++20"); LIBTORCH_COPTS, the
                          compile options every C++ source that includes
                          LibTorch's headers needs (tools/defs.bzl adds them to
                          every target of the project; a backend author's own
                          targets get them from reload_backend, or can load them).
"""

# The torch releases this project builds against and tests: the oldest is the
# GPU test machine's, the newest the registry's newest. tools/test.sh tests
# both ends (tools/setup.sh installs them).
SUPPORTED_TORCH = ((2, 11), (2, 15))

# The C++ standard each torch series' headers need, oldest first: the first
# entry whose series is not newer than the torch found applies.
#
# torch 2.14 is the first that needs C++20: its ATen/ATen.h and
# torch/csrc/api/include/torch/all.h stop with "#error C++20 or later
# compatible compiler is required", and its c10/util/intrusive_ptr.h defines
# operator<=> returning std::strong_ordering (2.15's c10 adds std::bit_width
# and requires-clauses). 2.11, 2.12 and 2.13 ask for C++17. Established by
# compiling a translation unit that includes <torch/torch.h> with g++ 12, as
# -std=c++17 and as -std=c++20, against each release's wheel headers: C++17
# compiles for 2.11-2.13 and fails for 2.14 and 2.15; C++20 compiles for all.
CXX_STANDARDS = [
    ((2, 14), "c++20"),
    ((0, 0), "c++17"),
]

_ENV = ["RELOADSAFE_LIBTORCH", "RELOADSAFE_PYTHON", "RELOADSAFE_VENV", "RELOADSAFE_CACHE", "XDG_CACHE_HOME", "HOME", "CUDA_HOME", "CUDA_PATH"]

def _cache_dir(env):
    if env.get("RELOADSAFE_CACHE"):
        return env["RELOADSAFE_CACHE"]
    if env.get("XDG_CACHE_HOME"):
        return env["XDG_CACHE_HOME"] + "/reloadsafe"
    if not env.get("HOME"):
        fail("Neither RELOADSAFE_CACHE, XDG_CACHE_HOME nor HOME is set: set RELOADSAFE_CACHE " +
             "to the folder tools/setup.sh installs into.")
    return env["HOME"] + "/.cache/reloadsafe"

def _read_version(rctx, root):
    # A torch package has version.py; a LibTorch zip has build-version.
    for name in ["version.py", "build-version", "../version.py"]:
        p = rctx.path(root + "/" + name)
        if p.exists:
            for line in rctx.read(p).splitlines():
                line = line.strip()
                if name.endswith("build-version") and line:
                    return line
                if line.startswith("__version__"):
                    return line.split("=")[1].strip().strip("'\"")
    return "unknown"

def parse_series(version):
    """(major, minor) of a torch version string ("2.15.0+cu132", "2.14.0a0"),
    or None if it does not start with two dot-separated numbers."""
    parts = version.split("+")[0].split(".")
    if len(parts) < 2:
        return None
    digits = [parts[0], ""]
    for ch in parts[1].elems():
        if not ch.isdigit():
            break
        digits[1] += ch
    if not digits[0].isdigit() or not digits[1]:
        return None
    return (int(digits[0]), int(digits[1]))

def cxx_standard(series):
    """The C++ standard (a -std= value) torch `series` needs (CXX_STANDARDS)."""
    for first, standard in CXX_STANDARDS:
        if series >= first:
            return standard
    fail("CXX_STANDARDS has no entry for torch %d.%d" % series)

def _header_standard(rctx):
    """The standard ATen/ATen.h itself demands ("c++20" for "#error C++20 or
    later ..."), or None. A guard for a LibTorch built from source whose
    requirement moved ahead of its version number."""
    p = rctx.path("include/ATen/ATen.h")
    if not p.exists:
        return None
    for line in rctx.read(p).splitlines():
        if line.startswith("#error C++") and " or later" in line:
            return "c++" + line[len("#error C++"):].split(" ")[0]
    return None

def _std_year(standard):
    """17 for "c++17"; C++ standards sort by their (two-digit) year."""
    return int(standard[len("c++"):])

def _series_text(series):
    return "%d.%d" % series

def _venv_dir(env, cache):
    """The cache's Python environment: RELOADSAFE_VENV (a folder name in the
    cache, or an absolute path), by default `venv`."""
    name = env.get("RELOADSAFE_VENV", "") or "venv"
    return name if name.startswith("/") else cache + "/" + name

def _venv_torch(rctx, venv):
    """The torch package folder of Python environment `venv`, or the path it
    would have."""
    lib = rctx.path(venv + "/lib")
    if lib.exists:
        for d in sorted([str(p) for p in lib.readdir()]):
            if d.split("/")[-1].startswith("python3"):
                candidate = d + "/site-packages/torch"
                if rctx.path(candidate).exists:
                    return candidate
    return venv + "/lib/python3/site-packages/torch"

def _python_torch(rctx, python):
    """The torch package folder of interpreter `python`, found without
    importing torch."""
    res = rctx.execute([python, "-c", "import importlib.util as u; s = u.find_spec('torch'); " +
                                      "print(list(s.submodule_search_locations)[0] if s else '')"])
    if res.return_code != 0 or not res.stdout.strip():
        fail("RELOADSAFE_PYTHON=%s has no torch package (%s): install torch there or set " % (python, res.stderr.strip()) +
             "RELOADSAFE_LIBTORCH.")
    return res.stdout.strip()

def _runtime_lib_dirs(rctx, env, root):
    """Folders holding the CUDA runtime that a CUDA build of LibTorch needs
    even for CPU work (libtorch_cpu links libcudart and libcupti): first the
    nvidia-* packages beside a torch package, then a CUDA Toolkit's."""
    found = []
    nvidia = rctx.path(root + "/../nvidia")
    if nvidia.exists:
        for pkg in sorted([str(p) for p in nvidia.readdir()]):
            if rctx.path(pkg + "/lib").exists:
                found.append(str(rctx.path(pkg + "/lib").realpath))
    candidates = []
    for var in ["CUDA_HOME", "CUDA_PATH"]:
        if env.get(var):
            candidates += [env[var] + "/lib64", env[var] + "/extras/CUPTI/lib64"]
    candidates += [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/extras/CUPTI/lib64",
    ]
    for d in candidates:
        p = rctx.path(d)
        if p.exists and d not in found:
            found.append(d)
    return found

def _libtorch_impl(rctx):
    env = rctx.os.environ
    cache = _cache_dir(env)
    root = env.get("RELOADSAFE_LIBTORCH", "")
    source = "RELOADSAFE_LIBTORCH"
    if not root and env.get("RELOADSAFE_PYTHON"):
        root = _python_torch(rctx, env["RELOADSAFE_PYTHON"])
        source = "RELOADSAFE_PYTHON"
    if not root:
        venv = _venv_dir(env, cache)
        root = _venv_torch(rctx, venv)
        source = "the Python environment %s" % venv
    lo, hi = SUPPORTED_TORCH
    supported = "torch %s to %s" % (_series_text(lo), _series_text(hi))
    for sub in ["include", "lib"]:
        if not rctx.path(root + "/" + sub).exists:
            fail(("LibTorch not found at %s (from %s): %s/ is missing. Run tools/setup.sh " +
                  "to install it in the cache's Python environments, or set RELOADSAFE_PYTHON to a " +
                  "Python with %s, or RELOADSAFE_LIBTORCH to an unpacked LibTorch or a torch " +
                  "package folder.") % (root, source, sub, supported))
    rctx.symlink(root + "/include", "include")
    rctx.symlink(root + "/lib", "lib")
    found_version = _read_version(rctx, root)
    series = parse_series(found_version)
    if series == None:
        fail(("Could not read the torch version of %s (from %s): it has no version.py or " +
              "build-version. reloadsafe supports %s.") % (root, source, supported))
    if series < lo or series > hi:
        fail(("The torch at %s (from %s) is %s; reloadsafe supports %s: install one of " +
              "those there (pip install 'torch>=%s,<%d.%d'), or point RELOADSAFE_PYTHON or " +
              "RELOADSAFE_LIBTORCH at one.") %
             (root, source, found_version, supported, _series_text(lo), hi[0], hi[1] + 1))
    standard = cxx_standard(series)
    demanded = _header_standard(rctx)
    if demanded != None and _std_year(demanded) > _std_year(standard):
        standard = demanded

    runtime_dirs = _runtime_lib_dirs(rctx, env, root)
    lib = str(rctx.path("lib").realpath)
    # DT_RPATH rather than DT_RUNPATH: it also applies to the libraries that
    # LibTorch's own libraries load (cuDNN, NCCL, cuSPARSELt, ...). torch/lib
    # first, so the libraries `import torch` loads are the ones found.
    rpaths = ["-Wl,--disable-new-dtags", "-Wl,-rpath," + lib]
    for d in runtime_dirs:
        rpaths += ["-Wl,-rpath," + d, "-Wl,-rpath-link," + d]

    rctx.file("version.bzl", "\n".join([
        "LIBTORCH_VERSION = %r" % found_version,
        "LIBTORCH_SERIES = %r" % _series_text(series),
        "LIBTORCH_ROOT = %r" % root,
        "LIBTORCH_CXX_STANDARD = %r" % standard,
        "LIBTORCH_COPTS = %r" % ["-std=" + standard],
        "",
    ]))
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{RPATHS}": repr(rpaths),
    })

libtorch_repository = repository_rule(
    implementation = _libtorch_impl,
    attrs = {
        "_build_tpl": attr.label(default = "//third_party/libtorch:BUILD.libtorch.tpl"),
    },
    environ = _ENV,
    local = True,
)
