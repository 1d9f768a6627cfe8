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


def test_demo_db_pays_each_win_once_after_redis_forgets():
    """`make demo-db` (demo/db.sh): Redis restarted from a snapshot taken
    before the work delivers every win again, and the Python worker's inbox
    keeps PostgreSQL at one payout per win (issue 35)."""
    assert BIN.exists(), "make all first"
    subprocess.run(["make", "-s", "-C", str(ROOT / "clients" / "python")], check=True, timeout=600)
    res = subprocess.run([str(ROOT / "demo" / "db.sh")], capture_output=True, text=True,
                         timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "payouts rows: 5; done marks in Redis: 5" in out, out
    assert "== result: idemproxy delivered 10 times (Redis forgot 5 done marks)," in out, out
    for i in range(1, 6):
        assert f"win-{i} paid 1 time(s), {i * 10}" in out, out
    assert out.count("worker: paid win-") == 5, out
