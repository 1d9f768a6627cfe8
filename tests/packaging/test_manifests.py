"""What every client package carries and says, checked without building it (a few
seconds): the license text, one name and one version (VERSION at the top, written
into each manifest by `make version-copies`), Python's committed protobuf code
against the schema, and a README that covers what a user needs. The tests that
build each package (test_<lang>.py) check the same things in the built artifact."""
import ast
import json
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT, export, run

CLIENTS = ["c", "go", "java", "node", "python", "rust"]
# The registry name of the package of every client with a registry (Go's is its module
# path, C's is its library's: libidemproxy_client, idemproxy-client.pc).
NAME = "idemproxy-worker"
VERSION = (ROOT / "VERSION").read_text().strip()
PY_PKG = ROOT / "clients" / "python" / "src" / "idemproxy_worker"
PROTO_DIR = ROOT / "clients" / "python" / "proto"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Only what git tracks of clients/ (an untracked LICENSE does not count)."""
    return export("clients", tmp_path_factory.mktemp("manifests") / "export")


def test_version_is_one_line_of_semver():
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?", VERSION), VERSION


@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_carries_the_license(clean, client):
    lic = clean / client / "LICENSE"
    assert lic.is_file(), f"clients/{client}/LICENSE is not tracked (make license-copies)"
    assert lic.read_bytes() == (ROOT / "LICENSE").read_bytes(), \
        f"clients/{client}/LICENSE differs from LICENSE (make license-copies)"


def test_the_crate_lists_the_license(clean):
    files = run(["cargo", "package", "--list"], clean / "rust").stdout.split()
    assert "LICENSE" in files, files


def test_one_name_across_registries(clean):
    assert json.loads((clean / "node" / "package.json").read_text())["name"] == NAME
    assert json.loads((clean / "node" / "package-lock.json").read_text())["name"] == NAME
    assert tomllib.loads((clean / "python" / "pyproject.toml").read_text())["project"]["name"] == NAME
    assert tomllib.loads((clean / "rust" / "Cargo.toml").read_text())["package"]["name"] == NAME
    pom = (clean / "java" / "pom.xml").read_text()
    assert f"<groupId>dev.idemproxy</groupId>\n  <artifactId>{NAME}</artifactId>" in pom


def manifest_versions(c):
    """Every place a version of the project is written, and what it says there."""
    pom = (c / "java" / "pom.xml").read_text()
    lock = json.loads((c / "node" / "package-lock.json").read_text())
    # (the repository's: `cargo package --list` above rewrites the export's)
    cargo_lock = tomllib.loads((ROOT / "clients" / "rust" / "Cargo.lock").read_text())
    mk = lambda p: re.search(r"^VERSION *= *(\S+)$", p.read_text(), re.M).group(1)  # noqa: E731
    found = {
        "proxy/px.h": re.search(r'^#define PX_VERSION "([^"]*)"', (ROOT / "proxy" / "px.h").read_text(),
                                re.M).group(1),
        "clients/c/Makefile": mk(c / "c" / "Makefile"),
        "clients/java/Makefile": mk(c / "java" / "Makefile"),
        "clients/java/pom.xml": re.search(rf"<artifactId>{NAME}</artifactId>\s*<version>([^<]*)</version>",
                                          pom).group(1),
        "clients/node/package.json": json.loads((c / "node" / "package.json").read_text())["version"],
        "clients/node/package-lock.json": lock["version"],
        "clients/node/package-lock.json packages['']": lock["packages"][""]["version"],
        "clients/python/pyproject.toml":
            tomllib.loads((c / "python" / "pyproject.toml").read_text())["project"]["version"],
        "clients/rust/Cargo.toml": tomllib.loads((c / "rust" / "Cargo.toml").read_text())["package"]["version"],
        "clients/rust/Cargo.lock": next(p["version"] for p in cargo_lock["package"] if p["name"] == NAME),
    }
    # What the READMEs tell a user to type or expect: the artifact's file names and coordinates.
    for client in CLIENTS:
        text = (c / client / "README.md").read_text()
        for m in re.finditer(r"(?:idemproxy[-_]worker[-:]|libidemproxy_client\.so\.)(\d+\.\d+\.\d+)", text):
            found[f"clients/{client}/README.md: {m.group(0)}"] = m.group(1)
        for m in re.finditer(rf"<artifactId>{NAME}</artifactId>\s*<version>([^<]*)</version>", text):
            found[f"clients/{client}/README.md: <version>"] = m.group(1)
    return found


def test_one_version_set_in_VERSION(clean):
    found = manifest_versions(clean)
    assert len(found) > 12, found
    stale = {where: v for where, v in found.items() if v != VERSION}
    assert not stale, f"VERSION says {VERSION}; these say otherwise (make version-copies): {stale}"


def test_python_builds_without_a_protobuf_compiler():
    """The sdist and wheel come from the committed protobuf code: the build pulls no
    grpcio-tools (two minutes of downloads) and runs no code generator."""
    py = ROOT / "clients" / "python"
    requires = tomllib.loads((py / "pyproject.toml").read_text())["build-system"]["requires"]
    assert not [r for r in requires if re.match(r"grpcio|protobuf|protoc", r)], requires
    assert not (py / "setup.py").exists(), "setup.py generated the protobuf code at build time"
    tracked = run(["git", "ls-files", "src/idemproxy_worker"], py).stdout.split()
    assert {"src/idemproxy_worker/idemproxy_pb2.py", "src/idemproxy_worker/idemproxy_pb2.pyi"} <= set(tracked)


def embedded_descriptor(source):
    """The serialized FileDescriptorProto a protoc-generated _pb2.py registers."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return node.args[0].value
    raise AssertionError("no AddSerializedFile(...) in the module")


