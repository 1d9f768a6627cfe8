"""One scenario, run against every language's example worker, so the clients
cannot drift apart. A language joins by having clients/<lang>/Makefile with an
`example` target that honours the worker contract (see clients/c/example_worker.c):
stdout gets one '<key> attempt=<n>' line per delivery; WORKER_RETRY_KEYS,
WORKER_DROP_KEYS, WORKER_SLOW_KEYS/WORKER_SLOW_MS, WORKER_DEADLINE_KEYS (work
WORKER_SLOW_MS, stopping at the deadline) and WORKER_CONCURRENCY shape the
answers; WORKER_REPORT names a file that gets one JSON line per delivery."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from pxtest import ROOT, pb, pending, wait_for

LANGS = sorted(p.parent.name for p in (ROOT / "clients").glob("*/Makefile"))
CONCURRENT = {"python", "go", "node", "java", "rust"}   # C's stub is one loop on one socket
LINE = re.compile(r"^(\S+) attempt=(\d+)$")
_built = {}


def build(lang):
    if lang not in _built:
        res = subprocess.run(["make", "-s", "-C", str(ROOT / "clients" / lang)],
                             capture_output=True, text=True, timeout=1200)
        _built[lang] = res
    res = _built[lang]
    assert res.returncode == 0, f"building clients/{lang} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


class ExampleWorker:
    def __init__(self, lang, endpoint, tmp, **env):
        self.out = tmp / f"{lang}-worker.out"
        self.err = tmp / f"{lang}-worker.err"
        e = dict(os.environ)
        e.update({k: str(v) for k, v in env.items()})
        self.proc = subprocess.Popen(
            ["make", "-s", "--no-print-directory", "-C", str(ROOT / "clients" / lang), "example",
             f"ENDPOINT={endpoint}"],
            stdout=open(self.out, "wb"), stderr=open(self.err, "wb"), env=e, start_new_session=True)

    def lines(self):
        return [l for l in self.out.read_text(errors="replace").splitlines() if LINE.match(l)]

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.mark.parametrize("lang", LANGS)
def test_client_scenario(env, lang):
    build(lang)
    r = env.r
    report = env.tmp / f"{lang}-report.jsonl"
    ep = env.endpoint()
    w = ExampleWorker(lang, ep, env.tmp, WORKER_RETRY_KEYS="retry-me", WORKER_DROP_KEYS="drop-me",
                      WORKER_SLOW_KEYS="slow-1,slow-2", WORKER_SLOW_MS=1500, WORKER_CONCURRENCY=4,
                      WORKER_REPORT=report)
    try:
        # The worker starts first and keeps dialing until idemproxy is there.
        time.sleep(0.5)
        env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId", "fencing": True, "dead_letter": "dlq",
                    "retry_backoff_ms": 50}], endpoint=ep, max_inflight=16)
        ids = {}
        for k in ["k1", "k2", "k3", "k4"] * 2 + ["retry-me", "drop-me", "slow-1", "slow-2"]:
            ids[k] = r.xadd("room", {"payload": json.dumps({"eventId": k, "n": 1})})
        ids["fields-1"] = r.xadd("room", {"source": "scenario", "payload": json.dumps({"eventId": "fields-1", "n": 7}),
                                          "trace": "t-1"})
        want = sorted(["k1 attempt=1", "k2 attempt=1", "k3 attempt=1", "k4 attempt=1",
                       "retry-me attempt=1", "retry-me attempt=2", "drop-me attempt=1",
                       "slow-1 attempt=1", "slow-2 attempt=1", "fields-1 attempt=1"])
        wait_for(lambda: len(w.lines()) >= len(want), timeout=30,
                 what=f"{lang} worker lines (stderr: {w.err.read_text(errors='replace')[-500:]})")
        wait_for(lambda: pending(r, "room", "g") == 0, what="everything acked")
        time.sleep(0.3)
        assert sorted(w.lines()) == want          # each key once, the retried one twice

        rows = [json.loads(l) for l in report.read_text().splitlines() if l.strip()]
        by = {}
        for row in rows:
            by.setdefault(row["key"], []).append(row)
        for row in rows:
            assert isinstance(row["key"], str) and isinstance(row["stream"], str)
            assert isinstance(row["entry_id"], str) and isinstance(row["payload"], str)
            for k in ("attempt", "fencing_token", "deadline_unix_ms", "start_ms", "end_ms"):
                assert isinstance(row[k], int) and not isinstance(row[k], bool), (k, row)
            assert isinstance(row["fields"], dict)
            assert row["stream"] == "room" and row["fencing_token"] > 0
            assert json.loads(row["payload"])["eventId"] == row["key"]
        f = by["fields-1"][0]
        assert f["fields"] == {"source": "scenario", "trace": "t-1"}
        assert f["entry_id"] == ids["fields-1"]
        assert json.loads(f["payload"]) == {"eventId": "fields-1", "n": 7}
        rt = by["retry-me"]
        assert [x["attempt"] for x in rt] == [1, 2] and [x["status"] for x in rt] == ["retry", "ack"]
        assert rt[1]["fencing_token"] > rt[0]["fencing_token"]

        dl = r.xrange("dlq")
        assert len(dl) == 1
        assert dl[0][1]["idemproxy-reason"] == "dropped by worker"
        assert dl[0][1]["idemproxy-entry-id"] == ids["drop-me"]
        for k in ["k1", "k2", "k3", "k4", "retry-me", "drop-me", "slow-1", "slow-2", "fields-1"]:
            assert (r.get("idem:" + k) or "")[:1] == "D", k

        if lang in CONCURRENT:
            a, b = by["slow-1"][0], by["slow-2"][0]
            assert a["start_ms"] < b["end_ms"] and b["start_ms"] < a["end_ms"], \
                f"{lang}: slow deliveries were not handled at the same time: {a} {b}"
    finally:
        w.stop()


# ---------------------------------------------------------------------------
# The cases below drive each example worker from a REQ socket of the test's own
# (pynng) instead of idemproxy, so they choose every byte of a Delivery:
# deadline_unix_ms, the wire type of `attempt`, the bytes of `key`, the size.

MAX_ENTRY_BYTES = 1048576   # idemproxy's default app.max_entry_bytes


class FakeProxy:
    """A REQ socket listening at 'endpoint', as idemproxy binds it; each ask()
    is one request on its own NNG context, so any number can be in flight."""

    def __init__(self, endpoint):
        import pynng
        self.pynng = pynng
        self.sock = pynng.Req0(listen=endpoint)
        self.sock.resend_time = 600000   # never resend on a timer (NNG still resends when a pipe dies)

    def connected(self):
        return len(self.sock.pipes) > 0

    def send(self, body):
        """Sends 'body' on a fresh context and returns the context."""
        ctx = self.sock.new_context()
        self.pynng.lib.nng_ctx_set_ms(ctx.context, b"send-timeout", 5000)
        ctx.send(body)
        return ctx

    def reply(self, ctx, timeout):
        """The Ack for the request sent on 'ctx', or None after 'timeout' seconds."""
        self.pynng.lib.nng_ctx_set_ms(ctx.context, b"recv-timeout", int(timeout * 1000))
        try:
            return pb.Ack.FromString(ctx.recv())
        except self.pynng.Timeout:
            return None
        finally:
            ctx.close()

    def ask(self, body, timeout=10.0):
        return self.reply(self.send(body), timeout)

    def close(self):
        self.sock.close()


def delivery(key="k", *, deadline_ms=None, payload=b"{}", attempt=1, entry_id="1700000000000-1"):
    """An encoded Delivery; deadline_ms None means 30 s from now."""
    if deadline_ms is None:
        deadline_ms = int(time.time() * 1000) + 30000
    return pb.Delivery(stream="room", entry_id=entry_id, key=key, payload=payload,
                       attempt=attempt, fencing_token=7, deadline_unix_ms=deadline_ms).SerializeToString()


def sized_delivery(key, size):
    """A Delivery whose encoding is exactly 'size' bytes (padded in the payload)."""
    pad = size - len(delivery(key, payload=b""))
    while True:
        body = delivery(key, payload=b"x" * pad)
        if len(body) == size:
            return body
        pad -= len(body) - size


def worker_pid(w):
    """The example worker's own process: the child of `make example` that was
    given --endpoint (make's $(shell ...) children come and go before it)."""
    def child():
        try:
            kids = open(f"/proc/{w.proc.pid}/task/{w.proc.pid}/children").read().split()
            for k in kids:
                if b"--endpoint" in open(f"/proc/{k}/cmdline", "rb").read().split(b"\0"):
                    return int(k)
        except (FileNotFoundError, ProcessLookupError):
            pass
        return None
    wait_for(lambda: child() is not None, timeout=60, what="the worker process")
    return child()


def reported(report):
    if not report.exists():
        return []
    return [json.loads(l) for l in report.read_text().splitlines() if l.strip()]


def raw_worker(lang, tmp, name="w", **env):
    build(lang)
    ep = f"ipc://{tmp}/{lang}-{name}.sock"
    fake = FakeProxy(ep)
    report = tmp / f"{lang}-{name}-report.jsonl"
    w = ExampleWorker(lang, ep, tmp, WORKER_REPORT=report, **env)
    wait_for(fake.connected, timeout=60, what=f"{lang} worker connected")
    time.sleep(0.2)   # the handshake done, the connection in the round robin
    return fake, w, report, ep


@pytest.mark.parametrize("lang", LANGS)
def test_client_stale_deadline_is_retried_unhandled(tmp_path, lang):
    """A delivery whose deadline has passed is answered RETRY and never reaches
    the handler: idemproxy has given up on it and delivers it again anyway."""
    fake, w, report, _ = raw_worker(lang, tmp_path)
    try:
        now = int(time.time() * 1000)
        stale = fake.ask(delivery("stale", deadline_ms=now - 1000))
        assert stale is not None, f"{lang}: no answer"
        assert stale.status == pb.Ack.RETRY and "deadline" in stale.reason, (lang, stale)
        fresh = fake.ask(delivery("fresh", deadline_ms=now + 30000))
        unset = fake.ask(delivery("unset", deadline_ms=0))    # 0: no deadline
        assert fresh is not None and fresh.status == pb.Ack.ACK, (lang, fresh)
        assert unset is not None and unset.status == pb.Ack.ACK, (lang, unset)
        assert [r["key"] for r in reported(report)] == ["fresh", "unset"]
    finally:
        w.stop()
        fake.close()


@pytest.mark.parametrize("lang", LANGS)
def test_client_receives_max_entry_bytes(tmp_path, lang):
    """idemproxy sends a Delivery of up to app.max_entry_bytes (1 MiB by default)
    plus its SP request id; every client receives that with its defaults, and
    refuses (without running the handler) what is bigger than its limit."""
    fake, w, report, _ = raw_worker(lang, tmp_path)
    try:
        big = fake.ask(sized_delivery("big", MAX_ENTRY_BYTES), timeout=20)
        assert big is not None and big.status == pb.Ack.ACK, \
            f"{lang}: a {MAX_ENTRY_BYTES}-byte Delivery was not answered: {big} " \
            f"(stderr: {w.err.read_text(errors='replace')[-500:]})"
        over = fake.send(sized_delivery("over", MAX_ENTRY_BYTES + 4096))
        assert fake.reply(over, 3) is None, f"{lang}: a Delivery over the limit was answered"
        assert [r["key"] for r in reported(report)] == ["big"]
    finally:
        w.stop()
        fake.close()


def _wrong_wire_type_attempt():
    # field 6 (attempt, a varint) sent length-delimited: tag 0x32, length 1, one byte
    return delivery("bad-attempt") + b"\x32\x01x"


def _invalid_utf8_key():
    # field 3 (key, a proto3 string, so UTF-8) holding bytes that are not UTF-8
    return pb.Delivery(stream="room", entry_id="1700000000000-2").SerializeToString() + b"\x1a\x02\xff\xfe"


@pytest.mark.parametrize("lang", LANGS)
def test_client_malformed_delivery_is_retried(tmp_path, lang):
    """Malformed input gets one answer from every client: RETRY with a reason,
    and the handler never sees it."""
    fake, w, report, _ = raw_worker(lang, tmp_path)
    try:
        for what, body in [("wrong wire type for attempt", _wrong_wire_type_attempt()),
                           ("invalid UTF-8 in key", _invalid_utf8_key())]:
            ack = fake.ask(body)
            assert ack is not None, f"{lang}: {what}: no answer"
            assert ack.status == pb.Ack.RETRY and ack.reason, f"{lang}: {what}: {ack}"
        ok = fake.ask(delivery("good"))
        assert ok is not None and ok.status == pb.Ack.ACK
        assert [r["key"] for r in reported(report)] == ["good"]
    finally:
        w.stop()
        fake.close()


# Issue 32: a request without a request id (the body ends before a backtrace word
# with its top bit set) is skipped by Go, Node, Java and C; NNG's REP (Python, Rust)
# skips one of 4 bytes or more (ttl-max 1: the case below for C, Java, Rust, Python)
# but hangs up on a body under 4 bytes, as this case sends: NNG's own limit.
NO_ID_HANGS_UP = {"python", "rust"}


@pytest.mark.parametrize("lang", [
    pytest.param(lang, marks=pytest.mark.xfail(strict=True, reason="NNG's REP hangs up (issue 32)"))
    if lang in NO_ID_HANGS_UP else lang for lang in ["python", "c", "go", "node"]])
def test_client_skips_a_request_without_an_id(tmp_path, lang):
    """A frame whose body is too short to hold a request id is skipped: no
    answer, the connection stays, and the next good request on it is answered."""
    import socket as socketlib
    import struct
    build(lang)
    path = tmp_path / f"{lang}-noid.sock"
    srv = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    srv.settimeout(60)
    w = ExampleWorker(lang, f"ipc://{path}", tmp_path)
    conn = None
    try:
        conn, _ = srv.accept()
        conn.settimeout(10)
        conn.sendall(b"\x00SP\x00" + struct.pack(">H", 0x30) + b"\x00\x00")   # REQ
        assert conn.recv(8, socketlib.MSG_WAITALL)[4:6] == struct.pack(">H", 0x31), f"{lang}: not a REP"

        def frame(body):   # ipc: a message-type byte, the size, the body
            return b"\x01" + struct.pack(">Q", len(body)) + body
        try:
            conn.sendall(frame(b"\x08\x01"))                             # no request id
            conn.sendall(frame(b"\x80\x00\x00\x07" + delivery("good")))  # request id 7
            head = conn.recv(9, socketlib.MSG_WAITALL)
        except (BrokenPipeError, ConnectionResetError):
            head = b""
        assert len(head) == 9, f"{lang}: hung up on a request without an id"
        body = conn.recv(struct.unpack(">Q", head[1:])[0], socketlib.MSG_WAITALL)
        assert body[:4] == b"\x80\x00\x00\x07", body
        assert pb.Ack.FromString(body[4:]).status == pb.Ack.ACK
    finally:
        w.stop()
        if conn is not None:
            conn.close()
        srv.close()


@pytest.mark.parametrize("lang", LANGS)
def test_client_sigterm_answers_then_exits_0(tmp_path, lang):
    """SIGTERM while a handler runs: the handler finishes, its answer reaches
    idemproxy, and the worker exits 0 (anything else is an error to Kubernetes).
    Three rounds: a lost last answer was a race."""
    build(lang)
    for i in range(3):
        fake, w, report, _ = raw_worker(lang, tmp_path, name=f"term{i}",
                                        WORKER_SLOW_KEYS="slow", WORKER_SLOW_MS=700)
        try:
            pid = worker_pid(w)
            ctx = fake.send(delivery("slow"))
            wait_for(lambda: w.proc.poll() is None, what="worker running")
            time.sleep(0.3)
            os.kill(pid, signal.SIGTERM)
            ack = fake.reply(ctx, 10)
            assert ack is not None and ack.status == pb.Ack.ACK, \
                f"{lang} round {i}: the answer in hand at SIGTERM was lost: {ack}"
            rc = w.proc.wait(20)
            assert rc == 0, f"{lang} round {i}: exit {rc}: {w.err.read_text(errors='replace')[-800:]}"
            assert [r["key"] for r in reported(report)] == ["slow"]
        finally:
            if w.proc.poll() is None:
                w.stop()
            fake.close()


@pytest.mark.parametrize("lang", LANGS)
def test_client_skips_deliveries_of_a_lost_connection(tmp_path, lang):
    """idemproxy restarts while deliveries wait in the worker's socket: their
    answers could never be sent, so the worker must not run them, and must be
    back on the new idemproxy at once."""
    fake, w, report, ep = raw_worker(lang, tmp_path, WORKER_DELAY_MS=100, WORKER_CONCURRENCY=1)
    try:
        for i in range(40):
            fake.send(delivery(f"old-{i}", entry_id=f"1700000000000-{i}"))
        wait_for(lambda: len(reported(report)) >= 1, what="the first delivery handled")
        closed_ms = time.time() * 1000
        fake.close()    # idemproxy goes away with 39 deliveries unanswered
        fake = FakeProxy(ep)
        t0 = time.monotonic()
        ack = fake.ask(delivery("new"), timeout=15)
        took = time.monotonic() - t0
        assert ack is not None and ack.status == pb.Ack.ACK, f"{lang}: nothing from the new idemproxy"
        # Handlers started after the close: one taken just before the worker
        # noticed may run (its answer is lost), one more may be in the pipe. (Counting every old
        # one raced with a loaded machine, which ran more while still connected.)
        old = [r["key"] for r in reported(report)
               if r["key"].startswith("old-") and r["start_ms"] > closed_ms + 50]
        assert len(old) <= 2, f"{lang}: ran {len(old)} handlers for a connection that was gone"
        assert took < 3, f"{lang}: back on the new idemproxy only after {took:.1f} s"
    finally:
        w.stop()
        fake.close()


@pytest.mark.parametrize("lang", LANGS)
def test_client_sigterm_mid_run_loses_no_ack(env, lang):
    """SIGTERM while idemproxy keeps the worker busy: every delivery the worker
    answered reaches idemproxy (its key is marked done), none is left for
    another worker to run again, and the worker exits 0."""
    build(lang)
    r = env.r
    ep = env.endpoint()
    w = ExampleWorker(lang, ep, env.tmp, WORKER_DELAY_MS=20)
    try:
        pid = worker_pid(w)
        env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId"}], endpoint=ep, max_inflight=8)
        keys = [f"e{i}" for i in range(300)]
        for k in keys:
            r.xadd("room", {"payload": json.dumps({"eventId": k})})
        wait_for(lambda: len(w.lines()) >= 20, timeout=60, what=f"{lang} worker busy")
        os.kill(pid, signal.SIGTERM)
        rc = w.proc.wait(20)
    finally:
        if w.proc.poll() is None:
            w.stop()
    assert rc == 0, f"{lang}: exit {rc}: {w.err.read_text(errors='replace')[-800:]}"
    answered = {LINE.match(l).group(1) for l in w.lines()}

    def undone():    # idemproxy writes the done marks of the last acks a moment later
        return {k for k in answered if (r.get("idem:" + k) or "")[:1] != "D"}
    try:
        wait_for(lambda: not undone(), timeout=10, what="done marks of every answered key")
    except AssertionError:
        pass
    assert undone() == set(), f"{lang}: answered, but the ack never arrived: {sorted(undone())}"
    done = {k for k in keys if (r.get("idem:" + k) or "")[:1] == "D"}
    assert done - answered == set()


@pytest.mark.parametrize("lang", LANGS)
def test_client_last_answer_reaches_idemproxy_before_exit(env, lang):
    """The answer a worker sends just before it exits must reach idemproxy.
    nanomsg 1.1.5 drops a reply it has read but not yet handed to idemproxy
    when the connection then closes (at once if deliveries are still unread in
    the worker's socket: the close resets the connection). A worker that
    answers and closes in the same instant loses that answer every time, and
    the handler runs again elsewhere; so every client waits a moment after its
    last answer before it closes. Three SIGTERMs, each during a slow handler
    with deliveries waiting behind it: every answered key is done."""
    build(lang)
    r = env.r
    for i in range(3):   # a daemon each: the deliveries the last worker left wait out their ack timeout
        ep = env.endpoint()
        p = env.proxy([{"stream": f"room{i}", "group": "g", "consumer": "c1", "payload_field": "payload",
                        "key": "#event.eventId"}], endpoint=ep, max_inflight=8)
        w = ExampleWorker(lang, ep, env.tmp, WORKER_SLOW_KEYS=f"slow-{i}", WORKER_SLOW_MS=800)
        try:
            pid = worker_pid(w)
            wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, timeout=60,
                     what=f"{lang} worker {i} connected")
            r.xadd(f"room{i}", {"payload": json.dumps({"eventId": f"slow-{i}"})})
            for k in range(6):
                r.xadd(f"room{i}", {"payload": json.dumps({"eventId": f"after-{i}-{k}"})})
            time.sleep(0.4)              # slow-i in the handler, the others in the socket
            os.kill(pid, signal.SIGTERM)
            rc = w.proc.wait(20)
        finally:
            if w.proc.poll() is None:
                w.stop()
        assert rc == 0, f"{lang}: exit {rc}: {w.err.read_text(errors='replace')[-800:]}"
        answered = {LINE.match(l).group(1) for l in w.lines()}
        assert f"slow-{i}" in answered, f"{lang} round {i}: the slow key was not handled: {answered}"
        time.sleep(1.0)   # idemproxy writes the done marks of the last acks
        lost = sorted(k for k in answered if (r.get("idem:" + k) or "")[:1] != "D")
        assert not lost, f"{lang} round {i}: answered, but the answer never reached idemproxy: {lost}"
        w.out.unlink()


