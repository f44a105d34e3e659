"""MVAPICH2 from the prebuilt archive in third_party/mpi/mvapich2/ (Debian has no package):
unpacked into the external folder, headers and libmpi linked with its lib/ as run path,
and its launcher (Hydra's mpiexec) kept beside. Used by --config=mvapich2."""

def _mvapich2_impl(ctx):
    ctx.extract(ctx.path(Label("//third_party/mpi/mvapich2:mvapich2-2.3.7-mrail.tar.xz")))
    lib = str(ctx.path("mv2/lib"))
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

# MVAPICH2 2.3.7 (ch3:mrail), unpacked here.
cc_library(
    name = "mpi",
    hdrs = glob(["mv2/include/**/*.h"]),
    defines = ["GPUMOVE_HAVE_MPI"],
    includes = ["mv2/include"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lmpi"],
)

# Its launcher and what the launcher runs.
filegroup(
    name = "launcher",
    srcs = glob(["mv2/bin/**", "mv2/lib/**"]),
)
""".format(lib = lib))
    ctx.file("WORKSPACE", "workspace(name = '%s')\n" % ctx.name)

mvapich2 = repository_rule(implementation = _mvapich2_impl)
