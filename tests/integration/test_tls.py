"""TLS to Redis (rediss://, redis.tls): a real redis-server with TLS (Debian's is
built with it), certificates made by the openssl CLI for each test: verified TLS,
mutual TLS, what is refused (another CA, another name, no client certificate)
with one line that names TLS and the reason, verify: false with a warning, and a
Redis Cluster over TLS (tls-cluster yes). Each node also keeps a plain port,
for the test's own client only."""
import json
import re
import subprocess
import time

import pytest

from pxtest import BIN, Env, Proxy, RedisCluster, RedisServer, free_port, pb, publish, wait_for

STREAM = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
          "key": "#event.eventId"}


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def make_pair(d, ca, name, cn, san=None):
    """A key and a certificate for 'cn' signed by 'ca' (with subjectAltName 'san')."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", f"{name}.crt", cwd=d)


@pytest.fixture
def pki(tmp_path):
    """ca (signs the server and the client), other-ca (signs nothing we use)."""
    d = tmp_path / "pki"
    d.mkdir()
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_pair(d, "ca", "server", "redis.test", "DNS:redis.test,DNS:localhost,IP:127.0.0.1")
    make_pair(d, "ca", "client", "idemproxy")
    return d


def tls_server_args(pki, tls_port, auth_clients="no"):
    return ["--tls-port", str(tls_port), "--tls-cert-file", str(pki / "server.crt"),
            "--tls-key-file", str(pki / "server.key"), "--tls-ca-cert-file", str(pki / "ca.crt"),
            "--tls-auth-clients", auth_clients]


class TLSRedis(RedisServer):
    """A redis-server with a TLS port beside its plain one (the test's client)."""

    def __init__(self, tmp, pki, auth_clients="no"):
        self.tls_port = free_port()
        self.tls_args = tls_server_args(pki, self.tls_port, auth_clients)
        super().__init__(tmp)

    def start(self, extra=()):
        super().start([*self.tls_args, *extra])


def tls_flow(**kw):
    """redis.tls as a YAML flow mapping."""
    parts = []
    for k, v in kw.items():
        parts.append(f"{k}: " + (("true" if v else "false") if isinstance(v, bool) else f"'{v}'"))
    return "{" + ", ".join(parts) + "}"


def start_proxy(env, srv, host="127.0.0.1", **tls):
    p = Proxy(env.tmp, f"proxy{len(env.proxies) + 1}", f"rediss://{host}:{srv.tls_port}",
              env.endpoint(), [STREAM], redis={"tls": tls_flow(**tls)})
    env.proxies.append(p)
    return p.start()


@pytest.fixture
def tenv(tmp_path, pki, request):
    d = tmp_path / "redis"
    d.mkdir()
    srv = TLSRedis(d, pki, getattr(request, "param", "no"))
    e = Env(tmp_path, srv)
    yield e
    e.close()
    srv.stop()


def delivered(env, p, keys):
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": k} for k in keys])
    wait_for(lambda: sorted(w.keys()) == sorted(keys), timeout=20, what=f"{keys} delivered over TLS")
    wait_for(lambda: all((env.r.get(f"idem:{k}") or "")[:1] == "D" for k in keys), what="done keys written")
    return w


def refused(env, p, pattern):
    """Not ready, nothing delivered, and the log's link-lost line names TLS and the reason."""
    p.wait_log("link lost: TLS", timeout=15)
    lost = [ln for ln in p.log_text().splitlines() if "link lost" in ln]
    assert lost and all(re.search(pattern, ln) for ln in lost), lost
    assert p.get("/readyz")[0] != 200
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "never"}])
    time.sleep(1.0)
    assert w.keys() == []


def test_verified_tls(tenv, pki):
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "ca.crt"))
    delivered(tenv, p, ["t1", "t2", "t3"])
    wait_for(lambda: p.get("/readyz")[0] == 200, what="ready")
    assert "link lost" not in p.log_text()
    # the connection the proxy holds is a TLS one: the server counts it on its TLS port
    clients = tenv.r.client_list()
    assert any(int(c["laddr"].rsplit(":", 1)[1]) == tenv.redis.tls_port for c in clients if "laddr" in c), clients