def test_clients_hang_up_on_a_silent_peer(tmp_path):
    """A peer that accepts the connection and never sends its SP header is hung
    up on after one documented timeout (10 s, NNG's fixed value; the C client
    is bound to nanomsg's fixed 1 s), so a wedged endpoint does not hold a
    worker: every language at once, each against its own silent listener."""
    import socket as socketlib
    import threading
    for lang in LANGS:
        build(lang)
    took, workers = {}, []

    def listen(lang):
        path = tmp_path / f"{lang}-silent.sock"
        srv = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        srv.bind(str(path))
        srv.listen(4)
        srv.settimeout(60)
        workers.append(ExampleWorker(lang, f"ipc://{path}", tmp_path))
        conn, _ = srv.accept()
        t0 = time.monotonic()
        conn.settimeout(20)
        try:
            while conn.recv(64):   # the worker's own header, then nothing until it hangs up
                pass
            took[lang] = time.monotonic() - t0
        except OSError:            # socket.timeout: it never hung up
            took[lang] = float("inf")
        finally:
            conn.close()
            srv.close()

    threads = [threading.Thread(target=listen, args=(lang,)) for lang in LANGS]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
    finally:
        for w in workers:
            w.stop()
    assert set(took) == set(LANGS), took
    slow = {lang: round(s, 1) for lang, s in took.items() if s > 13}
    assert not slow, f"waited this long (s) on a peer that never sent its SP header: {slow}"


