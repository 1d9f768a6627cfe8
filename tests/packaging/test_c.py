"""The C client as a distribution would package it: `make install` from what git
tracks of clients/c (PREFIX, and DESTDIR for a staged install), then a program
outside the repository built with `pkg-config --cflags --libs idemproxy-client`
against the installed prefix, run against a real idemproxy."""
import os
import re
import subprocess

from conftest import ROOM, ROOT, run
from pxtest import pending, publish, wait_for

VERSION = (ROOT / "VERSION").read_text().strip()
SOVERSION = re.search(r"^SOVERSION = (\d+)$", (ROOT / "clients" / "c" / "Makefile").read_text(), re.M).group(1)

# A worker as a user writes it: only the installed header and library. The
# handler fails the first time it sees "k2" and answers RETRY with its reason.
WORKER_C = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <idemproxy_client.h>

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void) sig; stop = 1; }

static int handle(const idemproxy_delivery *d, const char **why)
{
    if (strcmp(d->key, "k2") == 0 && d->attempt == 1) {
        *why = "handler failed: k2 is not ready";
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);

    idemproxy_client *c = idemproxy_client_connect(argc > 1 ? argv[1] : NULL);
    if (c == NULL || c->err) {
        fprintf(stderr, "worker: %s\n", c ? c->errstr : "out of memory");
        return 1;
    }
    while (!stop) {
        idemproxy_delivery *d;
        const char *why = NULL;
        int rc = idemproxy_client_recv(c, 500, &d);
        if (rc == IDEMPROXY_CLIENT_EAGAIN)
            continue;
        if (rc != IDEMPROXY_CLIENT_OK) {
            fprintf(stderr, "worker: %s\n", c->errstr);
            continue;
        }
        if (handle(d, &why) == 0) {
            rc = idemproxy_client_ack(c, d);
            printf("%s attempt=%u ack\n", d->key, d->attempt);
        } else {
            fprintf(stderr, "worker: %s attempt=%u: %s\n", d->key, d->attempt, why);
            rc = idemproxy_client_retry(c, d, why);
            printf("%s attempt=%u retry\n", d->key, d->attempt);
        }
        if (rc != IDEMPROXY_CLIENT_OK)
            fprintf(stderr, "worker: %s\n", c->errstr);
        fflush(stdout);
        idemproxy_delivery_free(d);
    }
    idemproxy_client_free(c);
    return 0;
}
"""


def test_installed_c_client_serves_a_worker_outside_the_repository(env, exported, tmp_path):
    src = exported("clients/c")
    prefix = tmp_path / "prefix"
    run(["make", "-s", "install", f"PREFIX={prefix}"], src, timeout=300)

    lib = prefix / "lib"
    real = lib / f"libidemproxy_client.so.{VERSION}"
    assert (lib / f"libidemproxy_client.so.{SOVERSION}").resolve() == real
    assert (lib / "libidemproxy_client.so").resolve() == real
    assert (prefix / "include" / "idemproxy_client.h").is_file()
    dyn = run(["readelf", "-d", str(real)], tmp_path).stdout
    assert f"Library soname: [libidemproxy_client.so.{SOVERSION}]" in dyn
    # The API and nothing else: the protobuf-c code inside is not exported, so a
    # program that generates its own idemproxy.v1 code links without a clash.
    syms = run(["nm", "-D", "--defined-only", str(real)], tmp_path).stdout.split()
    funcs = sorted(s.split("@")[0] for s in syms if s.startswith("idemproxy"))
    assert funcs and all(f.startswith(("idemproxy_client_", "idemproxy_delivery_")) for f in funcs), funcs
    assert not [s for s in syms if "idemproxy__v1__" in s or s.startswith("px_")]

    # A staged install (DESTDIR) names the final prefix in its .pc file.
    stage = tmp_path / "stage"
    run(["make", "-s", "install", f"DESTDIR={stage}", "PREFIX=/opt/idem"], src, timeout=300)
    pc = (stage / "opt/idem/lib/pkgconfig/idemproxy-client.pc").read_text()
    assert "prefix=/opt/idem\n" in pc and str(stage) not in pc
    assert (stage / f"opt/idem/lib/libidemproxy_client.so.{SOVERSION}").is_symlink()

    # The user's project: one C file, built the pkg-config way.
    app = tmp_path / "app"
    app.mkdir()
    (app / "worker.c").write_text(WORKER_C)
    penv = dict(os.environ, PKG_CONFIG_PATH=str(lib / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "idemproxy-client"], app, env=penv).stdout.split()
    assert run(["pkg-config", "--modversion", "idemproxy-client"], app, env=penv).stdout.strip() == VERSION
    # What the library itself links, for a static link and for tools that walk the
    # dependencies: nanomsg and protobuf-c, private (a worker's code calls neither).
    private = run(["pkg-config", "--print-requires-private", "idemproxy-client"], app, env=penv).stdout.split()
    assert sorted(private) == ["libprotobuf-c", "nanomsg"], private
    static = run(["pkg-config", "--static", "--libs", "idemproxy-client"], app, env=penv).stdout.split()
    assert {"-lidemproxy_client", "-lnanomsg", "-lprotobuf-c"} <= set(static), static
    assert "-lnanomsg" not in flags, flags
    assert f"-I{prefix}/include" in flags and f"-L{lib}" in flags and "-lidemproxy_client" in flags
    run(["cc", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Werror", "-o", "worker",
         "worker.c", *flags], app, env=penv)
    renv = dict(os.environ, LD_LIBRARY_PATH=str(lib))
    ldd = run(["ldd", "./worker"], app, env=renv).stdout
    assert f"libidemproxy_client.so.{SOVERSION} => {lib}/libidemproxy_client.so.{SOVERSION}" in ldd, ldd

    ep = env.endpoint()
    p = env.proxy([ROOM], endpoint=ep)
    out, err = app / "worker.out", app / "worker.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        w = subprocess.Popen(["./worker", ep], cwd=app, stdout=fo, stderr=fe, env=renv)
    try:
        keys = ["k1", "k2", "k3"]
        publish(env.r, "room", [{"eventId": k, "n": i} for i, k in enumerate(keys)])
        wait_for(lambda: all((env.r.get("idem:" + k) or "")[:1] == "D" for k in keys), timeout=60,
                 what="every key done")
        wait_for(lambda: pending(env.r, "room", "g") == 0, timeout=30, what="nothing pending")
    finally:
        w.terminate()
        rc = w.wait(15)
    assert rc == 0, err.read_text()
    lines = out.read_text().splitlines()
    assert sorted(lines) == ["k1 attempt=1 ack", "k2 attempt=1 retry", "k2 attempt=2 ack",
                             "k3 attempt=1 ack"], lines
    # The failure is the program's to report (the library never prints), and
    # idemproxy has it as the RETRY's reason; the entry was retried, not lost.
    assert err.read_text().splitlines() == ["worker: k2 attempt=1: handler failed: k2 is not ready"]
    assert "handler failed: k2 is not ready" in p.log_text()
    assert env.r.xlen("dlq") == 0
