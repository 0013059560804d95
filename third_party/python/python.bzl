"""Repository rule that finds the Python interpreter the extension is built for
and exposes its headers as @local_python.

Which interpreter, first match wins:
  1. RELOADSAFE_PYTHON: a Python executable (for example your own virtual
     environment's `bin/python`, with a torch from 2.11 to 2.15 installed in it).
  2. A Python environment tools/setup.sh creates in the per-machine cache:
     ${RELOADSAFE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reloadsafe}/${RELOADSAFE_VENV:-venv}/bin/python
     (RELOADSAFE_VENV: a folder name in the cache or an absolute path; the
     same variable picks @libtorch's torch, see libtorch.bzl).

The rule asks the interpreter for its header folder, extension suffix and wheel
tags (sysconfig; torch is located without being imported). It declares the
variables it reads, so Bazel reruns it when they change. Without an interpreter
the repository is a dummy: PYTHON_FOUND is False in @local_python//:defs.bzl
and //python defines no targets, so the C++ build still works.

Targets:
  @local_python//:headers   Python.h and friends of that interpreter.
  @local_python//:defs.bzl  PYTHON_FOUND, PYTHON_BIN, PYTHON_VERSION,
                            PYTHON_TAG (cp311), PLATFORM_TAG (linux_x86_64),
                            EXT_SUFFIX (.cpython-311-x86_64-linux-gnu.so),
                            TORCH_DIR (that interpreter's torch package or "").
"""

_ENV = ["RELOADSAFE_PYTHON", "RELOADSAFE_VENV", "RELOADSAFE_CACHE", "XDG_CACHE_HOME", "HOME"]

_QUERY = """
import importlib.util, sys, sysconfig
spec = importlib.util.find_spec("torch")
torch_dir = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else ""
print(sysconfig.get_paths()["include"])
print("%d.%d" % sys.version_info[:2])
print("cp%d%d" % sys.version_info[:2])
print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))
print(sysconfig.get_config_var("EXT_SUFFIX"))
print(torch_dir)
"""

def _cache_dir(env):
    if env.get("RELOADSAFE_CACHE"):
        return env["RELOADSAFE_CACHE"]
    if env.get("XDG_CACHE_HOME"):
        return env["XDG_CACHE_HOME"] + "/reloadsafe"
    if env.get("HOME"):
        return env["HOME"] + "/.cache/reloadsafe"
    return None

def _dummy(rctx, why):
    rctx.file("defs.bzl", "PYTHON_FOUND = False\nPYTHON_MISSING = %r\n" % why +
                          "PYTHON_BIN = ''\nPYTHON_VERSION = ''\nPYTHON_TAG = ''\n" +
                          "PLATFORM_TAG = ''\nEXT_SUFFIX = ''\nTORCH_DIR = ''\n")
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
# No Python interpreter was found (see defs.bzl): this target is empty.
cc_library(name = "headers")
""")

def _python_impl(rctx):
    env = rctx.os.environ
    py = env.get("RELOADSAFE_PYTHON", "")
    if not py:
        cache = _cache_dir(env)
        if cache == None:
            return _dummy(rctx, "neither RELOADSAFE_PYTHON, RELOADSAFE_CACHE, XDG_CACHE_HOME nor HOME is set")
        venv = env.get("RELOADSAFE_VENV", "") or "venv"
        py = (venv if venv.startswith("/") else cache + "/" + venv) + "/bin/python"
    if not rctx.path(py).exists:
        return _dummy(rctx, "no Python interpreter at %s: run tools/setup.sh or set RELOADSAFE_PYTHON" % py)
    res = rctx.execute([py, "-c", _QUERY])
    if res.return_code != 0:
        fail("Could not query the Python interpreter %s (RELOADSAFE_PYTHON or the cache's venv): %s" %
             (py, res.stderr))
    include, version, tag, platform, ext_suffix, torch_dir = (res.stdout.splitlines() + [""] * 6)[:6]
    if not rctx.path(include + "/Python.h").exists:
        fail(("The Python interpreter %s has no Python.h in %s: install its development " +
              "headers (Debian: python3-dev) or set RELOADSAFE_PYTHON to one that has them.") % (py, include))
    rctx.symlink(include, "include")
    rctx.file("defs.bzl", "\n".join([
        "PYTHON_FOUND = True",
        "PYTHON_MISSING = ''",
        "PYTHON_BIN = %r" % py,
        "PYTHON_VERSION = %r" % version,
        "PYTHON_TAG = %r" % tag,
        "PLATFORM_TAG = %r" % platform,
        "EXT_SUFFIX = %r" % ext_suffix,
        "TORCH_DIR = %r" % torch_dir,
        "",
    ]))
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)
""")

python_repository = repository_rule(
    implementation = _python_impl,
    environ = _ENV,
    local = True,
)
