"""Bazel macros for running the reload harness over your own C++ backends,
from your own workspace (reloadsafe as an external repository: see deps.bzl).

    # BUILD of your project
    load("@reloadsafe//conformance/harness:defs.bzl", "reload_backend", "reload_harness_test")

    reload_backend(
        name = "my_backend",
        srcs = ["my_backend.cc"],      # ends with RELOADSAFE_REGISTER_BACKEND(MyBackend);
        deps = [":my_kernels"],
    )

    reload_harness_test(
        name = "my_kernels_reload_test",
        backends = [":my_backend"],
    )

`bazel test //:my_kernels_reload_test` runs every backend it links through
the reload protocol (conformance/harness/harness.h) in both modes: one
GoogleTest test per backend (the XML Bazel keeps as test.xml), the table of
every backend in the test log, and the JSON report in the test's undeclared
outputs (harness.json). The test fails when a backend loses an address, a
read, its values or its memory bound in a mode it claims, or when a negative
control (Backend::negative_control()) goes unflagged.

The macros are also usable inside this repository (labels here resolve to
reloadsafe whatever name the workspace gives it).
"""

load("@libtorch//:version.bzl", "LIBTORCH_COPTS")

_HARNESS = Label("//conformance/harness:harness")
_TEST_MAIN = Label("//conformance/harness:harness_test_main")
_TORCH_CPU = "@libtorch//:torch_cpu"
_TORCH_CUDA = "@libtorch//:torch_cuda"

def reload_backend(name, srcs, deps = [], copts = [], **kwargs):
    """A library of harness backends (reloadsafe::harness::Backend subclasses).

    Linked whole (alwayslink), so the RELOADSAFE_REGISTER_BACKEND lines in
    `srcs` register their backends in every binary that links it; compiled
    with the C++ standard the LibTorch in use needs (LIBTORCH_COPTS: C++17 up
    to torch 2.13, C++20 from 2.14) before `copts`; depends on the harness's
    headers and LibTorch.
    """
    native.cc_library(
        name = name,
        srcs = srcs,
        copts = LIBTORCH_COPTS + copts,
        deps = deps + [_HARNESS, _TORCH_CPU],
        alwayslink = True,
        **kwargs
    )

def reload_harness_test(
        name,
        backends,
        reloads = None,
        device = "cpu",
        seed = None,
        args = [],
        size = "medium",
        tags = [],
        **kwargs):
    """A `bazel test` target: the reload harness over `backends`.

    Args:
      name: the test's name.
      backends: reload_backend targets (or cc_library targets with
        alwayslink = True) whose registered backends the test runs.
      reloads: reloads per mode (the harness's default, kDefaultReloads in
        run_options.h, when None).
      device: "cpu", or "cuda"/"cuda:I" (the test is then tagged `gpu`, and
        skips where no CUDA device is visible).
      seed: the checkpoint seed (the harness's default when None).
      args: more arguments for the test binary (--no-trace, gtest flags).
      size, tags, **kwargs: as for cc_test.
    """
    if not backends:
        fail("reload_harness_test %s: `backends` is empty; name the reload_backend targets to test" % name)
    flags = ["--device", device]
    if reloads != None:
        flags += ["--reloads", str(reloads)]
    if seed != None:
        flags += ["--seed", str(seed)]
    cuda = device.startswith("cuda")
    native.cc_test(
        name = name,
        size = size,
        args = flags + args,
        tags = tags + (["gpu"] if cuda else []),
        deps = backends + [_TEST_MAIN, _TORCH_CUDA if cuda else _TORCH_CPU],
        **kwargs
    )
