"""C++ code generation for .proto files with Debian's protoc and grpc_cpp_plugin."""

def cc_grpc_library(name, srcs, imports = [], deps = [], **kwargs):
    """Generates messages and gRPC stubs for `srcs` and wraps them in one cc_library.

    Every .proto in srcs is compiled relative to the repository root, so imports read
    "proto/gpumove/v1/x.proto" style paths from the package directory down. `imports` are
    the .proto files they import that another cc_grpc_library (in `deps`) generates.
    """
    outs = []
    for src in srcs:
        stem = src[:-len(".proto")]
        outs += [stem + ".pb.h", stem + ".pb.cc", stem + ".grpc.pb.h", stem + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = srcs + imports,
        outs = outs,
        cmd = ("protoc -I. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) " +
               " ".join(["$(location %s)" % s for s in srcs])),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc", "@system//:protobuf"],
        **kwargs
    )
