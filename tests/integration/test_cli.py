"""The command line of SPEC 3."""
import signal
import subprocess
import time

from pxtest import BIN


def run(*args, stdin=None):
    return subprocess.run([str(BIN), *args], input=stdin, capture_output=True, text=True, timeout=10)


def test_version_and_help():
    assert run("--version").returncode == 0
    assert "idemproxy" in run("--version").stdout
    assert run("--help").returncode == 0
    assert run().returncode == 2
    assert run("frobnicate").returncode == 2


def test_check_valid_and_invalid(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("redis:\n  url: redis://127.0.0.1:6379\nstreams:\n  - stream: room\n    key: \"#event.eventId\"\n")
    res = run("check", "-c", str(good))
    assert res.returncode == 0, res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("redis:\n  url: redis://127.0.0.1:6379\n  bogus: 1\nstreams:\n  - stream: room\n    key: \"#event.(\"\n")
    res = run("check", "-c", str(bad))
    assert res.returncode == 2
    assert f"{bad}:3:3:" in res.stderr
    assert f"{bad}:6:18:" in res.stderr      # the column of the "(" inside the template
    # running with a bad config exits 2 before connecting to anything
    assert run("-c", str(bad)).returncode == 2


def test_key_command():
    res = run("key", "room:#{event.joinCode}:#{#event.eventId}", stdin='{"joinCode": "A1B2", "eventId": "e-1"}')
    assert res.returncode == 0, res.stderr
    assert res.stdout == "room:A1B2:e-1\n"
    res = run("key", "#event.eventId", stdin='{"other": 1}')
    assert res.returncode == 2 and res.stdout == ""
    res = run("key", "#event.eventId ?: 'none'", stdin='{"other": 1}')
    assert res.stdout == "none\n"
    res = run("key", "#event.(", stdin="{}")
    assert res.returncode == 2
    assert "^" in res.stderr
    res = run("key", "#event.a", stdin="not json")
    assert res.returncode == 2


def test_run_without_redis_keeps_retrying_and_stops_cleanly(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"redis:\n  url: redis://127.0.0.1:1\napp:\n  endpoint: ipc://{tmp_path}/s.sock\nmetrics:\n  listen: \"\"\nstreams:\n  - stream: room\n")
    p = subprocess.Popen([str(BIN), "-c", str(cfg)], stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    assert p.wait(5) == 0
    assert "connect failed" in p.stderr.read()


def test_socket_mode(tmp_path):
    import os
    import stat
    cfg = tmp_path / "c.yaml"
    sock = tmp_path / "s.sock"
    cfg.write_text(f"redis:\n  url: redis://127.0.0.1:1\napp:\n  endpoint: ipc://{sock}\n  socket_mode: \"0600\"\nmetrics:\n  listen: \"\"\nstreams:\n  - stream: room\n")
    p = subprocess.Popen([str(BIN), "-c", str(cfg)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 5
        while not sock.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    finally:
        p.terminate()
        p.wait(5)
