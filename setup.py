"""The one build step that pyproject.toml cannot declare: the KEDA external scaler's gRPC modules
are generated from ``router/cluster/keda_proto/externalscaler.proto`` with grpcio-tools (a build
requirement, pinned so that the generated code matches the runtime's ``grpcio``/``protobuf``
floors) whenever warmgate is built or installed, editable installs (``make install``) included.
The generated files are git-ignored."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = "router/cluster/keda_proto/externalscaler.proto"


def generate_grpc_modules() -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml [build-system])

    args = [
        "grpc_tools.protoc",
        f"--proto_path={ROOT}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc failed on {PROTO}")


class BuildPyWithGrpc(build_py):
    def run(self) -> None:
        generate_grpc_modules()
        super().run()


setup(cmdclass={"build_py": BuildPyWithGrpc})
