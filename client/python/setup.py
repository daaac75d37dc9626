"""Builds the `pipetrain` Python package: the client of a pipetrain coordinator.

The gRPC stubs are generated at build time from the repository's proto/ directory with Debian's
`protoc` (protobuf-compiler, 3.21) and `grpc_python_plugin` (protobuf-compiler-grpc); the bundled
data sets are copied from data/. Neither is checked in under client/python. Debian's
python3-grpc-tools is not used: it bundles protoc 3.5, which rejects proto3 `optional` fields.

Install offline (docs/python.md):
    /usr/bin/python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation --no-index ./client/python
"""

import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# Overridable for a copy of this directory outside the repository.
PROTO_DIR = os.environ.get("PIPETRAIN_PROTO_DIR", os.path.join(REPO, "proto"))
DATA_DIR = os.environ.get("PIPETRAIN_DATA_DIR", os.path.join(REPO, "data"))
DATA_FILES = ("digits.csv.gz", "gpl-3.txt", "README.md")


def generate_stubs(out_dir):
    """Writes pipetrain/v1/*_pb2.py and *_pb2_grpc.py for every proto under PROTO_DIR/pipetrain/v1
    into out_dir (a package root). Raises RuntimeError naming what is missing or what failed."""
    protos = sorted(glob.glob(os.path.join(PROTO_DIR, "pipetrain", "v1", "*.proto")))
    if not protos:
        raise RuntimeError(
            "no .proto files under %s/pipetrain/v1: build from the pipetrain repository, or set "
            "PIPETRAIN_PROTO_DIR" % PROTO_DIR)
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        raise RuntimeError(
            "protoc and grpc_python_plugin are needed to generate the stubs: "
            "apt-get install protobuf-compiler protobuf-compiler-grpc")
    subprocess.run(
        [protoc, "-I" + PROTO_DIR, "--python_out=" + out_dir, "--grpc_python_out=" + out_dir,
         "--plugin=protoc-gen-grpc_python=" + plugin] + protos,
        check=True)
    init = os.path.join(out_dir, "pipetrain", "v1", "__init__.py")
    with open(init, "w", encoding="utf-8") as f:
        f.write('"""Generated from proto/pipetrain/v1 at build time; do not edit."""\n')


def copy_data(out_dir):
    """Copies the bundled data sets into out_dir/pipetrain/bundled/."""
    target = os.path.join(out_dir, "pipetrain", "bundled")
    os.makedirs(target, exist_ok=True)
    for name in DATA_FILES:
        source = os.path.join(DATA_DIR, name)
        if not os.path.isfile(source):
            raise RuntimeError("bundled data file %s is missing; set PIPETRAIN_DATA_DIR" % source)
        shutil.copyfile(source, os.path.join(target, name))


class BuildWithStubs(build_py):
    """build_py that also generates the gRPC stubs and copies the bundled data."""

    def run(self):
        super().run()
        if not self.dry_run:
            generate_stubs(self.build_lib)
            copy_data(self.build_lib)


setup(
    name="pipetrain",
    version="0.1.0",
    description="Python client of the pipetrain pipeline-parallel training service",
    packages=["pipetrain"],
    python_requires=">=3.9",
    # Debian: python3-grpcio, python3-protobuf, python3-numpy. tqdm (progress bar) and torch
    # (tensors as input) are used when present.
    install_requires=["grpcio", "protobuf", "numpy"],
    cmdclass={"build_py": BuildWithStubs},
)
