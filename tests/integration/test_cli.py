"""The command line (docs/operations.md, "Command line")."""
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


# Issue 31: the three typos of a key that reads nothing, as a new user writes
# them, with the column of the template and the #{...} form meant.
KEY_TYPOS = [
    # template, column in the template, the suggestion
    ("room:#event.eventId", 6, 'did you mean "room:#{event.eventId}"?'),
    ("eventId", 1, 'did you mean "#{event.eventId}"?'),
    ("event.eventId", 1, 'did you mean "#{event.eventId}"?'),
]


def _key_config(tmp_path, key, extra=""):
    cfg = tmp_path / "c.yaml"
    # the key's value starts at column 10 of line 5, its text at 11 (quoted)
    cfg.write_text("redis:\n  url: redis://127.0.0.1:1\nstreams:\n  - stream: room\n"
                   f"    key: \"{key}\"\n{extra}")
    return cfg


def test_check_refuses_keys_that_read_nothing(tmp_path):
    for key, col, hint in KEY_TYPOS:
        cfg = _key_config(tmp_path, key)
        res = run("check", "-c", str(cfg))
        assert res.returncode == 2, (key, res.stderr)
        assert f"{cfg}:5:{10 + col}: streams[0].key: " in res.stderr, (key, res.stderr)
        assert hint in res.stderr, (key, res.stderr)
    cfg = _key_config(tmp_path, "#{'all'}")
    res = run("check", "-c", str(cfg))
    assert res.returncode == 2 and "reads nothing from the entry" in res.stderr


def test_daemon_refuses_keys_that_read_nothing_at_start(tmp_path):
    # Redis at port 1 is never reached: the config is refused first
    for key, col, hint in KEY_TYPOS:
        cfg = _key_config(tmp_path, key, "app:\n  endpoint: ipc://%s/s.sock\nmetrics:\n  listen: \"\"\n" % tmp_path)
        res = subprocess.run([str(BIN), "-c", str(cfg)], capture_output=True, text=True, timeout=10)
        assert res.returncode == 2, (key, res.stderr)
        assert f"{cfg}:5:{10 + col}: streams[0].key: " in res.stderr and hint in res.stderr, res.stderr
        assert "connect" not in res.stderr


def test_key_command_refuses_keys_that_read_nothing():
    for key, col, hint in KEY_TYPOS:
        res = run("key", key, stdin='{"eventId": "e-1"}')
        assert res.returncode == 2 and res.stdout == "", (key, res.stdout)
        assert f"template:{col}: " in res.stderr and hint in res.stderr, (key, res.stderr)
        assert "\n  " + " " * (col - 1) + "^" in res.stderr, res.stderr
    res = run("key", "#stream", "--stream", "room", stdin="{}")
    assert res.returncode == 2 and "reads nothing from the entry" in res.stderr


def test_check_notes_a_constant_lock_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("streams:\n  - stream: room\n    lock_key: running\n")
    res = run("check", "-c", str(cfg))
    assert res.returncode == 0, res.stderr
    assert f"{cfg}:3:15: note: streams[0].lock_key: reads nothing from the entry" in res.stderr
    assert "ok, 1 stream" in res.stderr


def test_check_timings_and_names(tmp_path):
    cfg = tmp_path / "c.yaml"
    cases = [
        # issue 30: claim_idle_ms >= 3 x timeout_ms, done_ttl_ms >= lease_ms (docs/configuration.md)
        ("streams:\n  - stream: room\n    group: g\n    claim_idle_ms: 300\n", "4:20",
         "claim_idle_ms: 300 is less than three times redis.timeout_ms (1000)"),
        ("streams:\n  - stream: room\n    lease_ms: 8000\n    done_ttl_ms: 5000\n", "4:18",
         "done_ttl_ms: 5000 is less than lease_ms (8000)"),
        # issue 37: dedup names that can be idemproxy's own keys, or each other
        ("streams:\n  - stream: room\n    prefix: \"\"\n", "3:13", "can equal idemproxy's own keys"),
        ("streams:\n  - stream: room\n    layout: split\n    lock_prefix: d\n", "4:18",
         "its own done marks (done_prefix + key) start with 'done:', so one name can be both"),
    ]
    for text, at, msg in cases:
        cfg.write_text(text)
        res = run("check", "-c", str(cfg))
        assert res.returncode == 2 and f"{cfg}:{at}: " in res.stderr and msg in res.stderr, (text, res.stderr)
    cfg.write_text("streams:\n  - stream: orders\n  - stream: payments\n")
    res = run("check", "-c", str(cfg))
    assert res.returncode == 0, res.stderr
    assert (f"{cfg}:3:5: warning: streams[1] (payments) shares dedup names with streams[0] "
            "(orders)") in res.stderr


