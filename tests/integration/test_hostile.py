"""Hostile producers and servers (issue 37): what a producer writes into an
entry, or a Redis server sends back, must not crash the daemon, blow up its
memory, or be taken for idemproxy's own records."""
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from pxtest import BIN, Proxy, free_port, pb, pending, publish, wait_for


def test_deep_dotted_field_name_is_bad_input_and_loses_nothing_else(env):
    """Fields mode: a field name of 250,000 dotted parts (500 KB, under
    max_entry_bytes) once nested 250,000 json-c objects, whose recursive free
    overflowed the stack: SIGSEGV, the entry left pending, and every replica
    that reclaimed it crashed too. Now it is bad input like any other."""
    r = env.r
    p = env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "key": "#event.eventId",
                    "dead_letter": "dlq"}], max_entry_bytes=1048576)
    w = env.worker(p.endpoint)
    r.xadd("room", {"eventId": "before"})
    deep = ".".join(["a"] * 250000)
    bad_id = r.xadd("room", {"eventId": "deep", deep: "v"})
    r.xadd("room", {"eventId": "after"})
    wait_for(lambda: r.xlen("dlq") == 1, timeout=20, what="the dead letter")
    raw = redis.Redis(port=env.redis.port)
    dl = {k.decode(): v.decode() for k, v in raw.xrange("dlq")[0][1].items()}
    assert "field name 1 nests deeper than 31 objects" in dl["idemproxy-reason"], dl["idemproxy-reason"]
    assert dl["idemproxy-entry-id"] == bad_id
    assert dl[deep] == "v" and dl["eventId"] == "deep"        # the entry, whole
    wait_for(lambda: sorted(w.keys()) == ["after", "before"], what="the good entries")
    wait_for(lambda: pending(r, "room", "g") == 0, what="nothing pending")
    assert re.search(rf"stream room entry {bad_id} key \S+ attempt \d+: bad entry: field name 1 nests",
                     p.log_text())
    assert p.proc.poll() is None            # still running


class EvilRedis:
    """A RESP server on 127.0.0.1 that passes idemproxy's handshake as Redis
    7.2 and answers every XREAD with 'evil' (then holds the connection open).
    It counts the XREADs it was sent."""

    def __init__(self, evil):
        self.evil = evil
        self.port = free_port()
        self.xreads = []            # when each XREAD came
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _answer(self, argv):
        name = argv[0].upper()
        if name == b"HELLO":
            fields = [b"server", b"redis", b"version", b"7.2.4", b"proto", b"2", b"id", b"3",
                      b"mode", b"standalone", b"role", b"master"]
            return b"*%d\r\n" % (len(fields) + 2) + b"".join(
                b"$%d\r\n%s\r\n" % (len(f), f) for f in fields) + b"$7\r\nmodules\r\n*0\r\n"
        if name == b"PING":
            return b"+PONG\r\n"
        if name == b"SCRIPT":
            return b"$40\r\n" + b"0" * 40 + b"\r\n"
        if name == b"XREAD":
            with self.lock:
                self.xreads.append(time.monotonic())
            return self.evil
        return b"-ERR unknown command\r\n"

    def _serve(self, c):
        buf = b""
        while True:
            try:
                data = c.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while True:
                argv, buf = _resp_command(buf)
                if argv is None:
                    break
                try:
                    c.sendall(self._answer(argv))
                except OSError:
                    return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def _resp_command(buf):
    """One RESP array of bulk strings off the front of buf: (argv, rest) or (None, buf)."""
    if b"\r\n" not in buf:
        return None, buf
    head, rest = buf.split(b"\r\n", 1)
    argv = []
    for _ in range(int(head[1:])):
        if b"\r\n" not in rest:
            return None, buf
        ln, rest = rest.split(b"\r\n", 1)
        n = int(ln[1:])
        if len(rest) < n + 2:
            return None, buf
        argv.append(rest[:n])
        rest = rest[n + 2:]
    return argv, rest


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# An XREAD reply up to the fields of its one entry (stream s, entry 1-0).
ENTRY = b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n"
EVIL = [
    ("array 1e8", b"*100000000\r\n", "an array of 100000000 elements, over the limit of 2097152"),
    ("array INT_MAX", b"*2147483647\r\n", "an array of 2147483647 elements, over the limit of 2097152"),
    ("bulk 2e9", ENTRY + b"*2\r\n$7\r\npayload\r\n$2000000000\r\n" + b"x" * 65536,
     "a string of 2000000000 bytes, over the limit of 536870912"),
]


