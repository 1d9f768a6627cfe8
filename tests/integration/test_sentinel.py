"""idemproxy behind Redis Sentinel (issue 16, docs/configuration.md redis.sentinel): a real
master, a replica and three sentinels (redis-server --sentinel) started in a
temp dir. The master is asked of the sentinels, ROLE is checked, +switch-master
is followed through a SENTINEL FAILOVER and a kill -9 under load; sentinel AUTH,
TLS to the sentinel and the master, and `check` of the block."""
import json
import socket
import subprocess
import threading
import time
from collections import Counter
from datetime import datetime

import pytest
import redis as redis_lib

from pxtest import BIN, SERVER, Env, Proxy, free_ports, pending, wait_for

MASTER = "mymaster"


def redis_proc(d, port, lines, sentinel=False):
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "redis.conf"
    conf.write_text("\n".join([f"port {port}", "bind 127.0.0.1", f"dir {d}", "save \"\"",
                               "appendonly no", *lines]) + "\n")
    cmd = [SERVER, str(conf)] + (["--sentinel"] if sentinel else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ping(port, password=None):
    try:
        return redis_lib.Redis(port=port, password=password, socket_timeout=1).ping()
    except redis_lib.exceptions.RedisError:
        return False


class Sentinels:
    """A master, one replica and 'n' sentinels monitoring them as MASTER
    (quorum 2, down after 1 s, failover timeout 3 s)."""

    def __init__(self, tmp, n=3, sentinel_pass=None):
        self.tmp = tmp
        ports = free_ports(2 + n)
        self.data_ports, self.sentinel_ports = ports[:2], ports[2:]
        self.procs = {}
        m, r = self.data_ports
        self.procs[m] = redis_proc(tmp / f"n{m}", m, [])
        self.procs[r] = redis_proc(tmp / f"n{r}", r, [f"replicaof 127.0.0.1 {m}"])
        for p in self.data_ports:
            wait_for(lambda p=p: ping(p), what=f"redis-server {p}")
        wait_for(lambda: self.client(r).info("replication")["master_link_status"] == "up",
                 what="the replica in sync")
        extra = [f"requirepass {sentinel_pass}"] if sentinel_pass else []
        for p in self.sentinel_ports:
            self.procs[p] = redis_proc(tmp / f"s{p}", p, [
                f"sentinel monitor {MASTER} 127.0.0.1 {m} 2",
                f"sentinel down-after-milliseconds {MASTER} 1000",
                f"sentinel failover-timeout {MASTER} 3000",
                *extra], sentinel=True)
        for p in self.sentinel_ports:
            wait_for(lambda p=p: ping(p, sentinel_pass), what=f"sentinel {p}")
        # Each sentinel knows the replica and the other sentinels before a failover can work.
        wait_for(lambda: all(self.known(p, sentinel_pass) for p in self.sentinel_ports),
                 timeout=15, what="the sentinels see the replica and each other")

    def known(self, port, password=None):
        s = redis_lib.Redis(port=port, password=password, decode_responses=True)
        info = s.execute_command("SENTINEL", "MASTER", MASTER)
        info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
        return int(info["num-slaves"]) >= 1 and int(info["num-other-sentinels"]) >= len(self.sentinel_ports) - 1

    def client(self, port):
        return redis_lib.Redis(port=port, decode_responses=True, socket_timeout=2)

    def master_port(self):
        """The master as the first live sentinel says."""
        for p in self.sentinel_ports:
            try:
                _, port = redis_lib.Redis(port=p, decode_responses=True).execute_command(
                    "SENTINEL", "get-master-addr-by-name", MASTER)
                return int(port)
            except redis_lib.exceptions.RedisError:
                continue
        raise AssertionError("no sentinel answers")

    def addrs(self):
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    def stop(self):
        for p in self.procs.values():
            p.kill()
            p.wait()


@pytest.fixture
def sentinels(tmp_path):
    s = Sentinels(tmp_path / "redis")
    yield s
    s.stop()


@pytest.fixture
def pair(tmp_path):
    """A master and its replica, no sentinel (a test's FakeSentinel names one)."""
    s = Sentinels(tmp_path / "redis", n=0)
    yield s
    s.stop()


def sentinel_block(addrs, **more):
    lines = [f"sentinel:\n    master_name: {more.pop('master_name', MASTER)}",
             f"    sentinels: [{', '.join(json.dumps(a) for a in addrs)}]"]
    lines += [f"    {k}: {v}" for k, v in more.items()]
    return "\n".join(lines)


class SentinelEnv(Env):
    def __init__(self, tmp, r, addrs, **more):
        self.tmp, self.r, self.addrs, self.more = tmp, r, addrs, more
        self.proxies, self.workers, self.n = [], [], 0

    def proxy(self, streams, endpoint=None, proc_env=None, **app):
        p = Proxy(self.tmp, f"proxy{len(self.proxies) + 1}", "redis://unused",
                  endpoint or self.endpoint(), streams, **app)
        p.config.write_text(p.config.read_text().replace(
            "url: redis://unused", sentinel_block(self.addrs, **self.more)))
        self.proxies.append(p)
        return p.start(**(proc_env or {}))


@pytest.fixture
def senv(tmp_path, sentinels):
    e = SentinelEnv(tmp_path, sentinels.client(sentinels.data_ports[0]), sentinels.addrs())
    yield e
    e.close()


# claim_idle_ms: at least 3 x redis.timeout_ms (1000 here; docs/configuration.md)
STREAM = {"stream": "room", "group": "g", "payload_field": "payload", "key": "#event.eventId",
          "claim_idle_ms": 3000}


def ready(p):
    return p.get("/readyz")[0] == 200


def xadd(r, keys):
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.xadd("room", {"payload": json.dumps({"eventId": k})})
    pipe.execute()


def test_events_go_through_the_master_the_sentinels_name(senv, sentinels):
    m = sentinels.data_ports[0]
    p = senv.proxy([STREAM])
    w = senv.worker(p.endpoint)
    wait_for(lambda: ready(p), timeout=15, what="ready")
    keys = [f"k{i}" for i in range(50)] * 2            # every key twice: dedup
    xadd(senv.r, keys)
    wait_for(lambda: sorted(w.keys()) == sorted(set(keys)) and pending(senv.r, "room", "g") == 0,
             timeout=20, what="every key delivered once and acked")
    assert Counter(w.keys()).most_common(1)[0][1] == 1
    assert f"says master {MASTER} is at 127.0.0.1:{m}" in p.log_text()
    # The operator commands find the master the same way.
    res = subprocess.run([str(BIN), "inspect", "-c", str(p.config), "--stream", "room", "--key",
                          "k0"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "state: done" in res.stdout


def connections_to(pid, ports):
    """Established TCP connections of process 'pid' to any of 'ports' (from
    /proc: its socket inodes matched against /proc/net/tcp)."""
    import os
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                c = line.split()
                if c[3] == "01" and c[9] in inodes and int(c[2].rsplit(":", 1)[1], 16) in ports:
                    n += 1
    return n


def test_one_set_of_sentinel_links_per_process(senv, sentinels):
    """The command link and each stream's reader follow the master, but the
    sentinels see one link each from the process, plus the one subscription:
    not a set per data link (3 streams: 16 links before, 4 now)."""
    streams = [dict(STREAM, stream=f"room{i}") for i in range(3)]
    p = senv.proxy(streams)
    w = senv.worker(p.endpoint)
    wait_for(lambda: ready(p), timeout=15, what="ready")
    for i in range(3):
        senv.r.xadd(f"room{i}", {"payload": json.dumps({"eventId": f"s{i}"})})
    wait_for(lambda: sorted(w.keys()) == ["s0", "s1", "s2"], timeout=15, what="each stream read")
    ports = set(sentinels.sentinel_ports)
    wait_for(lambda: connections_to(p.proc.pid, ports) == len(ports) + 1, timeout=10,
             what=f"{len(ports)} + 1 links to the sentinels "
                  f"(now {connections_to(p.proc.pid, ports)})")
    # and the data links, one per px_redis, all to the master
    assert connections_to(p.proc.pid, {sentinels.data_ports[0]}) == 4


class Producer(threading.Thread):
    """XADDs one new key every few ms to whatever the sentinels call the
    master, retrying a failed write (a failover in progress); 'sent' holds
    the keys whose XADD was answered OK."""

    def __init__(self, sentinels, rate_s=0.003):
        super().__init__(daemon=True)
        self.sentinels, self.rate_s = sentinels, rate_s
        self.sent, self.stop_flag, self.i = [], False, 0

    def run(self):
        r, port = None, None
        while not self.stop_flag:
            k = f"e{self.i}"
            try:
                # As a client that follows the sentinels would: the master they
                # name now (an old master takes writes until it is demoted).
                now = self.sentinels.master_port()
                if r is None or now != port:
                    r, port = self.sentinels.client(now), now
                r.xadd("room", {"payload": json.dumps({"eventId": k})})
                self.sent.append(k)
                self.i += 1
            except redis_lib.exceptions.RedisError:
                r = None
                time.sleep(0.05)
            time.sleep(self.rate_s)


def done_on(r, keys):
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.get("idem:" + k)
    return {k for k, v in zip(keys, pipe.execute()) if v is not None and not v.startswith("L:")}


def run_fault(senv, sentinels, fault, label):
    """A steady producer and worker; 'fault' mid-run; then the guarantee
    (docs/guarantee.md) against
    what the new master's stream holds: every key in it done, nothing pending,
    and a key delivered twice only if it was in flight at the fault."""
    old = sentinels.data_ports[0]
    p = senv.proxy([STREAM])
    w = senv.worker(p.endpoint)
    wait_for(lambda: ready(p), timeout=15, what="ready")
    prod = Producer(sentinels)
    prod.start()
    wait_for(lambda: len(w.keys()) >= 150, timeout=20, what="a steady flow")
    done_before = done_on(sentinels.client(old), list(set(w.keys())))
    fault()
    wait_for(lambda: sentinels.master_port() != old, timeout=20, what="a new master")
    new = sentinels.master_port()
    p.wait_log(f"master {MASTER} is now at 127.0.0.1:{new}", timeout=20)
    wait_for(lambda: ready(p), timeout=20, what="ready again")
    time.sleep(0.5)
    in_flight = set(w.keys()) - done_before
    n_at_switch = len(w.keys())
    wait_for(lambda: len(w.keys()) >= n_at_switch + 150, timeout=20, what="the flow going on")
    prod.stop_flag = True
    prod.join(5)
    r = sentinels.client(new)
    held = [json.loads(f["payload"])["eventId"] for _, f in r.xrange("room")]
    wait_for(lambda: pending(r, "room", "g") == 0 and done_on(r, held) == set(held),
             timeout=30, what="every key on the new master done, nothing pending")
    seen = Counter(w.keys())
    assert set(held) <= set(seen)
    twice = {k: c for k, c in seen.items() if c > 2 or (c == 2 and k not in in_flight)}
    assert not twice, f"delivered more often than the fault allows: {sorted(twice.items())[:10]}"
    lost = set(prod.sent) - set(held)
    print(f"\n{label}: written={len(prod.sent)} held by the new master={len(held)} "
          f"(lost in the failover: {len(lost)}) delivered={len(seen)} "
          f"twice={sum(1 for c in seen.values() if c > 1)} in-flight={len(in_flight)}")
    return p


def follow_s(p, new):
    """Seconds from the command link's +switch-master to 'new' to its next
    connect, from the log's timestamps."""
    lines = p.log_text().splitlines()
    at = lambda ln: datetime.fromisoformat(ln.split()[0].replace("Z", "+00:00")).timestamp()  # noqa: E731
    i = next(i for i, ln in enumerate(lines)
             if f"redis commands: +switch-master: master {MASTER} is now at 127.0.0.1:{new}" in ln)
    j = next(j for j in range(i, len(lines)) if "redis commands: connected" in lines[j])
    return at(lines[j]) - at(lines[i])


def test_sentinel_failover_is_followed(senv, sentinels):
    s0 = redis_lib.Redis(port=sentinels.sentinel_ports[0])
    p = run_fault(senv, sentinels, lambda: s0.execute_command("SENTINEL", "FAILOVER", MASTER),
                  "SENTINEL FAILOVER")
    # The link that was up on the old master was dropped by the switch itself
    # (without it, only a READONLY from the demoted master would move it).
    assert "link lost: the master switched (+switch-master)" in p.log_text()


def test_master_kill9_is_followed(senv, sentinels):
    old = sentinels.data_ports[0]

    def kill():
        sentinels.procs[old].kill()
        sentinels.procs[old].wait()
    p = run_fault(senv, sentinels, kill, "master kill -9")
    # The link was down, dialling the dead master with a grown backoff (up to
    # 5 s): the switch cuts that wait short.
    took = follow_s(p, sentinels.master_port())
    print(f"master kill -9: connected to the new master {took:.3f} s after +switch-master")
    assert took < 0.5


class FakeSentinel(threading.Thread):
    """A sentinel that names 'addr' as the master of every name (a stale or
    wrong answer): PING, AUTH, SENTINEL get-master-addr-by-name, SUBSCRIBE."""

    def __init__(self, addr):
        super().__init__(daemon=True)
        self.addr = addr
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        self.start()

    def run(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        buf = b""
        while True:
            try:
                data = c.recv(4096)
            except OSError:
                return
            if not data:
                return
            buf += data
            while True:
                cmd, buf = self.parse(buf)
                if cmd is None:
                    break
                verb = cmd[0].upper()
                if verb == b"SENTINEL":
                    h, p = self.addr
                    out = f"*2\r\n${len(h)}\r\n{h}\r\n${len(str(p))}\r\n{p}\r\n".encode()
                elif verb == b"SUBSCRIBE":
                    out = b"*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n"
                elif verb == b"PING":
                    out = b"+PONG\r\n"
                else:
                    out = b"+OK\r\n"
                c.sendall(out)

    @staticmethod
    def parse(buf):
        """One RESP array of bulk strings off 'buf', or (None, buf)."""
        if not buf.startswith(b"*") or b"\r\n" not in buf:
            return None, buf
        head, rest = buf.split(b"\r\n", 1)
        args = []
        for _ in range(int(head[1:])):
            if b"\r\n" not in rest:
                return None, buf
            ln, rest = rest.split(b"\r\n", 1)
            n = int(ln[1:])
            if len(rest) < n + 2:
                return None, buf
            args.append(rest[:n])
            rest = rest[n + 2:]
        return args, rest

    def close(self):
        self.srv.close()


def test_a_replica_named_as_master_is_refused(tmp_path, pair):
    sentinels = pair
    replica = sentinels.data_ports[1]
    # A writable replica: without the ROLE check, idemproxy's writes would land.
    sentinels.client(replica).config_set("replica-read-only", "no")
    fake = FakeSentinel(("127.0.0.1", replica))
    try:
        e = SentinelEnv(tmp_path, sentinels.client(replica), [f"127.0.0.1:{fake.port}"])
        try:
            p = e.proxy([STREAM])
            refused = f"127.0.0.1:{replica} is not the master (ROLE says slave)"
            wait_for(lambda: refused in p.log_text() or sentinels.client(replica).dbsize() > 0,
                     timeout=15, what="the refusal (or a write to the replica)")
            time.sleep(1.5)          # several tries: still refused, still not ready
            # Nothing was written to the replica.
            assert sentinels.client(replica).dbsize() == 0
            assert not ready(p)
            assert p.log_text().count("is not the master (ROLE says slave)") == 1   # one line
            # Asked again at every try; said once (per link) while the answer stays the same.
            assert p.log_text().count(f"redis commands: sentinel 127.0.0.1:{fake.port} says "
                                      f"master {MASTER} is at 127.0.0.1:{replica}") == 1
            assert p.log_text().count("redis commands: link lost: not the master (ROLE)") >= 2
        finally:
            e.close()
    finally:
        fake.close()


def test_sentinel_auth(tmp_path):
    s = Sentinels(tmp_path / "redis", n=1, sentinel_pass="s3cret")
    try:
        good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
        good.write_text("s3cret\n")
        bad.write_text("wrong\n")
        r = s.client(s.data_ports[0])
        e = SentinelEnv(tmp_path, r, s.addrs(), password_file=str(bad))
        try:
            p = e.proxy([STREAM])
            p.wait_log("AUTH refused", timeout=15)
            time.sleep(1.0)
            assert not ready(p)
            lines = [ln for ln in p.log_text().splitlines() if "AUTH refused" in ln and "ERROR" in ln.upper()]
            assert len(lines) == 1, lines
            assert f"sentinel 127.0.0.1:{s.sentinel_ports[0]}" in lines[0]
            assert "redis.sentinel" in lines[0]
            e.more = {"password_file": str(good)}
            p2 = e.proxy([STREAM])
            w = e.worker(p2.endpoint)
            wait_for(lambda: ready(p2), timeout=15, what="ready with the right password")
            xadd(r, ["a", "b"])
            wait_for(lambda: sorted(w.keys()) == ["a", "b"], timeout=10, what="delivered")
        finally:
            e.close()
    finally:
        s.stop()


def check(tmp_path, redis_text, files=True):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("redis:\n  " + redis_text + "\nstreams:\n  - stream: s\n")
    return subprocess.run([str(BIN), "check", "-c", str(cfg), *(["--files"] if files else [])],
                          capture_output=True, text=True, timeout=10)


def test_check_sentinel_block(tmp_path):
    ok = check(tmp_path, sentinel_block(["127.0.0.1:26379", "[::1]:26380", "s3.example:26379"]))
    assert ok.returncode == 0, ok.stderr
    cases = [
        (sentinel_block(["127.0.0.1:26379"], master_name='""'), "redis.sentinel.master_name"),
        ("sentinel:\n    sentinels: [127.0.0.1:26379]", "redis.sentinel.master_name"),
        (sentinel_block([]), "redis.sentinel.sentinels"),
        ("sentinel:\n    master_name: m", "redis.sentinel.sentinels"),
        (sentinel_block(["127.0.0.1"]), "redis.sentinel.sentinels[0]"),
        (sentinel_block(["127.0.0.1:99999"]), "redis.sentinel.sentinels[0]"),
        (sentinel_block(["a:1"], port=1), "port"),
        ("url: redis://127.0.0.1:6379\n  " + sentinel_block(["a:1"]), "together with redis.url"),
        ("cluster: [a:1]\n  " + sentinel_block(["a:1"]), "together with redis.cluster"),
        ("sentinel: [a:1]", "redis.sentinel"),
        (sentinel_block(["a:1"], password_file=str(tmp_path / "missing")),
         "redis.sentinel.password_file"),
    ]
    for text, field in cases:
        res = check(tmp_path, text)
        assert res.returncode == 2, (text, res.stderr)
        assert field in res.stderr, (text, res.stderr)
    # without --files, check reads no password_file (docs/configuration.md, issue 33)
    res = check(tmp_path, sentinel_block(["a:1"], password_file=str(tmp_path / "missing")), files=False)
    assert res.returncode == 0, res.stderr


def test_readonly_from_a_demoted_master_makes_it_ask_again(tmp_path, pair):
    """No +switch-master comes (this sentinel publishes nothing): the master
    demoted under idemproxy answers READONLY, and that alone sends it back to
    the sentinels, which now name the new master."""
    sentinels = pair
    m, rep = sentinels.data_ports
    fake = FakeSentinel(("127.0.0.1", m))
    try:
        e = SentinelEnv(tmp_path, sentinels.client(m), [f"127.0.0.1:{fake.port}"])
        try:
            p = e.proxy([STREAM])
            w = e.worker(p.endpoint)
            wait_for(lambda: ready(p), timeout=15, what="ready")
            xadd(e.r, ["a", "b"])
            wait_for(lambda: sorted(w.keys()) == ["a", "b"], timeout=10, what="delivered")
            new = sentinels.client(rep)
            new.execute_command("REPLICAOF", "NO", "ONE")
            fake.addr = ("127.0.0.1", rep)
            e.r.execute_command("REPLICAOF", "127.0.0.1", str(rep))
            wait_for(lambda: e.r.info("replication")["master_link_status"] == "up", timeout=10,
                     what="the old master a replica")
            xadd(new, ["c", "d"])
            wait_for(lambda: sorted(w.keys()) == ["a", "b", "c", "d"], timeout=15,
                     what="delivered from the new master")
            wait_for(lambda: pending(new, "room", "g") == 0, timeout=10, what="nothing pending")
            assert f"127.0.0.1:{m} answered READONLY" in p.log_text()
            assert f"says master {MASTER} is at 127.0.0.1:{rep}" in p.log_text()
        finally:
            e.close()
    finally:
        fake.close()


def test_sentinel_and_master_over_tls(tmp_path):
    """redis.tls with redis.sentinel: the sentinel and the master it names are
    reached over TLS, verified against the test's CA (each keeps a plain port
    for the test's own client; idemproxy is given only TLS ones)."""
    from test_tls import make_ca, make_pair, tls_server_args
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_pair(pki, "ca", "server", "redis.test", "IP:127.0.0.1")
    m, m_tls, s, s_tls = free_ports(4)
    args = tls_server_args(pki, 0)[2:]             # the files, and no client certificate
    tls = [f"{args[i][2:]} {args[i + 1]}" for i in range(0, len(args), 2)]
    procs = [redis_proc(tmp_path / "m", m, [f"tls-port {m_tls}", *tls])]
    wait_for(lambda: ping(m), what="the master")
    procs.append(redis_proc(tmp_path / "s", s, [
        f"tls-port {s_tls}", *tls, "tls-replication yes",      # a sentinel dials masters with it
        f"sentinel monitor {MASTER} 127.0.0.1 {m_tls} 1"], sentinel=True))
    try:
        wait_for(lambda: ping(s), what="the sentinel")
        r = redis_lib.Redis(port=m, decode_responses=True)
        e = SentinelEnv(tmp_path, r, [f"127.0.0.1:{s_tls}"])
        try:
            p = e.proxy([STREAM], redis={"tls": f"{{ca_file: '{pki / 'ca.crt'}'}}"})
            w = e.worker(p.endpoint)
            wait_for(lambda: ready(p), timeout=15, what="ready over TLS")
            xadd(r, ["t1", "t2"])
            wait_for(lambda: sorted(w.keys()) == ["t1", "t2"] and pending(r, "room", "g") == 0,
                     timeout=10, what="delivered and acked")
            assert f"says master {MASTER} is at 127.0.0.1:{m_tls}" in p.log_text()
        finally:
            e.close()
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
