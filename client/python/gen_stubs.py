"""Generates gpumove/v1/gpumove_pb2{,_grpc}.py(i) from the repository's proto/ with protoc
and grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc). setup.py runs
it when the package is built; tests run it into a folder of their own:

    python3 gen_stubs.py OUT_DIR    # writes OUT_DIR/gpumove/v1/...

GPUMOVE_PROTO_DIR names another proto root, PROTOC and GRPC_PYTHON_PLUGIN other tools."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def generate(out_dir: str) -> None:
    proto_root = os.environ.get("GPUMOVE_PROTO_DIR", os.path.join(HERE, "..", "..", "proto"))
    protoc = os.environ.get("PROTOC", shutil.which("protoc") or "protoc")
    plugin = os.environ.get("GRPC_PYTHON_PLUGIN", shutil.which("grpc_python_plugin") or "")
    if not plugin:
        raise RuntimeError("grpc_python_plugin not found (Debian: protobuf-compiler-grpc)")
    os.makedirs(os.path.join(out_dir, "gpumove", "v1"), exist_ok=True)
    subprocess.check_call([
        protoc, f"-I{proto_root}", "-I/usr/include", f"--python_out={out_dir}",
        f"--pyi_out={out_dir}", f"--grpc_out={out_dir}", f"--plugin=protoc-gen-grpc={plugin}",
        os.path.join(proto_root, "gpumove", "v1", "gpumove.proto"),
    ])
    init = os.path.join(out_dir, "gpumove", "v1", "__init__.py")
    if not os.path.exists(init):
        with open(init, "w") as f:
            f.write('"""Generated from proto/gpumove/v1/gpumove.proto at build time."""\n')


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else HERE)
