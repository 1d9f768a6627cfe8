"""Generates idemproxy_worker/idemproxy_pb2.py (and .pyi) from the schema the
package carries, proto/idemproxy/v1/idemproxy.proto (a byte-identical copy of
the repository's proto/), whenever a wheel is built: the generated module is
never committed (protoc marks it "NO CHECKED-IN PROTOBUF GENCODE"). protoc is
grpcio-tools, pinned in pyproject.toml's [build-system] so that the generated
code matches the protobuf runtime the package depends on. Everything else is
in pyproject.toml."""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE / "proto"
PROTO = PROTO_DIR / "idemproxy" / "v1" / "idemproxy.proto"


def generate(out_pkg: Path) -> None:
    """protoc writes <tmp>/idemproxy/v1/idemproxy_pb2.py; it is moved into the
    package so that its descriptor keeps the proto's canonical path."""
    import tempfile

    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"--proto_path={PROTO_DIR}", f"--python_out={tmp}", f"--pyi_out={tmp}", str(PROTO)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {PROTO}")
        out_pkg.mkdir(parents=True, exist_ok=True)
        for name in ("idemproxy_pb2.py", "idemproxy_pb2.pyi"):
            (out_pkg / name).write_bytes((Path(tmp) / "idemproxy" / "v1" / name).read_bytes())


class BuildPyWithProto(build_py):
    def run(self) -> None:
        super().run()
        # An editable install imports from src/, so the module goes there (gitignored).
        target = HERE / "src" if self.editable_mode else Path(self.build_lib)
        generate(target / "idemproxy_worker")


setup(cmdclass={"build_py": BuildPyWithProto})
