"""Fixtures for the fault suite: those of the integration harness
(tests/integration/pxtest.py).

FAULT_TLS=1 runs the same scenarios over mutual TLS: the redis-server gets a TLS
port that wants a client certificate (--tls-auth-clients yes), and every proxy
the scenarios start connects there with rediss:// and redis.tls {ca_file,
cert_file, key_file}. The server keeps its plain port for the test's own client
(env.r), so the faults (CLIENT KILL, CLIENT PAUSE, kill -9 and a restart with
AOF) and the checker are the same; the restart re-opens the TLS port too."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from pxtest import Env, env, redis_server, wait_for  # noqa: E402,F401 (fixtures)

TLS = os.environ.get("FAULT_TLS") == "1"

if TLS:
    import test_tls  # noqa: E402 (its CA and pair makers, its TLS redis-server)

    @pytest.fixture(scope="session")
    def pki(tmp_path_factory):
        """One CA with a server and a client pair for the whole run (making them
        costs about a second)."""
        d = tmp_path_factory.mktemp("pki")
        test_tls.make_ca(d, "ca")
        test_tls.make_pair(d, "ca", "server", "redis.test", "DNS:localhost,IP:127.0.0.1")
        test_tls.make_pair(d, "ca", "client", "idemproxy")
        return d

    class MutualTLSRedis(test_tls.TLSRedis):
        """The proxies' url is the TLS port; the harness' client keeps the plain one."""

        @property
        def url(self):
            return f"rediss://127.0.0.1:{self.tls_port}"

    class TLSEnv(Env):
        def __init__(self, tmp, srv, pki):
            super().__init__(tmp, srv)
            self.tls = test_tls.tls_flow(ca_file=pki / "ca.crt", cert_file=pki / "client.crt",
                                         key_file=pki / "client.key")

        def proxy(self, streams, endpoint=None, proc_env=None, **app):
            app.setdefault("redis", {})["tls"] = self.tls
            return super().proxy(streams, endpoint, proc_env, **app)

        def close(self):
            """The scenario ran over TLS: while a proxy of it still runs, the server
            counts clients on its TLS port (only the proxies connect there)."""
            try:
                if any(p.proc and p.proc.poll() is None for p in self.proxies):
                    r = self.redis.client
                    wait_for(lambda: any(c.get("laddr", "").endswith(f":{self.redis.tls_port}")
                                         for c in r.client_list()),
                             what="a proxy connected on the TLS port")
            finally:
                super().close()

    @pytest.fixture
    def redis_server(tmp_path, pki):  # noqa: F811 (the TLS one replaces the plain one)
        d = tmp_path / "redis"
        d.mkdir()
        srv = MutualTLSRedis(d, pki, auth_clients="yes")
        yield srv
        srv.stop()

    @pytest.fixture
    def env(tmp_path, redis_server, pki):  # noqa: F811
        e = TLSEnv(tmp_path, redis_server, pki)
        yield e
        e.close()