@pytest.mark.parametrize("evil,reason", [(e[1], e[2]) for e in EVIL], ids=[e[0] for e in EVIL])
def test_a_huge_reply_header_is_a_protocol_error_not_gigabytes(tmp_path, evil, reason):
    """A 13-byte reply from a malicious server ('*100000000') drove the RSS to
    788 MB, and '*2147483647' to a 17 GB allocation: hiredis asks for a whole
    array from its header. Past what the daemon can need (2 x max_entry_bytes
    elements, 1 MiB by default; a string past 512 MiB) the reply is a protocol
    error: counted, logged once, the link dropped and dialled again with
    backoff; the daemon stays up with its memory bounded."""
    fake = EvilRedis(evil)
    px = Proxy(tmp_path, "proxy1", f"redis://127.0.0.1:{fake.port}", f"ipc://{tmp_path}/app.sock",
               [{"stream": "s", "payload_field": "payload", "key": "#event.eventId"}])
    try:
        px.start()
        wait_for(lambda: len(fake.xreads) >= 4, timeout=15, what="a read, and more after reconnects")
        assert px.proc.poll() is None, px.log_text()[-3000:]
        peak = peak_rss(px.proc.pid)
        assert peak < 64 * 1024 * 1024, f"peak RSS {peak / 2**20:.0f} MiB"
        log = px.log_text()
        warned = [ln for ln in log.splitlines() if " warn " in ln and "protocol error" in ln]
        assert len(warned) == 1 and reason in warned[0], log[-3000:]   # once, not per reconnect
        assert px.metrics()["idemproxy_redis_errors_total"] >= 3
        # The backoff grows (0.1, 0.2, 0.4 s...) although each handshake
        # succeeds: a lower bound, which no load can break.
        gaps = [b - a for a, b in zip(fake.xreads, fake.xreads[1:])]
        assert gaps[2] >= 0.35, gaps
    finally:
        px.stop()
        fake.close()


def test_a_huge_fields_header_inside_a_reply_allocates_nothing(tmp_path):
    """A fields array announced with 50,000,000 elements inside a read reply
    is an entry with more fields than any deliverable one: it is elided (no
    element array allocated), read on, and here, where the server never sends
    the elements, the silent link times out and is dialled again; memory
    stays bounded and it is no protocol error."""
    fake = EvilRedis(ENTRY + b"*50000000\r\n")
    px = Proxy(tmp_path, "proxy1", f"redis://127.0.0.1:{fake.port}", f"ipc://{tmp_path}/app.sock",
               [{"stream": "s", "payload_field": "payload", "key": "#event.eventId"}], timeout_ms=300)
    try:
        px.start()
        wait_for(lambda: len(fake.xreads) >= 2, timeout=20, what="a read, and another after the timeout")
        assert px.proc.poll() is None, px.log_text()[-3000:]
        assert peak_rss(px.proc.pid) < 64 * 1024 * 1024
        assert "protocol error" not in px.log_text()
    finally:
        px.stop()
        fake.close()


def test_an_entry_with_more_fields_than_the_cap_is_dead_lettered_alone(env):
    """An entry of 524,289 empty fields (1,048,578 names and values, over the
    1,048,576-element cap with max_entry_bytes 1024) is about 12 MB to write
    and 4 MB in Redis: any producer can add one. Its fields array was a
    protocol error that dropped the link at every read, so the stream stopped
    for good (and a reclaim of it dropped the command link). It is bad input:
    dead-lettered by reference, and the entries around it are delivered."""
    import socket
    r = env.r
    r.xgroup_create("s", "g", id="0", mkstream=True)
    nf = 524289
    s = socket.create_connection(("127.0.0.1", env.redis.port))
    s.sendall(b"*%d\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n" % (3 + 2 * nf) + b"$1\r\na\r\n$0\r\n\r\n" * nf)
    assert s.recv(100).startswith(b"$"), "XADD of the wide entry"
    s.close()
    for i in range(3):
        r.xadd("s", {"payload": json.dumps({"eventId": f"e{i}"})})
    ep = env.endpoint()
    w = env.worker(ep)
    p = env.proxy([{"stream": "s", "group": "g", "key": "#event.eventId", "payload_field": "payload",
                    "dead_letter": "dl"}], endpoint=ep, max_entry_bytes=1024)
    wait_for(lambda: sorted(w.keys()) == ["e0", "e1", "e2"], timeout=20, what="the other entries delivered")
    wait_for(lambda: r.xlen("dl") == 1 and r.xpending("s", "g")["pending"] == 0, timeout=10,
             what="the wide entry dead-lettered and acked")
    (_, f), = r.xrange("dl")
    assert "field names and values" in f["idemproxy-reason"], f["idemproxy-reason"]
    assert "a" not in f, "the dead letter is a reference, not a copy"
    assert "protocol error" not in p.log_text()


