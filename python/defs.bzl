"""reloadsafe_python_package: the `reloadsafe` package as an importable folder
and as a wheel, from the Python sources and the compiled extension.

Outputs (beside the BUILD file):
  <name>_site/   reloadsafe/ (sources + _C<EXT_SUFFIX>) and reloadsafe-<v>.dist-info/
                 (metadata and the pytest11 entry point): put it on PYTHONPATH.
  reloadsafe-<v>-<py>-<py>-<platform>.whl: the same, as a wheel for pip.

The version is VERSION below; build_wheel.py fails if pyproject.toml says
otherwise, so the two cannot drift.
"""

load("@local_python//:defs.bzl", "PLATFORM_TAG", "PYTHON_BIN", "PYTHON_TAG")

VERSION = "0.1.0"

def _package_impl(ctx):
    site = ctx.actions.declare_directory(ctx.label.name + "_site")
    wheel = ctx.actions.declare_file("reloadsafe-%s-%s-%s-%s.whl" % (VERSION, PYTHON_TAG, PYTHON_TAG, PLATFORM_TAG))
    args = ctx.actions.args()
    args.add(ctx.file._script)
    args.add("--pyproject", ctx.file.pyproject)
    args.add("--version", VERSION)
    args.add("--extension", ctx.file.extension)
    args.add("--ext-suffix", ctx.attr.ext_suffix)
    args.add("--strip", ctx.label.package + "/")
    args.add("--site", site.path)
    args.add("--wheel", wheel.path)
    args.add("--tag", "%s-%s-%s" % (PYTHON_TAG, PYTHON_TAG, PLATFORM_TAG))
    args.add_all(ctx.files.srcs)
    ctx.actions.run(
        executable = PYTHON_BIN,
        arguments = [args],
        inputs = ctx.files.srcs + [ctx.file.pyproject, ctx.file.extension, ctx.file._script],
        outputs = [site, wheel],
        mnemonic = "PythonPackage",
        progress_message = "Packaging reloadsafe %s (%s)" % (VERSION, wheel.basename),
    )
    return [DefaultInfo(files = depset([site, wheel]))]

reloadsafe_python_package = rule(
    implementation = _package_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = True),
        "extension": attr.label(allow_single_file = True, mandatory = True),
        "ext_suffix": attr.string(mandatory = True),
        "pyproject": attr.label(allow_single_file = True, mandatory = True),
        "_script": attr.label(allow_single_file = True, default = "//python:build_wheel.py"),
    },
)

# --- The drift test between the extension's two builds ---------------------
# python/extension_sources.bzl lists the C++ files reloadsafe._C is made of,
# for setup.py; Bazel compiles them through //python:_C.so and the libraries
# it depends on. The aspect below collects what those targets really compile
# (srcs ending in .cc) and include (every other file of srcs and hdrs), in
# this repository only (LibTorch, Python and JSON headers are external), and
# the test compares that with the lists.

_ExtensionFilesInfo = provider(
    doc = "Source files of this repository that a target and its deps compile or include.",
    fields = {"files": "depset of File"},
)

def _collect_files_impl(target, ctx):
    own = [
        f
        for attr in ["srcs", "hdrs"]
        for f in getattr(ctx.rule.files, attr, [])
        if f.is_source and not f.short_path.startswith("../")
    ]
    deps = [d[_ExtensionFilesInfo].files for d in getattr(ctx.rule.attr, "deps", []) if _ExtensionFilesInfo in d]
    return [_ExtensionFilesInfo(files = depset(own, transitive = deps))]

_collect_files = aspect(
    implementation = _collect_files_impl,
    attr_aspects = ["deps"],
)

def _differences(verb, built, listed, list_names):
    """One line per path in only one of `built` (what Bazel's targets `verb`)
    and `listed`."""
    out = []
    for path in built:
        if path not in listed:
            out.append("%s: the Bazel build %ss it; %s does not list it" % (path, verb, list_names))
    for path in listed:
        if path not in built:
            out.append("%s: listed in %s; the Bazel build does not %s it" % (path, list_names, verb))
    return out

def _extension_sources_test_impl(ctx):
    files = ctx.attr.target[_ExtensionFilesInfo].files.to_list()
    paths = sorted({f.short_path: None for f in files}.keys())
    compiled = [p for p in paths if p.endswith(".cc")]
    included = [p for p in paths if not p.endswith(".cc")]
    listed_compiled = ctx.attr.sources + (ctx.attr.cuda_sources if ctx.attr.cuda_found else [])
    compiled_names = "EXTENSION_SOURCES" + (" or EXTENSION_CUDA_SOURCES" if ctx.attr.cuda_found else "")
    problems = _differences("compile", compiled, listed_compiled, compiled_names)
    problems += _differences("include", included, ctx.attr.headers, "EXTENSION_HEADERS")
    listed = listed_compiled + ctx.attr.headers + ctx.attr.cuda_sources
    for f in ctx.files.present:
        if f.short_path not in listed:
            problems.append("%s is in the extension's folder but in none of the lists" % f.short_path)
    target = str(ctx.attr.target.label)
    if problems:
        body = "\n".join(["%s and python/extension_sources.bzl differ:" % target] + ["  " + p for p in problems] + [
            "Make the lists say what the Bazel targets compile (setup.py builds from the lists).",
        ])
        status = 1
    else:
        body = "%s compiles %d sources and includes %d files of this repository, as python/extension_sources.bzl lists%s." % (
            target,
            len(compiled),
            len(included),
            "" if ctx.attr.cuda_found else " (without CUDA: EXTENSION_CUDA_SOURCES is not compared)",
        )
        status = 0
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.write(
        script,
        "#!/bin/sh\ncat <<'END_OF_REPORT'\n%s\nEND_OF_REPORT\nexit %d\n" % (body, status),
        is_executable = True,
    )
    return [DefaultInfo(executable = script)]

extension_sources_test = rule(
    implementation = _extension_sources_test_impl,
    doc = """Fails when `target` (with its deps) compiles or includes a file of this
repository that the lists do not name, or the lists name one it does not.
`present`: files of the extension's own folder, each of which must be listed.""",
    attrs = {
        "target": attr.label(aspects = [_collect_files], mandatory = True),
        "sources": attr.string_list(),
        "cuda_sources": attr.string_list(),
        "headers": attr.string_list(),
        "cuda_found": attr.bool(),
        "present": attr.label_list(allow_files = True),
    },
    test = True,
)