@pytest.mark.parametrize("lang", ["go", "node", "python", "c", "rust"])   # Java: its JVM's exit took 0.66 s once
def test_client_exits_promptly_after_its_last_answer(env, lang):
    """SIGTERM during a handler, deliveries waiting behind it: once the last
    answer is sent and nothing is in flight, the worker is gone within 0.5 s
    (a rolling update waits on it). Node waited 1 s more: it paused its socket
    and never read idemproxy's close behind the unread deliveries."""
    build(lang)
    ep = env.endpoint()
    p = env.proxy([{"stream": "quit", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId"}], endpoint=ep, max_inflight=8)
    report = env.tmp / f"{lang}-quit-report.jsonl"
    w = ExampleWorker(lang, ep, env.tmp, WORKER_REPORT=report, WORKER_SLOW_KEYS="slow", WORKER_SLOW_MS=600)
    try:
        pid = worker_pid(w)
        wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, timeout=60,
                 what=f"{lang} worker connected")
        env.r.xadd("quit", {"payload": json.dumps({"eventId": "slow"})})
        for k in range(6):
            env.r.xadd("quit", {"payload": json.dumps({"eventId": f"after-{k}"})})
        wait_for(lambda: p.metrics().get("idemproxy_inflight", 0) >= 1, what="slow delivered")
        time.sleep(0.2)   # slow in the handler, the others in the socket
        os.kill(pid, signal.SIGTERM)
        gone = None
        while gone is None:
            try:
                if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                    gone = time.time()
            except (FileNotFoundError, ProcessLookupError):   # reaped between open and read
                gone = time.time()
            time.sleep(0.002)
        assert w.proc.wait(10) == 0, f"{lang}: {w.err.read_text(errors='replace')[-800:]}"
        last = max(r["end_ms"] for r in reported(report)) / 1000
        assert gone - last < 0.5, f"{lang}: exited {gone - last:.2f} s after its last answer"
        wait_for(lambda: (env.r.get("idem:slow") or "")[:1] == "D", timeout=10, what="the last answer done")
    finally:
        if w.proc.poll() is None:
            w.stop()


def wakeups(pid):
    """Voluntary context switches of all of a process's threads: how often
    they went to sleep, so how often they were woken."""
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{t}/status"):
                if line.startswith("voluntary_ctxt_switches:"):
                    n += int(line.split()[1])
        except FileNotFoundError:
            pass
    return n


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("lang", LANGS)
def test_client_idle_worker_costs_next_to_no_cpu(env, lang):
    """Issue 32's probe: Python's Worker polled in every handler thread with a
    200 ms timeout, 16-33 % of a core at concurrency 256 with no traffic (the
    others 0-3 %). Each example worker at concurrency 256, connected, one
    delivery answered, then 3 s without traffic: under 5 % of a core and
    under 100 wake-ups a second."""
    build(lang)
    ep = env.endpoint()
    w = ExampleWorker(lang, ep, env.tmp, WORKER_CONCURRENCY=256)
    try:
        pid = worker_pid(w)
        env.proxy([{"stream": "idle", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId"}], endpoint=ep)
        env.r.xadd("idle", {"payload": json.dumps({"eventId": "warm"})})
        wait_for(lambda: (env.r.get("idem:warm") or "")[:1] == "D", timeout=60, what=f"{lang}: warm done")
        time.sleep(1.0)   # a runtime's start-up work (a JIT, a GC) settles
        cpu0, wake0, wall0 = cpu_seconds(pid), wakeups(pid), time.monotonic()
        time.sleep(3)
        cpu, wake, wall = cpu_seconds(pid) - cpu0, wakeups(pid) - wake0, time.monotonic() - wall0
        print(f"{lang}: {cpu:.3f} s of CPU, {wake / wall:.0f} wake-ups/s idle at concurrency 256")
        assert cpu < 0.05 * wall, f"{lang}: {cpu:.2f} s of CPU in {wall:.1f} s idle at concurrency 256"
        # Wake-ups count what CPU time hides on a fast machine: Rust's 256
        # handler threads each polled their stop flag 5 times a second
        # (3,500/s), Go's 256 receives a 100 ms deadline (126/s, and 7 % of a
        # core on a loaded machine); now C 1, Node 0, Python 2, Rust 5, Go 9,
        # Java 29.
        assert wake < 100 * wall, f"{lang}: {wake / wall:.0f} wake-ups/s idle at concurrency 256"
    finally:
        w.stop()


@pytest.mark.parametrize("lang", ["go", "node", "python", "c", "java", "rust"])
def test_client_retry_after_is_honoured(env, lang):
    """Protocol 1.1: a RETRY that asks for a later retry (WORKER_RETRY_AFTER_MS,
    the client's RetryAfter) comes again no earlier than that, not after the
    stream's 50 ms backoff, and the second attempt is acked."""
    build(lang)
    ep = env.endpoint()
    report = env.tmp / f"{lang}-later-report.jsonl"
    w = ExampleWorker(lang, ep, env.tmp, WORKER_REPORT=report, WORKER_RETRY_KEYS="later",
                      WORKER_RETRY_AFTER_MS=1500)
    try:
        env.proxy([{"stream": "later", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId", "retry_backoff_ms": 50}], endpoint=ep)
        env.r.xadd("later", {"payload": json.dumps({"eventId": "later"})})
        wait_for(lambda: (env.r.get("idem:later") or "")[:1] == "D", timeout=30, what="later done")
        rows = [r for r in reported(report) if r["key"] == "later"]
        assert [(r["attempt"], r["status"]) for r in rows] == [(1, "retry"), (2, "ack")], rows
        gap = rows[1]["start_ms"] - rows[0]["end_ms"]
        assert 1500 <= gap < 6000, f"{lang}: attempt 2 came {gap} ms after the RETRY asking for 1500 ms"
    finally:
        w.stop()


@pytest.mark.parametrize("lang", ["go", "node", "python", "c", "java", "rust"])
def test_client_span_continues_the_producers_trace(env, lang):
    """Protocol 1.1 with tracing on, a real OTLP receiver: producer span ->
    idemproxy's entry span -> its delivery span -> the worker's handler span
    (the client's OpenTelemetry support; the example reports its span's ids).
    C hands over the strings only: its example starts the handler's span from
    Delivery.traceparent itself, as an application's tracer would."""
    from test_tracing import PRODUCER_SPAN, PRODUCER_TRACE, TRACEPARENT, Collector
    build(lang)
    col = Collector()
    ep = env.endpoint()
    report = env.tmp / f"{lang}-traced-report.jsonl"
    w = ExampleWorker(lang, ep, env.tmp, WORKER_REPORT=report)
    try:
        env.proxy([{"stream": "traced", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.id"}], endpoint=ep, tracing={"otlp_endpoint": col.url})
        env.r.xadd("traced", {"payload": json.dumps({"id": "t-1"}), "traceparent": TRACEPARENT,
                              "tracestate": "vendor=abc"})
        wait_for(lambda: (env.r.get("idem:t-1") or "")[:1] == "D", timeout=30, what="t-1 done")
        wait_for(lambda: any(s["kind"] == 4 for _, s in col.spans()), 15, "the delivery span exported")
        entry = next(s for _, s in col.spans() if s["kind"] == 5)
        send = next(s for _, s in col.spans() if s["kind"] == 4)
        assert entry["traceId"] == PRODUCER_TRACE and entry["parentSpanId"] == PRODUCER_SPAN
        assert send["parentSpanId"] == entry["spanId"]
        [row] = reported(report)
        assert row["traceparent"] == f"00-{PRODUCER_TRACE}-{send['spanId']}-01", row
        assert row["tracestate"] == "vendor=abc", row
        assert (row["span_trace_id"], row["span_parent_id"]) == (PRODUCER_TRACE, send["spanId"]), \
            f"{lang}: the handler's span is not a child of idemproxy's delivery span: {row}"
    finally:
        w.stop()
        col.close()


@pytest.mark.parametrize("lang", ["go", "node", "python", "java", "rust"])
def test_client_refuses_an_ipc_frame_that_is_not_a_message(tmp_path, lang):
    """nanomsg's ipc frames start with a type byte, 1 = message. A frame of
    type 2 is not a delivery: the worker hangs up without running its handler,
    dials again and serves the type-1 frames of the new connection (Go took it
    as a message). C's libnanomsg asserts on it instead (its Known limits)."""
    import socket as socketlib
    import struct
    build(lang)
    path = tmp_path / f"{lang}-frames.sock"
    srv = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    srv.settimeout(60)
    report = tmp_path / f"{lang}-frames-report.jsonl"
    w = ExampleWorker(lang, f"ipc://{path}", tmp_path, WORKER_REPORT=report)

    def accept():
        conn, _ = srv.accept()
        conn.settimeout(10)
        conn.sendall(b"\x00SP\x00\x00\x30\x00\x00")   # REQ
        head = b""
        while len(head) < 8:
            head += conn.recv(8 - len(head))
        assert head == b"\x00SP\x00\x00\x31\x00\x00", head   # REP
        return conn

    def frame(kind, key):
        msg = b"\x80\x00\x00\x01" + delivery(key)
        return bytes([kind]) + struct.pack(">Q", len(msg)) + msg

    try:
        conn = accept()
        conn.sendall(frame(2, "type-2"))
        try:
            got = conn.recv(64)
        except ConnectionResetError:
            got = b""
        assert got == b"", f"{lang}: a frame of type 2 was answered: {got!r}"
        conn.close()
        conn = accept()                                # it dials again
        conn.sendall(frame(1, "type-1"))
        head = conn.recv(9)
        assert head[:1] == b"\x01", f"{lang}: no answer to a frame of type 1: {head!r}"
        conn.close()
        assert [r["key"] for r in reported(report)] == ["type-1"]
    finally:
        w.stop()
        srv.close()


class RawSpPeer:
    """idemproxy's side of an ipc connection written byte by byte (the SP RFCs), so a
    case can send what pynng never would: a bad header, a request without an id."""

    def __init__(self, path, header=b"\x00SP\x00\x00\x30\x00\x00"):
        import socket as socketlib
        self.srv = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(4)
        self.srv.settimeout(60)
        self.header = header
        self.conn = None

    def accept(self):
        self.conn, _ = self.srv.accept()
        self.conn.settimeout(10)
        self.conn.sendall(self.header)
        return self.read(8)          # the worker's own header

    def read(self, n):
        b = b""
        while len(b) < n:
            got = self.conn.recv(n - len(b))
            if not got:
                raise EOFError("the worker closed the connection")
            b += got
        return b

    def request(self, body, *words):
        msg = b"".join(w.to_bytes(4, "big") for w in words) + body
        self.conn.sendall(b"\x01" + len(msg).to_bytes(8, "big") + msg)

    def reply(self):
        """(backtrace word, Ack) of the next reply."""
        hdr = self.read(9)
        msg = self.read(int.from_bytes(hdr[1:], "big"))
        return int.from_bytes(msg[:4], "big"), pb.Ack.FromString(msg[4:])

    def hung_up(self, timeout=15):
        self.conn.settimeout(timeout)
        try:
            return self.conn.recv(1) == b""
        except ConnectionResetError:
            return True
        except OSError:              # a timeout: still connected
            return False

    def close(self):
        if self.conn:
            self.conn.close()
        self.srv.close()


@pytest.mark.parametrize("lang", ["c", "java", "rust", "python"])
def test_client_ignores_a_request_without_an_id_and_an_overlong_backtrace(tmp_path, lang):
    """A request with no word with the top bit set, or whose request id comes after
    more than 8 backtrace words (the SP limit), is ignored without a reply, and the
    connection stays: the next request is answered on it (issue 32's probe)."""
    build(lang)
    peer = RawSpPeer(tmp_path / f"{lang}-noid.sock")
    w = ExampleWorker(lang, f"ipc://{tmp_path}/{lang}-noid.sock", tmp_path)
    try:
        assert peer.accept()[:6] == b"\x00SP\x00\x00\x31"
        peer.request(b"", 5, 6)                                        # no request id
        peer.request(delivery("too-far"), 1, 2, 3, 4, 5, 6, 7, 8, 0x80000009)
        peer.request(delivery("after"), 0x8000000a)
        word, ack = peer.reply()
        assert (word, ack.status) == (0x8000000a, pb.Ack.ACK), (lang, hex(word), ack)
        assert not peer.hung_up(timeout=0.5), f"{lang} hung up"
        assert w.lines() == ["after attempt=1"], (lang, w.lines())
    finally:
        w.stop()
        peer.close()


@pytest.mark.parametrize("lang", ["java", "rust"])   # C: libnanomsg 1.1.5 does not check them
def test_client_refuses_a_header_with_reserved_bytes_set(tmp_path, lang):
    """An SP header whose reserved bytes are not zero is not a REQ peer's: the
    worker hangs up (and dials again) instead of taking deliveries from it."""
    build(lang)
    peer = RawSpPeer(tmp_path / f"{lang}-rsv.sock", header=b"\x00SP\x00\x00\x30\x00\x01")
    w = ExampleWorker(lang, f"ipc://{tmp_path}/{lang}-rsv.sock", tmp_path)
    try:
        try:
            peer.accept()
            peer.request(delivery("k"), 0x80000001)
            hung = peer.hung_up()
        except (EOFError, BrokenPipeError, ConnectionResetError):   # it hung up at once
            hung = True
        assert hung, f"{lang} kept a peer with reserved header bytes set"
        assert w.lines() == [], (lang, w.lines())
    finally:
        w.stop()
        peer.close()


# Issue 32's probe: a handler ran 0.7 s past its deadline while attempt 2 of the
# key ran elsewhere, because four clients handed over only the epoch number. Each
# language's deadline form, as its README promises it: Go's context, Node's
# AbortSignal, Java's interrupt and an AsyncWorker's cancellation stop or signal
# the handler at the deadline ("signal"); a thread cannot be stopped in Python,
# Rust or C, so the handler bounds its own work with what the client hands it
# (d.remaining(), d.deadline, idemproxy_delivery_remaining_ms: "deadline").
DEADLINE_FORMS = [("c", {}, "deadline"), ("go", {}, "signal"), ("java", {}, "signal"),
                  ("node", {}, "signal"), ("python", {}, "deadline"),
                  ("python", {"WORKER_ASYNC": 1}, "signal"), ("rust", {}, "deadline")]


@pytest.mark.parametrize("lang, knobs, stopped", DEADLINE_FORMS,
                         ids=[l + ("-async" if k else "") for l, k, _ in DEADLINE_FORMS])
def test_client_handler_stops_at_its_deadline(tmp_path, lang, knobs, stopped):
    """A delivery due in 2.5 s whose handler would work 8 s: the handler sees the
    time left at its start (its language's form, reported as remaining_ms), is
    stopped or stops itself at the deadline, and RETRY comes then, not 8 s on."""
    fake, w, report, _ = raw_worker(lang, tmp_path, WORKER_DEADLINE_KEYS="late", WORKER_SLOW_MS=8000,
                                    **knobs)
    try:
        assert fake.ask(delivery("warm")).status == pb.Ack.ACK   # a runtime's first call is slow
        deadline = int(time.time() * 1000) + 2500
        t0 = time.monotonic()
        ack = fake.ask(delivery("late", deadline_ms=deadline), timeout=12)
        took = time.monotonic() - t0
        assert ack is not None and ack.status == pb.Ack.RETRY, f"{lang}: {ack}"
        assert took < 5, f"{lang}: answered {took:.1f} s after a delivery due in 2.5 s"
        [row] = [r for r in reported(report) if r["key"] == "late"]
        assert 0 < row["remaining_ms"] <= 2500, f"{lang}: the handler saw {row['remaining_ms']} ms left"
        assert row["stopped"] == stopped, f"{lang}: {row}"
        assert deadline - 50 <= row["end_ms"] < deadline + 2000, \
            f"{lang}: the handler stopped {row['end_ms'] - deadline} ms after its deadline"
        [warm] = [r for r in reported(report) if r["key"] == "warm"]
        assert warm["stopped"] == "" and 25000 < warm["remaining_ms"] <= 30000, warm
    finally:
        w.stop()
        fake.close()


@pytest.mark.parametrize("lang, knobs", [("python", {"WORKER_ASYNC": 1})], ids=["python-async"])
def test_client_cancelled_handler_is_retried_and_the_worker_goes_on(tmp_path, lang, knobs):
    """Issue 32's probe: one AsyncWorker handler raising asyncio.CancelledError
    killed the worker (exit 1, every other handler in flight cancelled and never
    answered). It is a RETRY; the handler beside it is answered; the worker goes on."""
    fake, w, report, _ = raw_worker(lang, tmp_path, WORKER_CANCEL_KEYS="cancel", WORKER_SLOW_KEYS="slow",
                                    WORKER_SLOW_MS=800, WORKER_CONCURRENCY=2, **knobs)
    try:
        slow = fake.send(delivery("slow", entry_id="1700000000000-1"))
        time.sleep(0.2)
        cancel = fake.ask(delivery("cancel", entry_id="1700000000000-2"))
        assert cancel is not None and cancel.status == pb.Ack.RETRY and cancel.reason, f"{lang}: {cancel}"
        ack = fake.reply(slow, 10)
        assert ack is not None and ack.status == pb.Ack.ACK, f"{lang}: the handler beside it: {ack}"
        nxt = fake.ask(delivery("next", entry_id="1700000000000-3"))
        assert nxt is not None and nxt.status == pb.Ack.ACK, \
            f"{lang}: the worker did not go on: {w.err.read_text(errors='replace')[-800:]}"
        assert w.proc.poll() is None
    finally:
        w.stop()
        fake.close()


@pytest.mark.parametrize("lang", ["python"])
def test_client_handler_exit_is_answered_and_said(tmp_path, lang):
    """Issue 32's probe: a Worker handler raising SystemExit stopped the worker
    silently (exit 0, no log, that delivery and every later one left to the ack
    timeout). sys.exit(3) in a handler: its delivery is answered RETRY, the one
    beside it is finished and answered, an ERROR names the key, the worker exits 3."""
    fake, w, report, _ = raw_worker(lang, tmp_path, WORKER_EXIT_KEYS="exit", WORKER_SLOW_KEYS="slow",
                                    WORKER_SLOW_MS=800, WORKER_CONCURRENCY=2)
    try:
        slow = fake.send(delivery("slow", entry_id="1700000000000-1"))
        time.sleep(0.2)
        ex = fake.ask(delivery("exit", entry_id="1700000000000-2"))
        assert ex is not None and ex.status == pb.Ack.RETRY and "SystemExit" in ex.reason, f"{lang}: {ex}"
        ack = fake.reply(slow, 10)
        assert ack is not None and ack.status == pb.Ack.ACK, f"{lang}: the handler beside it: {ack}"
        rc = w.proc.wait(20)
        err = w.err.read_text(errors="replace")
        assert rc != 0 and "Error 3" in err, f"{lang}: exit {rc}: {err[-800:]}"   # make says the worker's 3
        assert "key=exit" in err and "SystemExit" in err, f"{lang}: nothing said: {err[-800:]}"
    finally:
        if w.proc.poll() is None:
            w.stop()
        fake.close()


@pytest.mark.parametrize("lang", LANGS)
def test_client_says_it_is_still_dialing_and_where(tmp_path, lang):
    """Issue 33: a worker pointed at a wrong endpoint (a typo in the socket path) said
    nothing for ever, and in a pod looked healthy. Each example worker, run as a user
    runs it, says in its log that it is still dialing and where, and says it again
    (IDEMPROXY_DIAL_LOG_MS=300: the first after 0.3 s, the next 1.8 s later)."""
    build(lang)
    endpoint = f"ipc://{tmp_path}/typo/app.sock"
    w = ExampleWorker(lang, endpoint, tmp_path, IDEMPROXY_DIAL_LOG_MS=300)
    want = f"still dialing {endpoint}: no connection to idemproxy for "
    said = lambda: [l for l in w.err.read_text(errors="replace").splitlines() if want in l]  # noqa: E731
    try:
        deadline = time.time() + 60
        while len(said()) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert len(said()) >= 2, f"{lang} said: {w.err.read_text(errors='replace')[-1500:]}"
        assert w.proc.poll() is None, f"{lang} exited: {w.err.read_text(errors='replace')[-800:]}"
        assert w.lines() == []
    finally:
        w.stop()