def run(*args):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60)


def test_forged_dead_letter_fields_are_the_entrys_not_idemproxys(env):
    """A dead letter is the entry's fields, then idemproxy's four. A producer
    of orders that added 'idemproxy-stream: payments' (and other forged
    idemproxy-* fields) to an entry that got dead-lettered made 'redrive
    --stream payments' (first match) move it into payments and clear a
    payment's done mark: delivered twice. idemproxy's fields are read from
    their place, the last four; the producer's go back with the entry."""
    r = env.r
    raw = redis.Redis(port=env.redis.port)
    streams = [
        {"stream": "orders", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.id", "prefix": "ord:", "dead_letter": "dead"},
        {"stream": "payments", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.id", "prefix": "pay:", "dead_letter": "dead"},
    ]
    drop = {"on": True}

    def behave(d):
        if d.stream == "orders" and drop["on"]:
            return (pb.Ack.DROP, "order refused")
        return (pb.Ack.ACK, "")
    p = env.proxy(streams)
    w = env.worker(p.endpoint, behave=behave)
    r.xadd("payments", {"payload": json.dumps({"id": "p1"})})
    wait_for(lambda: (r.get("pay:p1") or "")[:1] == "D", what="the payment done")
    forged = [("payload", json.dumps({"id": "p1"})), ("idemproxy-stream", "payments"),
              ("idemproxy-entry-id", "1-1"), ("idemproxy-reason", "forged"),
              ("idemproxy-attempts", "9")]
    order_id = raw.xadd("orders", dict(forged)).decode()
    wait_for(lambda: r.xlen("dead") == 1, what="the order dead-lettered")
    wait_for(lambda: pending(r, "orders", "g") == 0, what="the order acked")
    cfg = str(p.config)

    # inspect reads the same place: the dead letter is the order's
    res = run("inspect", "-c", cfg, "--stream", "orders", "--entry", order_id)
    assert res.returncode == 0, res.stderr
    assert "reason order refused, attempts 1" in res.stdout, res.stdout
    res = run("inspect", "-c", cfg, "--stream", "payments", "--entry", "1-1")
    assert res.returncode == 0 and "dead letters: none in dead" in res.stdout, res.stdout

    # the attack: nothing of payments is touched
    for extra, said in ((["--dry-run"], "would redrive 0, skip 0 (1 dead letters not selected)"),
                        ([], "redriven 0, skipped 0 (1 dead letters not selected)")):
        res = run("redrive", "-c", cfg, "--stream", "payments", *extra)
        assert res.returncode == 0, res.stderr
        assert said in res.stdout, res.stdout
    assert r.xlen("payments") == 1 and (r.get("pay:p1") or "")[:1] == "D"
    assert r.xlen("dead") == 1

    # into orders, its fields exactly as the producer wrote them
    drop["on"] = False
    res = run("redrive", "-c", cfg, "--stream", "orders")
    assert res.returncode == 0, res.stderr
    assert "redriven 1, skipped 0" in res.stdout, res.stdout
    assert r.xlen("dead") == 0 and r.xlen("payments") == 1
    (_, back), = raw.xrange("orders", min="(" + order_id)
    assert [(k.decode(), v.decode()) for k, v in back.items()] == forged
    wait_for(lambda: [d.key for d in w.got].count("p1") == 3, what="the order delivered again")
    assert [d.stream for d in w.got] == ["payments", "orders", "orders"]
    wait_for(lambda: (r.get("ord:p1") or "")[:1] == "D", what="the order done")
    assert (r.get("pay:p1") or "")[:1] == "D"


# A worker's reason as bytes no proto3 library would send: not UTF-8 (\xff),
# a terminal escape sequence (ESC [ 2 J clears the screen), a C1 control
# (U+009B, CSI on some terminals), a quote and a backslash.
EVIL_REASON = b'no \xff\xfe \x1b[2J \xc2\x9b "q" \\ end'


def ack_bytes(status, reason):
    """An Ack whose reason is 'reason', bytes as they are."""
    placeholder = "R" * len(reason)
    raw = pb.Ack(status=status, reason=placeholder).SerializeToString()
    return raw.replace(placeholder.encode(), reason)


def json_log_proxy(env, streams):
    p = Proxy(env.tmp, f"pj{len(env.proxies) + 1}", env.redis.url, env.endpoint(), streams)
    p.config.write_text(p.config.read_text().replace("level: debug", "level: debug\n  format: json"))
    env.proxies.append(p)
    return p.start()


def assert_terminal_safe(data: bytes, what):
    text = data.decode("utf-8")                          # strict: raises on a byte not UTF-8
    assert "\x1b" not in text and not any(0x80 <= ord(ch) <= 0x9f for ch in text), (what, text[-2000:])
    return text


def test_a_workers_reason_not_utf8_keeps_json_log_lines_json(env):
    """A RETRY or DROP reason that is not UTF-8 made the JSON log line that
    quoted it invalid (its bytes were copied as they came)."""
    r = env.r
    p = json_log_proxy(env, [{"stream": "room", "group": "g", "consumer": "c1",
                              "payload_field": "payload", "key": "#event.eventId",
                              "dead_letter": "dlq", "retry_backoff_ms": 50}])

    def behave(d):
        return ack_bytes(pb.Ack.RETRY if d.attempt == 1 else pb.Ack.DROP, EVIL_REASON)
    env.worker(p.endpoint, behave=behave)
    r.xadd("room", {"payload": json.dumps({"eventId": "k\x1b[2J"})})
    wait_for(lambda: r.xlen("dlq") == 1, what="the dead letter")
    wait_for(lambda: pending(r, "room", "g") == 0, what="acked")
    raw = redis.Redis(port=env.redis.port)
    [(_, dl)] = raw.xrange("dlq")
    assert dl[b"idemproxy-reason"] == EVIL_REASON           # the dead letter keeps the bytes
    lines = p.log.read_bytes().splitlines()
    parsed = [json.loads(ln.decode("utf-8")) for ln in lines if ln.strip()]   # every line
    about = [l["msg"] for l in parsed if l.get("key") == "k\x1b[2J"]
    said = [m for m in about if "no \\xff\\xfe \x1b[2J \x9b \"q\" \\ end" in m]
    assert said, about


def test_inspect_and_redrive_escape_keys_and_reasons(env):
    """inspect and redrive --dry-run printed a producer's key and a worker's
    reason as they were: a key or reason holding ESC [ 2 J cleared the
    operator's screen. Now they are shown escaped, in valid UTF-8."""
    r = env.r
    p = env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId", "dead_letter": "dlq"}], log_level="debug")
    env.worker(p.endpoint, behave=lambda d: ack_bytes(pb.Ack.DROP, EVIL_REASON))
    eid = r.xadd("room", {"payload": json.dumps({"eventId": "k\x1b[2J\u009b"})})
    wait_for(lambda: r.xlen("dlq") == 1, what="the dead letter")
    wait_for(lambda: pending(r, "room", "g") == 0, what="acked")
    out = subprocess.run([str(BIN), "inspect", "-c", str(p.config), "--stream", "room", "--entry", eid],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = assert_terminal_safe(out.stdout, "inspect")
    assert "key: k\\x1b[2J\\xc2\\x9b" in text, text
    assert 'reason no \\xff\\xfe \\x1b[2J \\xc2\\x9b "q" \\\\ end, attempts 1' in text, text
    out = subprocess.run([str(BIN), "inspect", "-c", str(p.config), "--stream", "room", "--entry", eid,
                          "--json"], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout.decode("utf-8"))                 # JSON, whatever the bytes
    assert j["key"]["key"] == "k\x1b[2J\u009b"
    assert j["dead_letters"][0]["reason"] == 'no \\xff\\xfe \x1b[2J \u009b "q" \\ end'
    out = subprocess.run([str(BIN), "redrive", "-c", str(p.config), "--stream", "room", "--dry-run"],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = assert_terminal_safe(out.stdout, "redrive --dry-run")
    assert "key k\\x1b[2J\\xc2\\x9b" in text and 'reason no \\xff\\xfe \\x1b[2J' in text, text
    # the text log too: the key and the reason escaped
    assert_terminal_safe(p.log.read_bytes(), "the log")


# --- secrets in the daemon's memory and on disk (issue 37, hygiene) ----------

def test_the_daemon_is_not_dumpable(tmp_path, redis_server):
    """It holds the Redis password: no core dump, and no ptrace or
    /proc/PID/mem for another process of the same user. The kernel shows a
    process that is not dumpable by giving its /proc/PID files to root, so the
    daemon runs here as nobody and its files must still say root."""
    import os
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="idemproxy-dump-"))   # nobody reads pytest's tmp
    os.chmod(d, 0o777)
    cfg = d / "c.yaml"
    cfg.write_text(f"redis:\n  url: {redis_server.url}\napp:\n  endpoint: ipc://{d}/app.sock\n"
                   f"metrics:\n  listen: ''\nstreams:\n  - stream: room\n    key: '#event.id'\n")
    os.chmod(cfg, 0o644)
    log = open(tmp_path / "dump.log", "wb")
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             str(BIN), "-c", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"running" in (tmp_path / "dump.log").read_bytes(), what="running")
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(r"^Uid:\s+65534\s", status, re.M), status     # runs as nobody
        assert os.stat(f"/proc/{proc.pid}/status").st_uid == 0          # not dumpable
        assert os.stat(f"/proc/{proc.pid}/mem").st_uid == 0
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def memory_holds(pid, secret):
    """True when any writable mapping of 'pid' holds the bytes 'secret'."""
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms or "w" not in perms:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            if hi - lo > 1 << 30:       # a sanitizer's shadow: reserved, not the heap
                continue
            tail = b""
            for at in range(lo, hi, 16 << 20):   # 16 MiB at a time, overlapping by the secret
                try:
                    mem.seek(at)
                    chunk = tail + mem.read(min(16 << 20, hi - at))
                except (OSError, ValueError, OverflowError):
                    break
                found = found or secret in chunk
                tail = chunk[-(len(secret) - 1):]
    return found


def test_a_rotated_password_leaves_no_copy_in_memory(env, tmp_path):
    """The daemon kept the password read at start for ever (the hub's copy,
    and freed buffers of the file read, the AUTH command and the links):
    after a Secret was rotated, the old password could still be read out of
    the process. Each link keeps the one password it needs to reconnect;
    every other copy is overwritten once used."""
    r = env.r
    old, new = b"Old-Password-9c3e71a4d2", b"New-Password-5b8f20c6e9"
    r.execute_command("ACL", "SETUSER", "app", "reset", "on", ">" + old.decode(), "~*", "&*", "+@all")
    pw = tmp_path / "password"
    pw.write_bytes(old + b"\n")
    os.chmod(pw, 0o600)
    p = Proxy(env.tmp, "proxy1", env.redis.url, env.endpoint(),
              [{"stream": "room", "group": "g", "consumer": "c1", "key": "#event.id",
                "payload_field": "payload"}], redis={"password_file": str(pw), "username": "app"})
    env.proxies.append(p)
    p.start()
    w = env.worker(p.endpoint)
    r.xadd("room", {"payload": json.dumps({"id": "a"})})
    wait_for(lambda: w.keys() == ["a"], what="delivered with the old password")
    assert memory_holds(p.proc.pid, old)          # the links' copy, in use
    pw.write_bytes(new + b"\n")
    r.execute_command("ACL", "SETUSER", "app", "reset", "on", ">" + new.decode(), "~*", "&*", "+@all")
    r.execute_command("CLIENT", "KILL", "USER", "app")
    r.xadd("room", {"payload": json.dumps({"id": "b"})})
    wait_for(lambda: w.keys() == ["a", "b"], timeout=20, what="delivered with the new password")
    wait_for(lambda: p.get("/readyz")[0] == 200, what="ready again")
    assert memory_holds(p.proc.pid, new)
    assert not memory_holds(p.proc.pid, old)


@pytest.mark.parametrize("mode,owner,warned", [
    (0o644, None, "every user"),
    (0o640, None, "its group"),           # its own file: the group bit is not needed
    (0o600, None, None),
    (0o440, 12345, None),                 # a Secret: root's (here 12345's), read through fsGroup
])
def test_a_password_file_others_can_read_is_one_warning(env, tmp_path, mode, owner, warned):
    pw = tmp_path / "password"
    pw.write_text("")
    os.chmod(pw, mode)
    if owner is not None:
        os.chown(pw, owner, -1)
    p = Proxy(env.tmp, "proxy1", env.redis.url, env.endpoint(),
              [{"stream": "room", "key": "#event.id"}], redis={"password_file": str(pw)})
    env.proxies.append(p)
    p.start()
    p.wait_log("running")
    said = [l for l in p.log_text().splitlines() if "redis.password_file" in l]
    if warned:
        assert len(said) == 1 and f"is readable by {warned} (mode 0{mode:o})" in said[0], said
        assert "defaultMode" in said[0]
    else:
        assert said == [], said


def test_a_key_over_1024_bytes_is_bad_input_and_loses_nothing_else(env):
    """A rendered key had no length cap: one producer's 1 MiB key was claimed
    and marked done, and lived in Redis for done_ttl_ms. Now a key over 1024
    bytes is bad input: dead-lettered with its length, the others delivered."""
    r = env.r
    p = env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId", "dead_letter": "dlq"}], max_entry_bytes=2097152)
    w = env.worker(p.endpoint)
    huge = "k" * 300000          # (a Delivery holds it twice: under max_entry_bytes)
    r.xadd("room", {"payload": json.dumps({"eventId": "before"})})
    bad_id = r.xadd("room", {"payload": json.dumps({"eventId": huge})})
    r.xadd("room", {"payload": json.dumps({"eventId": "x" * 1024})})       # at the limit
    r.xadd("room", {"payload": json.dumps({"eventId": "after"})})
    wait_for(lambda: sorted(w.keys()) == ["after", "before", "x" * 1024], what="the good entries")
    wait_for(lambda: r.xlen("dlq") == 1, what="the dead letter")
    raw = redis.Redis(port=env.redis.port)
    dl = {k.decode(): v.decode() for k, v in raw.xrange("dlq")[0][1].items()}
    assert dl["idemproxy-entry-id"] == bad_id
    assert ("key '#event.eventId' renders 300000 bytes, over the limit of 1024"
            in dl["idemproxy-reason"]), dl["idemproxy-reason"]
    wait_for(lambda: pending(r, "room", "g") == 0, what="nothing pending")
    assert not any(len(k) > 2000 for k in r.keys("*"))     # no key of it in Redis


def blocked_clients(r):
    return r.info("clients")["blocked_clients"]


def read_total(p, stream):
    return p.metrics().get(f'idemproxy_entries_read_total{{stream="{stream}",group="g"}}', 0)


@pytest.mark.parametrize("idle", [0, 1])
def test_a_stream_whose_worker_never_answers_leaves_the_others_read(env, idle):
    """One stream whose worker never answers held all of max_inflight, and
    no other stream was read again (entries_read 0 on it). Each stream is now
    owed a share (a quarter of max_inflight each with two streams): the slow
    one holds at most the rest, and the other keeps flowing (its deliveries
    take the send window's slots as the slow one's time out). With a third,
    idle, stream each is owed 1: the fast one reads one entry at a time."""
    r = env.r
    block = {"group": "g", "consumer": "c1", "payload_field": "payload", "key": "#event.id",
             "max_deliveries": 1000, "retry_backoff_ms": 100}
    p = env.proxy([dict(block, stream="slow", prefix="idem:slow:"),
                   dict(block, stream="fast", prefix="idem:fast:")] +
                  [dict(block, stream="idle", prefix="idem:idle:")] * idle,
                  max_inflight=8, ack_timeout_ms=1000)
    w = env.worker(p.endpoint, behave=lambda d: None if d.stream == "slow" else (pb.Ack.ACK, ""))
    publish(r, "slow", [{"id": f"s{i}"} for i in range(40)])
    wait_for(lambda: read_total(p, "slow") >= 5 - idle, what="the slow stream read")
    # The fast stream's first read (BLOCK 2000) went out before the slow one
    # filled up; once it comes back empty, the reader asks again only if there
    # is room. Give it that time (at most a few seconds) before publishing.
    deadline = time.monotonic() + 6
    while blocked_clients(r) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    publish(r, "fast", [{"id": f"f{i}"} for i in range(5)])
    wait_for(lambda: pending(r, "fast", "g") == 0 and read_total(p, "fast") == 5, timeout=40,
             what="the fast stream read and acked")
    assert sorted(set(k for k in w.keys() if k.startswith("f"))) == [f"f{i}" for i in range(5)]
    assert read_total(p, "slow") <= 6        # max_inflight 8 less the others' reserves (2, 1 + 1)