def test_tls_reconnects_after_a_restart(tenv, pki):
    """The server gone and back: a plain 'link lost' (no TLS alarm), then TLS again."""
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "ca.crt"))
    w = delivered(tenv, p, ["r1"])
    tenv.redis.stop()
    p.wait_log("link lost", timeout=15)
    tenv.redis.start()
    tenv.r = tenv.redis.client
    publish(tenv.r, "room", [{"eventId": "r2"}])
    wait_for(lambda: sorted(w.keys()) == ["r1", "r2"], timeout=30, what="delivered after the restart")
    lost = [ln for ln in p.log_text().splitlines() if "link lost" in ln]
    assert lost and not any("TLS" in ln for ln in lost), lost


def test_verified_tls_by_name(tenv, pki):
    """A name in the url: resolved, and the certificate checked against it (DNS:localhost)."""
    p = start_proxy(tenv, tenv.redis, host="localhost", ca_file=str(pki / "ca.crt"))
    delivered(tenv, p, ["n1"])


@pytest.mark.parametrize("tenv", ["yes"], indirect=True)
def test_mutual_tls(tenv, pki):
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "ca.crt"), cert_file=str(pki / "client.crt"),
                    key_file=str(pki / "client.key"))
    delivered(tenv, p, ["m1", "m2"])


@pytest.mark.parametrize("tenv", ["yes"], indirect=True)
def test_client_certificate_missing_is_named(tenv, pki):
    """TLS 1.3 tells a client without the certificate the server wanted only after
    the handshake, in an alert on the first read."""
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "ca.crt"))
    refused(tenv, p, r"link lost: TLS: .*certificate required")


def test_wrong_ca_refused(tenv, pki):
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "other-ca.crt"))
    refused(tenv, p, r"link lost: TLS handshake: certificate verify failed: .*(self-signed|unable to get)")


def test_wrong_server_name_refused(tenv, pki):
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "ca.crt"), server_name="cache.example.com")
    refused(tenv, p, r"link lost: TLS handshake: certificate verify failed: hostname mismatch")


def test_verify_false_accepted_with_a_warning(tenv, pki):
    p = start_proxy(tenv, tenv.redis, ca_file=str(pki / "other-ca.crt"), verify=False)
    delivered(tenv, p, ["v1"])
    assert re.search(r"warn .*TLS without peer verification", p.log_text())


def test_plain_server_behind_rediss_is_named(tenv, pki):
    """rediss:// to a plain-text port: one line about TLS, not a bare 'closed' (a
    plain Redis waits for the end of the 'command' the ClientHello looks like)."""
    p = Proxy(tenv.tmp, "plain", f"rediss://127.0.0.1:{tenv.redis.port}", tenv.endpoint(), [STREAM],
              redis={"tls": tls_flow(ca_file=str(pki / "ca.crt"))})
    tenv.proxies.append(p)
    p.start()
    p.wait_log("link lost: TLS", timeout=15)
    assert re.search(r"link lost: TLS handshake timed out \(does the server speak TLS", p.log_text())
    assert p.get("/readyz")[0] != 200


def test_check_validates_the_tls_files(tmp_path, pki):
    from pxtest import BIN

    def check(files=True, **tls):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"redis:\n  url: rediss://127.0.0.1:6380\n  tls: {tls_flow(**tls)}\n"
                       "streams:\n  - stream: s\n")
        return subprocess.run([str(BIN), "check", "-c", str(cfg), *(["--files"] if files else [])],
                              capture_output=True, text=True, timeout=10)

    ok = check(ca_file=str(pki / "ca.crt"), cert_file=str(pki / "client.crt"),
               key_file=str(pki / "client.key"))
    assert ok.returncode == 0, ok.stderr
    missing = check(ca_file=str(pki / "nope.crt"))
    assert missing.returncode == 2 and "redis.tls: cannot load" in missing.stderr and "nope.crt" in missing.stderr
    mismatch = check(ca_file=str(pki / "ca.crt"), cert_file=str(pki / "client.crt"),
                     key_file=str(pki / "server.key"))
    assert mismatch.returncode == 2 and "is not the private key of" in mismatch.stderr, mismatch.stderr
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    bad = check(ca_file=str(garbage))
    assert bad.returncode == 2 and "garbage.crt" in bad.stderr
    # without --files, check opens none of them (docs/configuration.md: hermetic; issue 33)
    assert check(files=False, ca_file=str(pki / "nope.crt")).returncode == 0


