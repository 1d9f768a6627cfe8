"""`make demo` (demo/run.sh) as a newcomer runs it: on a machine where the
metrics default 127.0.0.1:9464 is taken (OpenTelemetry's Prometheus exporter
listens there), it still runs to its summary (issue 33)."""
import errno
import socket
import subprocess

from pxtest import BIN, C_WORKER, ROOT


def test_demo_runs_with_port_9464_taken():
    assert BIN.exists() and C_WORKER.exists(), "make all first"
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 9464))
        held.listen(1)
    except OSError as e:                 # taken already: as the test wants it
        assert e.errno == errno.EADDRINUSE, e
    try:
        res = subprocess.run([str(ROOT / "demo" / "run.sh")], capture_output=True, text=True,
                             timeout=180, cwd=ROOT)
    finally:
        held.close()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "cannot listen" not in out, out
    assert "the worker handled 6 events; 6 copies were skipped" in out, out
    assert "== result: 15 entries in the stream, 7 handled once each, 8 copies skipped" in out, out
