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
