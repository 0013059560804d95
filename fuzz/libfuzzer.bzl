"""libFuzzer binaries built with clang, inside a gcc workspace.

The workspace's C++ toolchain is gcc, which has no libFuzzer, and switching
the toolchain would invalidate every cached action. These rules therefore
call clang++ themselves (found on PATH: Debian's clang 14 with
libclang-rt-14-dev). Every source is compiled once, in its own action, with
-fsanitize=fuzzer-no-link,address,undefined; binaries link with
-fsanitize=fuzzer,address,undefined. The workspace's own flags (--config=asan
and the like) do not apply: these binaries are always instrumented.

  libfuzzer_objects   sources compiled for fuzzing, to share between binaries.
  libfuzzer_binary    a libFuzzer binary: its sources, objects, libraries.
  libfuzzer_test      a libFuzzer binary, its short CI run `<name>_test` and
                      its long run `<name>_soak` (tags manual, soak).

Nothing about the machine is written here. Include paths, headers, shared
libraries and link options (LibTorch's rpaths and the CUDA runtime folders
that the @libtorch repository rule computes) all come from the CcInfo of
`deps`, as cc_binary would get them.

clang++ and its libFuzzer runtime must be installed; without them the build
stops with a message that says what to install. (A stub binary instead was
considered and rejected: Bazel keys an action's result on its inputs, which
installing clang does not change, so a cached stub would outlive the install.)

  libfuzzer_objects(
      name = "utils_objects",
      srcs = ["//utils:storage_fit.cc"],
      hdrs = ["//utils:storage_fit.h"],
      deps = ["@libtorch//:torch_cpu"],
  )
  libfuzzer_binary(
      name = "layout_fuzzer",
      srcs = ["layout_fuzzer.cc"],
      deps = [":utils_objects", "@libtorch//:torch_cpu"],
  )
"""

load("@libtorch//:version.bzl", "LIBTORCH_COPTS")

FuzzObjectsInfo = provider(
    doc = "Objects compiled for libFuzzer, and the headers that declare them.",
    fields = {
        "objects": "depset of .o files",
        "headers": "depset of header files",
    },
)

_SANITIZERS = [
    "-fsanitize=address,undefined",
    # LibTorch is not instrumented; its RTTI and function types are not
    # visible to UBSan (as in the workspace's --config=asan).
    "-fno-sanitize=vptr,function",
    "-fno-sanitize-recover=undefined",
]

# The C++ standard comes first: the one the LibTorch in use needs.
_COPTS = LIBTORCH_COPTS + [
    # Per-operator headers, as //tools:defs.bzl's RS_COPTS (see there).
    "-DAT_PER_OPERATOR_HEADERS",
    "-O1",
    # Line tables only: what a sanitizer's or libFuzzer's stack trace prints,
    # for less compile time than full debug information.
    "-gline-tables-only",
    "-fno-omit-frame-pointer",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]

# Runs clang++ with the action's arguments, or says what to install.
_CLANG = """
if ! command -v clang++ >/dev/null 2>&1; then
  echo "libfuzzer: clang++ is not on PATH; install clang and its libFuzzer runtime" \\
       "(Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
exec clang++ "$@"
"""

_ATTRS = {
    "srcs": attr.label_list(
        allow_files = [".cc", ".h", ".inc"],
        doc = "Sources to compile (headers and .inc files among them are inputs only).",
    ),
    "hdrs": attr.label_list(allow_files = [".h", ".inc"], doc = "Headers the sources include."),
    "deps": attr.label_list(
        providers = [[CcInfo], [FuzzObjectsInfo]],
        doc = "C++ libraries (headers, link inputs) and libfuzzer_objects.",
    ),
    "copts": attr.string_list(),
}

