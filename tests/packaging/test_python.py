"""clients/python as PyPI would receive it: `python -m build` of a clean export
(the sdist, then the wheel built from that sdist), the wheel installed into a
fresh venv outside the repository (its dependencies from PyPI), and a worker
program there, once with Worker and once with AsyncWorker, against a real
idemproxy and redis-server. A handler that fails once must show up through
`logging` (the "idemproxy_worker" logger) and its entry be retried, not lost."""
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from email.parser import Parser

import pytest

from conftest import ROOM, ROOT, export, run
from pxtest import pending, publish, wait_for

PROGRAM = r'''
import asyncio, logging, sys, threading
import idemproxy_worker
from idemproxy_worker import AsyncWorker, Delivery, Worker

logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                    format="LOG %(levelname)s %(name)s: %(message)s")
mode, endpoint = sys.argv[1], sys.argv[2]
print("imported from", idemproxy_worker.__file__, file=sys.stderr, flush=True)

out = threading.Lock()   # two handler threads: print() writes the line and its newline apart

def work(d: Delivery) -> None:
    with out:
        print(f"{d.key} attempt={d.attempt} n={d.json()['n']}", flush=True)
    if d.key == "fail-once" and d.attempt == 1:
        raise RuntimeError("boom on first try")

if mode == "sync":
    Worker(endpoint, work, concurrency=2).run()
else:
    async def handle(d: Delivery) -> None:
        await asyncio.sleep(0)
        work(d)
    asyncio.run(AsyncWorker(endpoint, handle, concurrency=2).run())
'''

TYPED = r'''
import asyncio
from idemproxy_worker import AsyncWorker, Delivery, Drop, Worker, idemproxy_pb2

def handle(d: Delivery) -> None:
    token: int = d.fencing_token
    fields: dict[str, bytes] = d.fields
    if not token or not fields:
        raise Drop("no fencing")

async def ahandle(d: Delivery) -> None:
    await asyncio.sleep(0)

Worker("ipc:///tmp/x.sock", handle, concurrency=2)
AsyncWorker("ipc:///tmp/x.sock", ahandle, concurrency=2)
ack: bytes = idemproxy_pb2.Ack(status=idemproxy_pb2.Ack.ACK, reason="").SerializeToString()
'''

