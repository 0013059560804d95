"""Macros for the kinds of targets reloadsafe has many of.

Each macro puts the project's warning flags, test framework, tags and
environment in one place:

  rs_library        a library of the project (warnings are errors).
  rs_binary         a command-line program of the project.
  rs_test           a GoogleTest unit test on the CPU.
  rs_property_test  a RapidCheck property test, with fixed seed and case count
                    for CI (override with --test_env=RC_PARAMS=...), and its
                    soak run `<name minus _test>_soak` (tags manual, soak).
  rs_cuda_library   a library that needs CUDA headers and LibTorch's CUDA
                    library, linked whole; empty where no CUDA Toolkit is
                    found, so its dependents build everywhere.
  rs_gpu_test       a GoogleTest test that needs CUDA: tagged `gpu` so the
                    default run leaves it out; `--config=gpu` runs it.
  rs_benchmark      a Google Benchmark binary plus `<name>_smoke`, a cc_test
                    that runs every benchmark once, briefly.
"""

load("@libtorch//:version.bzl", "LIBTORCH_COPTS")
load("@local_cuda//:defs.bzl", "CUDA_FOUND")

# The C++ standard the LibTorch in use needs (c++17 up to torch 2.13, c++20
# from 2.14: third_party/libtorch/libtorch.bzl picks it), then warnings as
# errors for the project's own sources. External headers come in through
# -isystem and stay quiet.
#
# AT_PER_OPERATOR_HEADERS, as PyTorch builds its own sources: ATen's helper
# headers (TensorIndexing.h, ScalarOps.h, TensorOperators.h, ...) then include
# the few ATen/ops/<op>.h they use instead of ATen/Functions.h (every
# operator), and a source that starts with
# `#define TORCH_ASSERT_ONLY_METHOD_OPERATORS` fails to compile if anything it
# includes still brings every operator (see ATen/Functions.h). Such a source
# includes <ATen/core/Tensor.h> and an <ATen/ops/<op>.h> per at::<op> it calls.
RS_COPTS = LIBTORCH_COPTS + [
    "-DAT_PER_OPERATOR_HEADERS",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
]

_TORCH_CPU = "@libtorch//:torch_cpu"
_TORCH_CUDA = "@libtorch//:torch_cuda"
_GTEST_MAIN = "@gtest//:gtest_main"

def rs_library(name, copts = [], deps = [], **kwargs):
    native.cc_library(
        name = name,
        copts = RS_COPTS + copts,
        deps = deps + [_TORCH_CPU],
        **kwargs
    )

def rs_binary(name, copts = [], deps = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = RS_COPTS + copts,
        deps = deps + [_TORCH_CPU],
        **kwargs
    )

def rs_test(name, srcs, deps = [], copts = [], size = "small", **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        size = size,
        copts = RS_COPTS + copts,
        deps = deps + [_TORCH_CPU, _GTEST_MAIN],
        **kwargs
    )

def rs_property_test(
        name,
        srcs,
        deps = [],
        rc_params = "seed=1 max_success=200",
        soak_cases = None,
        size = "medium",
        tags = [],
        **kwargs):
    """A RapidCheck property test, and its soak run.

    `rc_params` sets RC_PARAMS for the CI run (a fixed seed, so CI is
    repeatable); `--test_env=RC_PARAMS="reproduce=..."` replays a failure.

    With `soak_cases`, `<name without _test>_soak` runs the same binary's
    properties with that many cases each and a random seed
    (//tools:soak_properties.sh); it is tagged `manual` and `soak`, so only
    `bazel test --config=soak` runs it.
    """
    native.cc_test(
        name = name,
        srcs = srcs,
        size = size,
        copts = RS_COPTS,
        env = {"RC_PARAMS": rc_params},
        tags = tags + ["property"],
        deps = deps + [_TORCH_CPU, "@rapidcheck", _GTEST_MAIN],
        **kwargs
    )
    if soak_cases != None:
        native.sh_test(
            name = soak_name(name),
            size = "large",
            srcs = ["//tools:soak_properties.sh"],
            args = [
                "$(location :%s)" % name,
                str(soak_cases),
            ],
            data = [":" + name],
            tags = ["manual", "soak"],
        )

def soak_name(name):
    """The soak target of test `name`: `foo_test` -> `foo_soak`."""
    return (name[:-len("_test")] if name.endswith("_test") else name) + "_soak"

def rs_cuda_library(name, srcs, deps = [], **kwargs):
    """A library of CUDA host code (no .cu files) of the project.

    It registers what it provides from static initialisers, so it is linked
    whole (alwayslink), and it keeps libtorch_cuda.so in every binary that
    links it: its code calls into that library, so `--as-needed` cannot drop
    it. Without a CUDA Toolkit it is an empty library.
    """
    if CUDA_FOUND:
        native.cc_library(
            name = name,
            srcs = srcs,
            copts = RS_COPTS,
            alwayslink = True,
            deps = deps + [_TORCH_CUDA],
            **kwargs
        )
    else:
        native.cc_library(name = name, deps = deps, **kwargs)

def rs_gpu_test(
        name,
        srcs,
        deps = [],
        size = "medium",
        tags = [],
        needs_cuda_headers = True,
        **kwargs):
    """A test that needs a CUDA device.

    Tagged `gpu` (out of the default run; `bazel test --config=gpu //...` runs
    it). At run time it skips with a reason where no device is visible. On a
    machine without the CUDA Toolkit it is replaced by a test that skips and
    says so, because the sources need CUDA headers to compile; with
    `needs_cuda_headers = False` (sources written against c10's
    device-generic API) the sources are built there too, against LibTorch's
    CPU library, and skip at run time.
    """
    if CUDA_FOUND or not needs_cuda_headers:
        native.cc_test(
            name = name,
            srcs = srcs,
            size = size,
            copts = RS_COPTS,
            tags = tags + ["gpu"],
            deps = deps + [_TORCH_CUDA if CUDA_FOUND else _TORCH_CPU, _GTEST_MAIN],
            # The project's libraries linked in, not as Bazel's per-library
            # shared objects: tools/gpu_bundle.sh carries the binary alone to
            # a GPU machine, which has LibTorch and nothing of Bazel's.
            linkstatic = True,
            **kwargs
        )
    else:
        native.cc_test(
            name = name,
            srcs = ["//tools:no_cuda_test.cc"],
            size = "small",
            copts = RS_COPTS,
            tags = tags + ["gpu"],
            deps = [_GTEST_MAIN],
        )

def rs_benchmark(name, srcs, deps = [], smoke_args = [], tags = [], **kwargs):
    """A Google Benchmark binary and its smoke test.

    `bazel run -c opt //pkg:name -- --benchmark_out=...` measures;
    `<name>_smoke` runs each benchmark for a minimal time in `bazel test`, so
    a benchmark that breaks is caught by the tests.
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = RS_COPTS,
        deps = deps + [_TORCH_CPU, "@benchmark"],
        tags = tags,
        **kwargs
    )
    native.sh_test(
        name = name + "_smoke",
        srcs = ["//tools:benchmark_smoke.sh"],
        args = ["$(location :%s)" % name] + smoke_args,
        data = [":" + name],
        size = "medium",
        tags = tags + ["benchmark_smoke"],
    )
