"""Finds the CUDA toolkit at fetch time; without one, provides an empty stub.

With the toolkit, @local_cuda//:cudart carries the runtime headers, the static runtime
and GPUMOVE_HAVE_CUDA=1, and @local_cuda//:defs.bzl says HAVE_CUDA = True and where nvcc
is (kernels are compiled with it by a genrule). Without it the same target is empty and
HAVE_CUDA is False, so the daemon builds and runs with host pools only.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    have = ctx.path(root + "/include/cuda_runtime.h").exists and \
           ctx.path(root + "/lib64/libcudart_static.a").exists
    nvcc = root + "/bin/nvcc"
    have_nvcc = have and ctx.path(nvcc).exists
    ctx.file("defs.bzl", "HAVE_CUDA = %s\nNVCC = %r\n" % (have_nvcc, nvcc if have_nvcc else ""))
    if have:
        ctx.symlink(root + "/include", "include")
        ctx.symlink(root + "/lib64/libcudart_static.a", "lib/libcudart_static.a")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cudart",
    srcs = ["lib/libcudart_static.a"],
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    defines = ["GPUMOVE_HAVE_CUDA=1"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
)
""")
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cudart")
""")
    ctx.file("WORKSPACE", "workspace(name = '%s')\n" % ctx.name)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