KEYS = ["k1", "k2", "k3", "fail-once"]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A venv outside the repository with the wheel built from the sdist of a
    clean export installed, and what it was built from."""
    tmp = tmp_path_factory.mktemp("py")
    src = export("clients/python", tmp / "export")
    py = tmp / "venv" / "bin" / "python"
    run([sys.executable, "-m", "venv", str(tmp / "venv")], cwd=tmp)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(pip + ["build"], cwd=tmp)
    run([str(py), "-m", "build", "--outdir", str(tmp / "dist"), str(src)], cwd=tmp)
    sdists, wheels = list((tmp / "dist").glob("*.tar.gz")), list((tmp / "dist").glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list((tmp / "dist").iterdir())
    run(pip + [str(wheels[0])], cwd=tmp)
    return py, sdists[0], wheels[0]


def test_sdist_and_wheel_carry_what_a_user_needs(venv):
    _, sdist, wheel = venv
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"proto/idemproxy/v1/idemproxy.proto", "LICENSE", "src/idemproxy_worker/worker.py",
            "src/idemproxy_worker/idemproxy_pb2.py", "src/idemproxy_worker/postgres.py",
            "src/idemproxy_worker/001_idemproxy_inbox.sql"} <= names, sorted(names)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = Parser().parsestr(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
        # The committed protobuf code, as it is (the build generates nothing).
        for gen in ("idemproxy_pb2.py", "idemproxy_pb2.pyi"):
            assert z.read(f"idemproxy_worker/{gen}") == (ROOT / "clients/python/src/idemproxy_worker" / gen).read_bytes()
        # The inbox/fence tables of docs/database.md, the repository's file as it is.
        assert z.read("idemproxy_worker/001_idemproxy_inbox.sql") == \
            (ROOT / "sql/postgresql/001_idemproxy_inbox.sql").read_bytes()
    assert {"idemproxy_worker/idemproxy_pb2.py", "idemproxy_worker/idemproxy_pb2.pyi",
            "idemproxy_worker/py.typed", "idemproxy_worker/worker.py"} <= names, sorted(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Name"] == "idemproxy-worker" and meta["Version"] == (ROOT / "VERSION").read_text().strip()
    assert "Repository, https://github.com/idemproxy/idemproxy" in meta.get_all("Project-URL")
    required = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert {r.split(";")[0].split(">")[0].split("<")[0].strip() for r in required} == {"pynng", "protobuf"}
    assert "postgres" in meta.get_all("Provides-Extra")
    assert any(r.startswith("psycopg") and "extra == \"postgres\"" in r for r in meta.get_all("Requires-Dist"))


def test_the_postgres_helper_is_optional(venv, tmp_path):
    """Without the postgres extra the package imports and works; its helper says
    what to install."""
    py = venv[0]
    run([str(py), "-c", "import idemproxy_worker, importlib.util as u; assert not u.find_spec('psycopg')"], tmp_path)
    res = subprocess.run([str(py), "-c", "import idemproxy_worker.postgres"],
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "ImportError: idemproxy_worker.postgres needs psycopg 3: " \
        "pip install 'idemproxy-worker[postgres]'" in res.stderr, res.stderr


def test_the_package_is_typed(venv, tmp_path):
    """mypy --strict in the outside project: py.typed and the protobuf module's .pyi
    are there (without them: "missing library stubs or py.typed marker"), and the
    types are real (an int used as a str is refused, not Any)."""
    py = venv[0]
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "mypy"], cwd=tmp_path)
    (tmp_path / "good.py").write_text(TYPED)
    (tmp_path / "bad.py").write_text(TYPED + "d: Delivery\nd.attempt.upper()\n")
    run([str(py), "-m", "mypy", "--strict", "--no-incremental", "good.py"], cwd=tmp_path)
    res = subprocess.run([str(py), "-m", "mypy", "--strict", "--no-incremental", "bad.py"], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and '"int" has no attribute "upper"' in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_installed_worker_against_idemproxy(env, venv, tmp_path, mode):
    py = venv[0]
    app = tmp_path / "app"
    app.mkdir()
    (app / "worker.py").write_text(PROGRAM)
    ep = env.endpoint()
    out, err = app / "out.txt", app / "err.txt"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    w = subprocess.Popen([str(py), "worker.py", mode, ep], cwd=str(app), env=clean,
                         stdout=open(out, "w"), stderr=open(err, "w"), start_new_session=True)
    try:
        env.proxy([ROOM], endpoint=ep)
        publish(env.r, "room", [{"eventId": k, "n": i} for i, k in enumerate(KEYS)])
        want = sorted([f"{k} attempt=1 n={i}" for i, k in enumerate(KEYS)] + ["fail-once attempt=2 n=3"])
        lines = lambda: sorted(l for l in out.read_text().splitlines() if "attempt=" in l)  # noqa: E731
        wait_for(lambda: len(lines()) >= len(want) and pending(env.r, "room", "g") == 0, timeout=60,
                 what=f"deliveries (worker stderr: {err.read_text()[-2000:]})")
        time.sleep(0.3)
        assert lines() == want
        for k in KEYS:
            assert (env.r.get("idem:" + k) or "")[:1] == "D", k
        assert pending(env.r, "room", "g") == 0 and env.r.xlen("dlq") == 0
        log = err.read_text()
        assert f"imported from {py.parent.parent}" in log, log      # the installed wheel, not the checkout
        failed = [l for l in log.splitlines() if l.startswith("LOG WARNING idemproxy_worker:")]
        assert len(failed) == 1 and "key=fail-once" in failed[0] and "boom on first try" in failed[0], log
        assert "Traceback" in log and "RuntimeError: boom on first try" in log, log
    finally:
        w.terminate()
        rc = w.wait(15)
    assert rc == 0, f"the worker did not stop cleanly on SIGTERM ({rc}): {err.read_text()[-2000:]}"
