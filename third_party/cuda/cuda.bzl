"""Repository rule that finds the CUDA Toolkit and exposes it as @local_cuda.

Search order: CUDA_HOME, CUDA_PATH, the folder above `nvcc` on PATH, then
/usr/local/cuda. Without a toolkit the repository is a dummy: CUDA_FOUND is
False in @local_cuda//:defs.bzl and the targets are empty, so a CPU-only
machine still builds everything that does not need CUDA headers.
"""

def _find_cuda(rctx):
    env = rctx.os.environ
    candidates = [env.get("CUDA_HOME", ""), env.get("CUDA_PATH", "")]
    nvcc = rctx.which("nvcc")
    if nvcc:
        candidates.append(str(nvcc.dirname.dirname))
    candidates.append("/usr/local/cuda")
    for c in candidates:
        if c and rctx.path(c + "/include/cuda_runtime_api.h").exists:
            return c
    return None

def _cuda_impl(rctx):
    root = _find_cuda(rctx)
    if root == None:
        rctx.file("defs.bzl", "CUDA_FOUND = False\nCUDA_VERSION = ''\n")
        rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
# No CUDA Toolkit was found: these targets are empty.
cc_library(name = "cuda_headers")
cc_library(name = "cudart")
""")
        return
    rctx.symlink(root + "/include", "include")
    rctx.symlink(root + "/lib64", "lib64")
    version = ""
    vj = rctx.path(root + "/version.json")
    if vj.exists:
        for line in rctx.read(vj).splitlines():
            if '"version"' in line:
                version = line.split(":")[1].strip().strip('",')
                break
    rctx.file("defs.bzl", "CUDA_FOUND = True\nCUDA_VERSION = %r\n" % version)
    lib64 = str(rctx.path(root + "/lib64").realpath)
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/crt/**", "include/cuda/**", "include/cub/**",
                 "include/thrust/**", "include/nv/**", "include/*.hpp"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    srcs = ["lib64/libcudart.so"],
    linkopts = ["-Wl,-rpath,%s"],
    deps = [":cuda_headers"],
)
""" % lib64)

cuda_repository = repository_rule(
    implementation = _cuda_impl,
    environ = ["CUDA_HOME", "CUDA_PATH", "PATH"],
    local = True,
)