def _compile(ctx):
    """Compiles ctx.files.srcs; returns (objects, CcInfo of deps, headers)."""
    cc = cc_common.merge_cc_infos(
        cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d],
    )
    comp = cc.compilation_context
    include_flags = ["-iquote", ".", "-iquote", ctx.bin_dir.path]
    for path in comp.quote_includes.to_list():
        include_flags += ["-iquote", path]
    for path in comp.includes.to_list() + comp.system_includes.to_list():
        include_flags += ["-isystem", path]
    define_flags = ["-D" + d for d in comp.defines.to_list()]
    headers = depset(
        ctx.files.hdrs,
        transitive = [comp.headers] +
                     [d[FuzzObjectsInfo].headers for d in ctx.attr.deps if FuzzObjectsInfo in d],
    )
    headers = depset(
        [f for f in ctx.files.srcs if not f.path.endswith(".cc")],
        transitive = [headers],
    )
    objects = []
    for src in [f for f in ctx.files.srcs if f.path.endswith(".cc")]:
        obj = ctx.actions.declare_file(
            "_objs/%s/%s.o" % (ctx.label.name, src.short_path.replace("/", "_").replace("..", "_")),
        )
        ctx.actions.run_shell(
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            command = _CLANG,
            arguments = (_COPTS + ["-fsanitize=fuzzer-no-link"] + _SANITIZERS + include_flags +
                         define_flags + ctx.attr.copts + ["-c", src.path, "-o", obj.path]),
            mnemonic = "ClangFuzzCompile",
            progress_message = "Compiling %s for libFuzzer" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
    return objects, cc, headers

def _libfuzzer_objects_impl(ctx):
    objects, _, headers = _compile(ctx)
    return [
        DefaultInfo(files = depset(objects)),
        FuzzObjectsInfo(objects = depset(objects), headers = headers),
    ]

libfuzzer_objects = rule(
    implementation = _libfuzzer_objects_impl,
    doc = "Sources compiled by clang++ for libFuzzer binaries (ASan, UBSan, coverage).",
    attrs = _ATTRS,
)

def _libfuzzer_binary_impl(ctx):
    own, cc, _ = _compile(ctx)
    objects = own + depset(
        transitive = [d[FuzzObjectsInfo].objects for d in ctx.attr.deps if FuzzObjectsInfo in d],
    ).to_list()
    libraries = []
    link_flags = []
    for linker_input in cc.linking_context.linker_inputs.to_list():
        link_flags += linker_input.user_link_flags
        for lib in linker_input.libraries:
            f = lib.dynamic_library or lib.static_library or lib.pic_static_library
            if f:
                libraries.append(f)
    binary = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.run_shell(
        inputs = objects + libraries,
        outputs = [binary],
        command = _CLANG,
        arguments = (["-fsanitize=fuzzer"] + _SANITIZERS + [o.path for o in objects] +
                     [l.path for l in libraries] + link_flags + ctx.attr.linkopts +
                     ["-o", binary.path]),
        mnemonic = "ClangFuzzLink",
        progress_message = "Linking libFuzzer binary %s" % binary.short_path,
        use_default_shell_env = True,
    )
    return [DefaultInfo(
        executable = binary,
        files = depset([binary]),
        runfiles = ctx.runfiles(files = libraries),
    )]

libfuzzer_binary = rule(
    implementation = _libfuzzer_binary_impl,
    doc = "A libFuzzer binary compiled and linked by clang++ with ASan and UBSan.",
    executable = True,
    attrs = dict(_ATTRS, linkopts = attr.string_list()),
)

def libfuzzer_test(
        name,
        corpus,
        dict = None,
        runs = 100000,
        max_total_time = 30,
        soak_time = 1800,
        seed = 20261130,
        **kwargs):
    """A libFuzzer binary `name`, its CI run and its soak run.

    `<name>_test` (in `bazel test //...`) runs the fuzzer from the seed
    corpus with a fixed seed, at most `runs` inputs and `max_total_time`
    seconds. `<name>_soak` (tags `manual`, `soak`: `bazel test --config=soak`)
    runs it for `soak_time` seconds with a random seed. Both go through
    run_fuzzer.sh, which fails on a crash, hang, leak or sanitizer report and
    keeps the input. `corpus` is the folder of seed inputs (under this
    package), `dict` an optional libFuzzer dictionary; other arguments go to
    libfuzzer_binary.
    """
    libfuzzer_binary(name = name, **kwargs)
    native.filegroup(
        name = name + "_corpus",
        srcs = native.glob([corpus + "/*"]) + ([dict] if dict else []),
    )
    pkg = native.package_name()
    common = ["$(location :%s)" % name, pkg + "/" + corpus] + (
        ["-dict=%s/%s" % (pkg, dict)] if dict else []
    )
    data = [":" + name, ":%s_corpus" % name]
    native.sh_test(
        name = name + "_test",
        size = "medium",
        srcs = ["//fuzz:run_fuzzer.sh"],
        args = common + [
            "-runs=%d" % runs,
            "-max_total_time=%d" % max_total_time,
            "-seed=%d" % seed,
            "-timeout=10",
        ],
        data = data,
        tags = ["libfuzzer"],
    )
    native.sh_test(
        name = name + "_soak",
        size = "large",
        srcs = ["//fuzz:run_fuzzer.sh"],
        args = common + [
            "-max_total_time=%d" % soak_time,
            "-timeout=30",
        ],
        data = data,
        tags = ["manual", "soak"],
    )
