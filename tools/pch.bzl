"""A precompiled header for gcc, built with the toolchain's own command line.

Most of a fastbuild compile of a source that includes utils/layer.h is
parsing LibTorch's headers: <torch/nn/module.h> (which brings all of ATen) is
about 7 s of gcc 12's time on a two-core machine, out of 10 to 13 for the
whole source. `cc_precompiled_header` parses a header once per
configuration; a source compiled with `-include <name>.h` then loads the
parsed form, in about 2 s.

How gcc finds it: for `-include foo.h` it searches the quote include path, and
where it finds `foo.h` beside a valid `foo.h.gch` it reads the latter instead.
The rule writes both into its output folder and puts that folder on the quote
include path of its dependents (a CcInfo, as any cc_library provides).

Validity: gcc uses the `.gch` only where the source is compiled with the
options that matter to it (the standard, -fPIC, the macros defined on the
command line, the optimisation and sanitizer flags); otherwise it parses the
header as text, which is correct and only slower. The rule therefore builds
the header with the exact command line Bazel's C++ rules give a source of the
same configuration (the toolchain's features, --copt and --cxxopt, and
`copts`, which must be the dependents' own), so that --config=asan, tsan and
torch2.15 each get their own, valid one. Position-independent code only: the
sources here are compiled PIC (tests and the extension link them
dynamically); a non-PIC compile falls back to the text.

Where it pays: that load is a cost of its own, so a
source that parses less than the header (one that includes only
<ATen/core/Tensor.h>) gets slower. tools/defs.bzl's macros therefore take it
per target (`pch = True`), for the targets whose sources include
utils/layer.h. It cannot come first in a source that `#define`s something
LibTorch's headers read before including them, e.g.
`TORCH_ASSERT_ONLY_METHOD_OPERATORS` (ATen refuses to give such a source every
operator; a header parsed before the define would defeat that check): such a
source includes no utils/layer.h anyway.

  cc_precompiled_header(
      name = "torch_module",
      hdr = "torch_module_pch.h",
      copts = RS_COPTS,
      deps = ["@libtorch//:torch_cpu"],
  )
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "CPP_COMPILE_ACTION_NAME")

def _cc_precompiled_header_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    deps = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    comp = deps.compilation_context

    # The header and its parsed form side by side, under the header's name.
    name = ctx.file.hdr.basename
    header = ctx.actions.declare_file("%s/%s" % (ctx.label.name, name))
    ctx.actions.symlink(output = header, target_file = ctx.file.hdr)
    gch = ctx.actions.declare_file("%s/%s.gch" % (ctx.label.name, name))

    variables = cc_common.create_compile_variables(
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        user_compile_flags = ctx.fragments.cpp.copts + ctx.fragments.cpp.cxxopts + ctx.attr.copts,
        source_file = header.path,
        output_file = gch.path,
        include_directories = comp.includes,
        quote_include_directories = depset([".", ctx.bin_dir.path], transitive = [comp.quote_includes]),
        system_include_directories = comp.system_includes,
        preprocessor_defines = comp.defines,
        use_pic = True,
    )
    compiler = cc_common.get_tool_for_action(
        feature_configuration = features,
        action_name = CPP_COMPILE_ACTION_NAME,
    )
    arguments = cc_common.get_memory_inefficient_command_line(
        feature_configuration = features,
        action_name = CPP_COMPILE_ACTION_NAME,
        variables = variables,
    )
    env = cc_common.get_environment_variables(
        feature_configuration = features,
        action_name = CPP_COMPILE_ACTION_NAME,
        variables = variables,
    )

    # The source's path moves last, after `-x c++-header`: gcc then writes the
    # parsed header where the command line says the object goes.
    arguments = [a for a in arguments if a != header.path] + ["-x", "c++-header", header.path]
    ctx.actions.run(
        executable = compiler,
        arguments = arguments,
        env = env,
        inputs = depset([header], transitive = [comp.headers, cc_toolchain.all_files]),
        outputs = [gch],
        mnemonic = "CppPrecompiledHeader",
        progress_message = "Precompiling %s" % ctx.file.hdr.short_path,
    )

    own = cc_common.create_compilation_context(
        headers = depset([header, gch]),
        quote_includes = depset([header.dirname]),
    )
    return [
        DefaultInfo(files = depset([gch])),
        cc_common.merge_cc_infos(cc_infos = [CcInfo(compilation_context = own), deps]),
    ]

cc_precompiled_header = rule(
    implementation = _cc_precompiled_header_impl,
    doc = "A header parsed once by gcc, for sources compiled with `-include <hdr's name>`.",
    attrs = {
        "hdr": attr.label(allow_single_file = [".h"], mandatory = True, doc = "The header to precompile."),
        "copts": attr.string_list(doc = "The dependents' copts (the options gcc checks must match)."),
        "deps": attr.label_list(providers = [CcInfo], doc = "What the header includes."),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
