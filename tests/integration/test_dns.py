"""The Redis name is resolved again at every (re)connect, and every address it
gives is tried, IPv6 and IPv4: a primary endpoint whose address moves (a managed
Redis failing over) is followed after a reconnect. The names live in /etc/hosts
for the test (it runs as root in CI); only this test's lines are added, and they
are removed again whatever happens."""
import os
import subprocess

import pytest
import redis as redis_lib

from pxtest import Proxy, free_port, publish, wait_for

HOSTS = "/etc/hosts"
MARK = "# idemproxy test_dns"
STREAM = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
          "key": "#event.eventId"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.access(HOSTS, os.W_OK),
                                reason="rewrites /etc/hosts: needs root (CI runs as root)")


class Hosts:
    """Names of this test in /etc/hosts: set(name, addrs) replaces them."""

    def __init__(self):
        self.names = set()

    def _write(self, lines):
        # In place (not a rename): /etc/hosts may be a bind mount.
        with open(HOSTS, "r+") as f:
            f.seek(0)
            f.write("".join(lines))
            f.truncate()

    def _others(self):
        with open(HOSTS) as f:
            return [ln for ln in f if not ln.rstrip().endswith(MARK)]

    def set(self, name, *addrs):
        self.names.add(name)
        lines = [ln for ln in self._others() if f" {name} " not in ln]
        lines += [f"{a} {name} {MARK}\n" for a in addrs]
        self._write(lines)

    def restore(self):
        self._write(self._others())


@pytest.fixture
def hosts():
    h = Hosts()
    try:
        yield h
    finally:
        h.restore()


def redis_on(tmp, addr, port):
    d = tmp / f"redis-{addr.replace(':', '_')}"
    d.mkdir()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", addr, "--dir", str(d),
                          "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = redis_lib.Redis(host=addr, port=port, decode_responses=True)

    def up():
        try:
            return c.ping()
        except redis_lib.exceptions.ConnectionError:
            return False
    wait_for(up, what=f"redis-server on {addr}")
    return p, c


def proxy_on(env, url, **kw):
    p = Proxy(env.tmp, f"proxy{len(env.proxies) + 1}", url, env.endpoint(), [STREAM], **kw)
    env.proxies.append(p)
    return p.start()


def test_a_moved_address_is_followed_after_a_reconnect(env, hosts, tmp_path):
    """The name points at Redis A; the proxy delivers from A. The name moves to
    Redis B (another address, the same port) and A dies: after the reconnect
    the proxy is on B and delivers what B's stream holds."""
    port = env.redis.port                       # A: 127.0.0.1:port (the env's Redis)
    b_proc, b = redis_on(tmp_path, "127.0.0.2", port)
    try:
        hosts.set("redis-primary.idemproxy.test", "127.0.0.1")
        p = proxy_on(env, f"redis://redis-primary.idemproxy.test:{port}")
        w = env.worker(p.endpoint)
        publish(env.r, "room", [{"eventId": "on-a"}])
        wait_for(lambda: w.keys() == ["on-a"], timeout=15, what="delivered from A")
        wait_for(lambda: (env.r.get("idem:on-a") or "")[:1] == "D", what="done on A")

        hosts.set("redis-primary.idemproxy.test", "127.0.0.2")
        env.redis.stop()                        # the failover: A is gone
        p.wait_log("link lost", timeout=15)
        publish(b, "room", [{"eventId": "on-b"}])
        wait_for(lambda: w.keys() == ["on-a", "on-b"], timeout=30, what="delivered from B")
        wait_for(lambda: (b.get("idem:on-b") or "")[:1] == "D", what="done written on B")
        assert b.get("idem:on-a") is None       # B never saw A's key: the proxy really moved
        assert p.get("/readyz")[0] == 200
    finally:
        b_proc.kill()
        b_proc.wait()


def test_every_address_is_tried_ipv6_and_ipv4(env, hosts, tmp_path):
    """A name with an IPv6 and an IPv4 address, Redis on only one of them: the
    other is tried after the first fails, whichever comes first; and an
    IPv6-only Redis is reached over IPv6."""
    port = env.redis.port                       # listening on 127.0.0.1 only
    hosts.set("dual.idemproxy.test", "::1", "127.0.0.1")
    p = proxy_on(env, f"redis://dual.idemproxy.test:{port}")
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "dual"}])
    wait_for(lambda: w.keys() == ["dual"], timeout=15, what="delivered over IPv4")
    assert "link lost" not in p.log_text()      # the refused address cost no reconnect

    v6_port = free_port()
    v6_proc, v6 = redis_on(tmp_path, "::1", v6_port)
    try:
        hosts.set("v6.idemproxy.test", "::1")
        p6 = proxy_on(env, f"redis://v6.idemproxy.test:{v6_port}")
        w6 = env.worker(p6.endpoint)
        publish(v6, "room", [{"eventId": "six"}])
        wait_for(lambda: w6.keys() == ["six"], timeout=15, what="delivered over IPv6")
        addrs = [c.get("addr", "") for c in v6.client_list()]
        assert any(a.startswith("[::1]:") or a.startswith("::1:") for a in addrs), addrs
    finally:
        v6_proc.kill()
        v6_proc.wait()


def test_an_unknown_name_is_one_line_and_retried(env, hosts):
    """A name that does not resolve (yet): the line says so, and once it does the
    proxy connects without a restart."""
    port = env.redis.port
    p = proxy_on(env, f"redis://late.idemproxy.test:{port}")
    p.wait_log("cannot resolve late.idemproxy.test", timeout=15)
    assert p.get("/readyz")[0] != 200
    hosts.set("late.idemproxy.test", "127.0.0.1")
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "late"}])
    wait_for(lambda: w.keys() == ["late"], timeout=30, what="delivered once the name resolves")
