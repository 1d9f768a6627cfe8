"""`make demo` from a fresh clone, as a newcomer runs it first (issue 33), on a
machine where 127.0.0.1:9464 is taken (OpenTelemetry's Prometheus exporter's
default, and idemproxy's metrics default): the test holds that port itself while
the demo runs. Only what git tracks is used (`git archive`), built from nothing.
`-o deps` skips `make deps` (it installs Debian packages and a .venv the demo does
not use; tests/deps.sh is what CI runs first anyway)."""
import errno
import io
import re
import socket
import subprocess
import tarfile

from conftest import ROOT, git_tree


def test_fresh_clone_make_demo_with_port_9464_taken(tmp_path):
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", git_tree()],
                         capture_output=True, check=True).stdout
    clone = tmp_path / "idemproxy"
    clone.mkdir()
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(clone, filter="data")
    assert not (clone / "build").exists() and not (clone / "clients" / "c" / "build").exists()
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 9464))
        held.listen(1)
    except OSError as e:                  # someone else holds it: as the test wants it
        assert e.errno == errno.EADDRINUSE, e
    try:
        res = subprocess.run(["make", "-s", "-j2", "-o", "deps", "demo"], cwd=clone, capture_output=True,
                             text=True, timeout=900)
    finally:
        held.close()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert (clone / "build" / "idemproxy").is_file(), "built in the clone"
    assert "cannot listen" not in out and "No such process" not in out, out[-4000:]
    # The summary is true: 12 entries for 6 eventIds, then 2 more copies and evt-7.
    assert "published 12 entries for 6 eventIds" in out, out[-4000:]
    assert "the worker handled 6 events; 6 copies were skipped" in out, out[-4000:]
    assert "== result: 15 entries in the stream, 7 handled once each, 8 copies skipped" in out, out[-4000:]
    done = re.search(r"done keys in Redis: (.*)$", out, re.M).group(1).split()
    assert sorted(done) == [f"done:evt-{i}" for i in range(1, 8)], out[-4000:]