class TLSCluster(RedisCluster):
    """A Redis Cluster whose nodes talk TLS on the bus (tls-cluster yes) and serve
    TLS clients on a TLS port each; their plain ports are for the harness."""

    def __init__(self, tmp, pki):
        self.pki = pki
        self.tls_ports = {}
        super().__init__(tmp, masters=3, replicas=0, extra=["--tls-cluster", "yes"])

    def start_node(self, port):
        tp = self.tls_ports.setdefault(port, free_port())
        saved = self.extra
        self.extra = [*saved, *tls_server_args(self.pki, tp)]
        try:
            super().start_node(port)
        finally:
            self.extra = saved


def test_cluster_over_tls(tmp_path, pki):
    d = tmp_path / "cluster"
    d.mkdir()
    cl = TLSCluster(d, pki)
    try:
        seeds = [f"127.0.0.1:{cl.tls_ports[p]}" for p in cl.ports[:2]]
        e = Env(tmp_path, cl)
        e.r = cl.client
        streams = [dict(STREAM, stream=f"orders:{{{i}}}") for i in range(6)]
        p = Proxy(tmp_path, "proxy1", seeds, e.endpoint(), streams,
                  redis={"tls": tls_flow(ca_file=str(pki / "ca.crt"))})
        e.proxies.append(p)
        p.start()
        wait_for(lambda: "cluster ready" in p.log_text(), timeout=20, what="cluster ready over TLS")
        w = e.worker(p.endpoint)
        keys = []
        for i in range(6):
            k = [f"c{i}-{j}" for j in range(5)]
            keys += k
            publish(cl.client, f"orders:{{{i}}}", [{"eventId": x} for x in k])
        wait_for(lambda: sorted(w.keys()) == sorted(keys), timeout=30, what="every stream delivered")
        wait_for(lambda: all((cl.client.get(f"idem:{k}") or "")[:1] == "D" for k in keys), what="done keys")
        # every master's link is a TLS one: each master counts a client on its TLS port
        for port in cl.masters():
            laddrs = [c.get("laddr", "") for c in cl.node(port).client_list()]
            assert any(a.endswith(f":{cl.tls_ports[port]}") for a in laddrs), (port, laddrs)
        assert "link lost" not in p.log_text()
        e.close()
    finally:
        cl.stop()


@pytest.mark.parametrize("tenv", ["yes"], indirect=True)
def test_inspect_and_redrive_over_mutual_tls(tenv, pki):
    """The operator commands read the same config as the daemon: a rediss:// url
    with redis.tls is spoken over TLS (they once opened plain TCP to the TLS port
    and failed), and a CA that did not sign the server is one line naming TLS."""
    tls = dict(ca_file=str(pki / "ca.crt"), cert_file=str(pki / "client.crt"),
               key_file=str(pki / "client.key"))
    stream = dict(STREAM, dead_letter="room:dead", retry_backoff_ms=50)
    p = Proxy(tenv.tmp, "proxy-ops", f"rediss://127.0.0.1:{tenv.redis.tls_port}", tenv.endpoint(),
              [stream], redis={"tls": tls_flow(**tls)})
    tenv.proxies.append(p)
    p.start()
    mode = {"drop": True}
    w = tenv.worker(p.endpoint, behave=lambda d: (pb.Ack.DROP, "down") if mode["drop"] else (pb.Ack.ACK, ""))
    [eid] = publish(tenv.r, "room", [{"eventId": "op1", "pad": "y" * 3000}])
    wait_for(lambda: tenv.r.xlen("room:dead") == 1, what="dead letter")
    wait_for(lambda: tenv.r.xpending("room", "g")["pending"] == 0, what="acked")
    res = subprocess.run([str(BIN), "inspect", "-c", str(p.config), "--stream", "room", "--entry", eid],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "reason down, attempts 1" in res.stdout
    mode["drop"] = False
    res = subprocess.run([str(BIN), "redrive", "-c", str(p.config), "--stream", "room"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "redriven 1, skipped 0" in res.stdout
    wait_for(lambda: [d.key for d in w.got] == ["op1", "op1"], what="delivered again after the redrive")
    # the redriven entry carries its whole payload (the fields went through TLS both ways)
    assert json.loads(w.got[1].payload)["pad"] == "y" * 3000
    # another CA: refused, exit 1, and stderr says TLS and why
    bad = p.config.read_text().replace(str(pki / "ca.crt"), str(pki / "other-ca.crt"))
    cfg = tenv.tmp / "bad-ca.yaml"
    cfg.write_text(bad)
    res = subprocess.run([str(BIN), "inspect", "-c", str(cfg), "--stream", "room", "--key", "op1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == ""
    assert re.search(r"TLS handshake: certificate verify failed", res.stderr), res.stderr
