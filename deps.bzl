"""What a Bazel workspace that builds reloadsafe needs, in one function.

This repository's own WORKSPACE calls it, and so does a backend author's
workspace that uses reloadsafe as an external repository:

    # WORKSPACE of your project
    local_repository(
        name = "reloadsafe",
        path = "/path/to/reloadsafe",      # or an http_archive of a release
    )

    load("@reloadsafe//:deps.bzl", "reloadsafe_dependencies")

    reloadsafe_dependencies()

It declares, unless the workspace declared a repository of that name first
(so a workspace can bring its own):

  @rules_cc, @remote_coverage_tools, @rules_java
      the offline stand-ins for the three repositories Bazel 4.2.3 would
      otherwise download (third_party/rules_cc, third_party/remote_coverage_tools,
      Debian's bazel-rules-java).
  @libtorch       LibTorch, from a torch 2.11 to 2.15 (third_party/libtorch/libtorch.bzl:
                  RELOADSAFE_LIBTORCH, RELOADSAFE_PYTHON, or the cache's venv).
  @local_python   the Python the extension module is built for (third_party/python).
  @local_cuda     the CUDA Toolkit, or a dummy without one (third_party/cuda).
  @gtest, @rapidcheck, @benchmark, @nlohmann_json
                  Debian's libgtest-dev/libgmock-dev, librapidcheck-dev,
                  libbenchmark-dev and nlohmann-json3-dev under /usr.

Call it before anything loads @rules_cc (Bazel's C++ rules do): right after
the load of this file.
"""

load("//third_party/cuda:cuda.bzl", "cuda_repository")
load("//third_party/libtorch:libtorch.bzl", "libtorch_repository")
load("//third_party/python:python.bzl", "python_repository")

def _tree_impl(rctx):
    # Every entry of the folder that holds `marker`, linked into this repository.
    root = rctx.path(rctx.attr.marker).dirname
    for entry in root.readdir():
        rctx.symlink(entry, entry.basename)

# A repository whose files are a folder of this one (named by a file in it),
# found wherever this repository is: local_repository's `path` is relative to
# the main workspace, which is not this repository when reloadsafe is external.
_tree_repository = repository_rule(
    implementation = _tree_impl,
    attrs = {"marker": attr.label(allow_single_file = True, mandatory = True)},
)

_SYSTEM_LIBRARIES = ["gtest", "rapidcheck", "benchmark", "nlohmann_json"]

def _declare(name, rule, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def reloadsafe_dependencies():
    """Declares every repository reloadsafe's BUILD files use (see above)."""
    _declare("rules_cc", _tree_repository, marker = Label("//third_party/rules_cc:WORKSPACE"))
    _declare(
        "remote_coverage_tools",
        _tree_repository,
        marker = Label("//third_party/remote_coverage_tools:WORKSPACE"),
    )
    _declare("rules_java", native.local_repository, path = "/usr/share/bazel/rules/java")

    # LibTorch and the Python interpreter: by default both from the cache's
    # venv (tools/setup.sh), so the C++ tests and the Python extension load
    # the same torch libraries.
    _declare("libtorch", libtorch_repository)
    _declare("local_python", python_repository)
    _declare("local_cuda", cuda_repository)

    for name in _SYSTEM_LIBRARIES:
        _declare(
            name,
            native.new_local_repository,
            build_file = str(Label("//third_party/system:%s.BUILD" % name)),
            path = "/usr",
        )
