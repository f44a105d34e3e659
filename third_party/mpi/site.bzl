"""A site's MPI (and UCX) from install prefixes, the way a cluster builds against HPC-X,
MVAPICH2-GDR or its own CUDA-aware Open MPI:

  bazel build --config=site_mpi --repo_env=GPUMOVE_MPI_PREFIX=/opt/hpcx/ompi \\
      --repo_env=GPUMOVE_UCX_PREFIX=/opt/hpcx/ucx //daemon:gpumoved

The default build links @site_mpi//:mpi too (--config=site_mpi adds the UCX of the prefix).

@site_mpi//:mpi takes the headers from $GPUMOVE_MPI_PREFIX/include and links
$GPUMOVE_MPI_PREFIX/lib's libmpi (Open MPI, MVAPICH2, HPC-X) or libmpich (MPICH, Cray),
with that directory as the binary's run path. @site_mpi//:ucx does the same for UCX from
$GPUMOVE_UCX_PREFIX (unset: the system's UCX). Unset, GPUMOVE_MPI_PREFIX is Debian's Open
MPI prefix: every default build, CI's included, goes through this rule.
"""

_DEFAULT_MPI = "/usr/lib/x86_64-linux-gnu/openmpi"

def _lib_dir(ctx, prefix, names):
    for d in ["lib", "lib64"]:
        for n in names:
            if ctx.path("%s/%s/lib%s.so" % (prefix, d, n)).exists:
                return d, n
    return None, None

def _site_mpi_impl(ctx):
    mpi = ctx.os.environ.get("GPUMOVE_MPI_PREFIX", "") or _DEFAULT_MPI
    ucx = ctx.os.environ.get("GPUMOVE_UCX_PREFIX", "")
    if not ctx.path(mpi + "/include/mpi.h").exists:
        fail("GPUMOVE_MPI_PREFIX=%s: no include/mpi.h there" % mpi)
    # MPICH and its derivatives say so in mpi.h (their prefixes may hold a libmpi too).
    mpich = "MPICH_VERSION" in ctx.read(mpi + "/include/mpi.h")
    lib, name = _lib_dir(ctx, mpi, ["mpich", "mpi"] if mpich else ["mpi"])
    if lib == None:
        fail("GPUMOVE_MPI_PREFIX=%s: no lib/libmpi.so or lib/libmpich.so there" % mpi)
    ctx.symlink(mpi + "/include", "mpi_include")
    build = """package(default_visibility = ["//visibility:public"])

# MPI from {mpi}.
cc_library(
    name = "mpi",
    hdrs = glob(["mpi_include/**/*.h"]),
    defines = ["GPUMOVE_HAVE_MPI"],
    includes = ["mpi_include"],
    linkopts = ["-L{mpi}/{lib}", "-Wl,-rpath,{mpi}/{lib}", "-l{name}"],
)
""".format(mpi = mpi, lib = lib, name = name)
    if ucx:
        if not ctx.path(ucx + "/include/ucp/api/ucp.h").exists:
            fail("GPUMOVE_UCX_PREFIX=%s: no include/ucp/api/ucp.h there" % ucx)
        ulib, _ = _lib_dir(ctx, ucx, ["ucp"])
        if ulib == None:
            fail("GPUMOVE_UCX_PREFIX=%s: no lib/libucp.so there" % ucx)
        ctx.symlink(ucx + "/include", "ucx_include")
        build += """
# UCX from {ucx}.
cc_library(
    name = "ucx",
    hdrs = glob(["ucx_include/**/*.h"]),
    includes = ["ucx_include"],
    linkopts = ["-L{ucx}/{lib}", "-Wl,-rpath,{ucx}/{lib}", "-lucp", "-luct", "-lucs"],
)
""".format(ucx = ucx, lib = ulib)
    else:
        build += """
# The system's UCX (GPUMOVE_UCX_PREFIX unset).
alias(
    name = "ucx",
    actual = "@system//:ucx",
)
"""
    ctx.file("BUILD", build)
    ctx.file("WORKSPACE", "workspace(name = '%s')\n" % ctx.name)

site_mpi = repository_rule(
    implementation = _site_mpi_impl,
    environ = ["GPUMOVE_MPI_PREFIX", "GPUMOVE_UCX_PREFIX"],
    local = True,
)
