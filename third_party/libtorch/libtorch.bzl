"""Repository rule that finds LibTorch and exposes it as @libtorch.

Where LibTorch comes from, first match wins:
  1. RELOADSAFE_LIBTORCH: an unpacked LibTorch distribution, or the `torch`
     folder of a Python installation (both have include/ and lib/).
  2. RELOADSAFE_PYTHON (the interpreter //python's extension is built for,
     see third_party/python/python.bzl): that interpreter's `torch` package.
  3. The `torch` package of the Python environment that tools/setup.sh creates
     in the per-machine cache:
     ${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}/venv/lib/python3.*/site-packages/torch.
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
  @libtorch//:version.bzl LIBTORCH_VERSION, as the installation reports it.
"""

_ENV = ["RELOADSAFE_LIBTORCH", "RELOADSAFE_PYTHON", "RELOADSAFE_CACHE", "XDG_CACHE_HOME", "HOME", "CUDA_HOME", "CUDA_PATH"]

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

def _venv_torch(rctx, cache):
    """The torch package folder of $CACHE/venv, or the path it would have."""
    lib = rctx.path(cache + "/venv/lib")
    if lib.exists:
        for d in sorted([str(p) for p in lib.readdir()]):
            if d.split("/")[-1].startswith("python3"):
                candidate = d + "/site-packages/torch"
                if rctx.path(candidate).exists:
                    return candidate
    return cache + "/venv/lib/python3/site-packages/torch"

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
    version = rctx.attr.version
    cache = _cache_dir(env)
    root = env.get("RELOADSAFE_LIBTORCH", "")
    source = "RELOADSAFE_LIBTORCH"
    if not root and env.get("RELOADSAFE_PYTHON"):
        root = _python_torch(rctx, env["RELOADSAFE_PYTHON"])
        source = "RELOADSAFE_PYTHON"
    if not root:
        root = _venv_torch(rctx, cache)
        source = "the Python environment of the reloadsafe cache"
    for sub in ["include", "lib"]:
        if not rctx.path(root + "/" + sub).exists:
            fail(("LibTorch not found at %s (from %s): %s/ is missing. Run tools/setup.sh " +
                  "to install torch %s in its Python environment, or set RELOADSAFE_LIBTORCH to an " +
                  "unpacked LibTorch or a torch package folder.") % (root, source, sub, version))
    rctx.symlink(root + "/include", "include")
    rctx.symlink(root + "/lib", "lib")
    found_version = _read_version(rctx, root)
    if source != "RELOADSAFE_LIBTORCH" and not found_version.startswith(version):
        fix = "rerun tools/setup.sh" if source != "RELOADSAFE_PYTHON" else "install torch==%s there" % version
        fail("The torch package at %s (from %s) is %s, not the pinned %s: %s." %
             (root, source, found_version, version, fix))

    runtime_dirs = _runtime_lib_dirs(rctx, env, root)
    lib = str(rctx.path("lib").realpath)
    # DT_RPATH rather than DT_RUNPATH: it also applies to the libraries that
    # LibTorch's own libraries load (cuDNN, NCCL, cuSPARSELt, ...). torch/lib
    # first, so the libraries `import torch` loads are the ones found.
    rpaths = ["-Wl,--disable-new-dtags", "-Wl,-rpath," + lib]
    for d in runtime_dirs:
        rpaths += ["-Wl,-rpath," + d, "-Wl,-rpath-link," + d]

    rctx.file("version.bzl", "LIBTORCH_VERSION = %r\nLIBTORCH_ROOT = %r\n" % (found_version, root))
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{RPATHS}": repr(rpaths),
    })

libtorch_repository = repository_rule(
    implementation = _libtorch_impl,
    attrs = {
        "version": attr.string(mandatory = True),
        "_build_tpl": attr.label(default = "//third_party/libtorch:BUILD.libtorch.tpl"),
    },
    environ = _ENV,
    local = True,
)