def test_check_refuses_an_ipc_path_nanomsg_cannot_bind(tmp_path):
    # 108 bytes: nanomsg 1.1.5 used to abort the daemon at start (sun_path)
    path = "/tmp/" + "p" * 103
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"app:\n  endpoint: ipc://{path}\nstreams:\n  - stream: room\n")
    res = run("check", "-c", str(cfg))
    assert res.returncode == 2 and f"{cfg}:2:13: app.endpoint: the ipc path is 108 bytes" in res.stderr
    assert not (tmp_path / path).exists()


def test_a_missing_socket_directory_says_what_to_do(tmp_path):
    """Issue 33: "bind ipc:///run/idemproxy/app.sock: No such file or directory" alone."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"redis:\n  url: redis://127.0.0.1:1\napp:\n  endpoint: ipc://{tmp_path}/missing/app.sock\n"
                   "metrics:\n  listen: \"\"\nstreams:\n  - stream: room\n    key: \"#event.eventId\"\n")
    res = subprocess.run([str(BIN), "-c", str(cfg)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 1
    assert f"No such file or directory: create the directory {tmp_path}/missing" in res.stderr, res.stderr
    assert "IDEMPROXY_ENDPOINT" in res.stderr and "app.endpoint" in res.stderr


def readme_run_it_config():
    from pxtest import ROOT
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Run it\n"):]
    return section[section.index("```yaml\n") + 8:section.index("```", section.index("```yaml\n") + 8)]


def test_the_readme_run_it_config_runs_as_written(tmp_path, redis_server):
    """Issue 33: copied from the README, it failed outside a container (its socket's
    directory, /run/idemproxy, exists only in the image). Only the Redis address is
    given (IDEMPROXY_REDIS_URL: the test's server is not on 6379) and metrics are off
    (9464 may be taken on a shared machine); HOSTNAME is unset, as in a script."""
    import os
    cfg = tmp_path / "idemproxy.yaml"
    cfg.write_text(readme_run_it_config() + "metrics:\n  listen: \"\"\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HOSTNAME", "IDEMPROXY_ENDPOINT")}
    env["IDEMPROXY_REDIS_URL"] = redis_server.url
    res = subprocess.run([str(BIN), "check", "-c", str(cfg)], capture_output=True, text=True, timeout=10, env=env)
    assert res.returncode == 0, res.stderr
    assert "HOSTNAME" not in res.stderr, res.stderr      # the host's name, no warning
    p = subprocess.Popen([str(BIN), "-c", str(cfg)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 10
        while p.poll() is None and time.time() < deadline and \
                redis_server.client.exists("room") + redis_server.client.exists("room:leave") < 2:
            time.sleep(0.05)                  # the groups are created at start
        assert p.poll() is None, p.stderr.read()
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(10)
    err = p.stderr.read()
    assert rc == 0, err
    assert "error" not in err, err


def test_a_config_file_without_c_says_c_is_missing(tmp_path):
    """Issue 33: `idemproxy check c.yaml` printed the usage alone."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("streams:\n  - stream: room\n    key: \"#event.eventId\"\n")
    for args in (["check", str(cfg)], ["health", str(cfg)], ["inspect", str(cfg), "--stream", "room", "--key", "k"],
                 ["redrive", "--stream", "room", str(cfg)]):
        res = run(*args)
        assert res.returncode == 2, args
        assert res.stderr.startswith(f"idemproxy: -c is missing before '{cfg}'"), (args, res.stderr)
    res = run("check")
    assert res.returncode == 2 and res.stderr.startswith("idemproxy: check needs -c FILE"), res.stderr
    res = run(str(cfg))
    assert res.returncode == 2 and f"idemproxy -c {cfg}" in res.stderr.splitlines()[0], res.stderr