def schema_descriptor(tmp_path):
    """protoc's FileDescriptorProto of the package's proto (grpcio-tools, from
    tests/requirements.txt: a version other than the one the committed code was
    generated with still describes the same schema)."""
    from google.protobuf import descriptor_pb2
    out = tmp_path / "set.pb"
    run([sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={PROTO_DIR}", f"--descriptor_set_out={out}",
         "idemproxy/v1/idemproxy.proto"], tmp_path)
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert len(fds.file) == 1

    def strip(msgs):   # the Python generator leaves out json_name (it derives it)
        for m in msgs:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)
    strip(fds.file[0].message_type)
    return fds.file[0]


def test_python_generated_code_is_the_schema(tmp_path):
    from google.protobuf import descriptor_pb2
    want = schema_descriptor(tmp_path)
    got = descriptor_pb2.FileDescriptorProto.FromString(
        embedded_descriptor((PY_PKG / "idemproxy_pb2.py").read_text()))
    assert got == want, ("clients/python/src/idemproxy_worker/idemproxy_pb2.py is not what "
                         "proto/idemproxy/v1/idemproxy.proto describes: run make -C clients/python proto")

    # The stubs name the same messages and fields (mypy --strict reads them).
    def fields(msgs, prefix=""):
        for m in msgs:
            yield prefix + m.name, None
            for f in m.field:
                yield prefix + m.name, f.name.upper() + "_FIELD_NUMBER"
            yield from fields(m.nested_type, prefix + m.name + ".")

    def stub_fields(body, prefix=""):
        for node in body:
            if isinstance(node, ast.ClassDef) and node.bases and \
                    any(getattr(b, "attr", getattr(b, "id", "")) == "Message" for b in node.bases):
                yield prefix + node.name, None
                for a in node.body:
                    if isinstance(a, ast.AnnAssign) and a.target.id.endswith("_FIELD_NUMBER"):
                        yield prefix + node.name, a.target.id
                yield from stub_fields(node.body, prefix + node.name + ".")

    stubs = set(stub_fields(ast.parse((PY_PKG / "idemproxy_pb2.pyi").read_text()).body))
    assert stubs == set(fields(want.message_type)), \
        "clients/python/src/idemproxy_worker/idemproxy_pb2.pyi is stale: run make -C clients/python proto"


# Each client's README, in its own words, covers these (a heading each).
README_SECTIONS = {
    "install": r"install",
    "a worker": r"worker",
    "configuration": r"configur",
    "errors": r"error",
}


@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_has_a_readme_for_its_users(clean, client):
    text = (clean / client / "README.md").read_text()
    headings = [h.lower() for h in re.findall(r"^#{1,3} (.+)$", text, re.M)]
    missing = [what for what, word in README_SECTIONS.items() if not any(re.search(word, h) for h in headings)]
    assert not missing, f"clients/{client}/README.md has no section on {missing}: {headings}"
