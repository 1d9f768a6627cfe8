"""Fixtures for the clean-export package tests (tests/packaging/test_<lang>.py).

Each test takes only what git tracks of clients/<lang> (`git archive`, so an
ignored or untracked file cannot make it pass), builds the package the way its
registry would receive it, installs it into an empty project outside the
repository, and runs a worker from that project against a real idemproxy and
a real redis-server (the integration suite's fixtures: env, publish, wait_for).
"""
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from pxtest import env, redis_server  # noqa: E402,F401 (fixtures)


def git_tree():
    """The commit to export: HEAD plus the working tree's changes to tracked
    files (`git stash create`), so a test sees an uncommitted edit of a tracked
    file but never an untracked or ignored one."""
    stash = subprocess.run(["git", "-C", str(ROOT), "stash", "create"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return stash or "HEAD"


def export(path, dest):
    """Extracts `git archive` of the repository folder 'path' (say
    "clients/python") into 'dest' and returns dest / path's last part."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", git_tree(), path],
                         capture_output=True, check=True).stdout
    assert tar, f"git archive of {path} is empty"
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    out = dest / Path(path).name
    (dest / path).rename(out)
    return out


def run(cmd, cwd, timeout=900, env=None, **kw):
    """Runs cmd, failing the test with its output when it fails."""
    res = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=timeout,
                         env=env, **kw)
    assert res.returncode == 0, (f"{' '.join(map(str, cmd))} failed ({res.returncode}) in {cwd}:\n"
                                 f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return res


@pytest.fixture
def exported(tmp_path):
    """exported("clients/python") -> a fresh folder holding only what git tracks."""
    return lambda path: export(path, tmp_path / "export")


# The stream every outside worker reads: a dead-letter stream to show nothing
# went there, a short backoff so the retried key comes back at once.
ROOM = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
        "key": "#event.eventId", "dead_letter": "dlq", "retry_backoff_ms": 50}


def run_worker(env, tmp_path, cmd, cwd, keys, want, exits_zero=True):
    """Starts the outside worker `cmd ENDPOINT` (it prints '<key> attempt=<n>'
    per delivery), then idemproxy reading ROOM, publishes one event per key,
    waits for `want` (sorted lines) and nothing pending, ends the worker with
    SIGTERM (it must still be running, and with exits_zero exit 0), and asserts
    every key done and no dead letter. Returns the worker's stderr."""
    import time
    from pxtest import pending, publish, wait_for
    ep = env.endpoint()
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        w = subprocess.Popen([*map(str, cmd), ep], cwd=str(cwd), stdout=fo, stderr=fe)
    try:
        env.proxy([ROOM], endpoint=ep)
        publish(env.r, "room", [{"eventId": k} for k in keys])
        lines = lambda: out.read_text().splitlines()  # noqa: E731
        wait_for(lambda: len(lines()) >= len(want), timeout=30,
                 what=f"worker lines (stderr: {err.read_text()[-1000:]})")
        wait_for(lambda: pending(env.r, "room", "g") == 0, timeout=30, what="nothing pending")
        time.sleep(0.3)
        assert w.poll() is None, err.read_text()
    finally:
        w.terminate()
        w.wait(15)
    assert w.returncode == 0 or not exits_zero, err.read_text()
    assert sorted(lines()) == want            # each key once, the failed one again
    for k in keys:
        assert (env.r.get("idem:" + k) or "")[:1] == "D", k
    assert env.r.xlen("dlq") == 0
    return err.read_text()
