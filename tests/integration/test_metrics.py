"""docs/operations.md: /metrics, /healthz, /readyz and `idemproxy health`."""
import json
import os
import subprocess
import time

from pxtest import BIN, pb, publish, has_group, pending, wait_for

FAMILIES = ["idemproxy_entries_read_total", "idemproxy_outcomes_total", "idemproxy_deliveries_total",
            "idemproxy_duplicates_total", "idemproxy_lock_busy_total", "idemproxy_acks_total",
            "idemproxy_ack_timeouts_total", "idemproxy_dead_letters_total", "idemproxy_lease_lost_total",
            "idemproxy_trimmed_total", "idemproxy_conflicts_total", "idemproxy_redis_errors_total", "idemproxy_redis_redirects_total",
            "idemproxy_protocol_errors_total",
            "idemproxy_spans_exported_total", "idemproxy_spans_dropped_total",
            "idemproxy_traceparents_invalid_total",
            "idemproxy_inflight", "idemproxy_entries_pending", "idemproxy_redis_up",
            "idemproxy_workers_connected", "idemproxy_ack_latency_seconds", "idemproxy_lock_wait_seconds",
            "idemproxy_duplicate_age_seconds",
            "idemproxy_loop_busy_seconds",
            "idemproxy_delivery_window", "idemproxy_group_lag", "idemproxy_group_pending",
            "idemproxy_build_info", "process_cpu_seconds_total", "process_resident_memory_bytes",
            "process_open_fds", "process_max_fds", "process_start_time_seconds"]


def conf(stream, **kw):
    s = {"stream": stream, "group": "g", "consumer": "c1", "payload_field": "payload", "key": "#event.eventId"}
    s.update(kw)
    return s


def test_every_metric_exported_at_zero_from_the_start(env):
    p = env.proxy([conf("room"), conf("minigame")])
    wait_for(lambda: p.get("/healthz")[0] == 200, what="metrics server")
    m = p.metrics()
    body = p.get("/metrics")[1]
    for fam in FAMILIES:
        assert f"# TYPE {fam} " in body, fam
    for s in ("room", "minigame"):
        assert m[f'idemproxy_entries_read_total{{stream="{s}",group="g"}}'] == 0
        for o in ("acked", "duplicate", "dead_lettered", "skipped"):
            assert m[f'idemproxy_outcomes_total{{stream="{s}",group="g",outcome="{o}"}}'] == 0
        for st in ("ack", "retry", "drop", "timeout", "invalid"):
            assert m[f'idemproxy_acks_total{{stream="{s}",group="g",status="{st}"}}'] == 0
        for stage in ("before_lock", "after_lock"):
            assert m[f'idemproxy_duplicates_total{{stream="{s}",group="g",stage="{stage}"}}'] == 0
        assert m[f'idemproxy_ack_latency_seconds_count{{stream="{s}",group="g"}}'] == 0
        assert m[f'idemproxy_conflicts_total{{stream="{s}",group="g"}}'] == 0
        assert m[f'idemproxy_lock_wait_seconds_bucket{{stream="{s}",group="g",le="+Inf"}}'] == 0


def test_numbers_add_up_after_copies_a_drop_and_a_bad_entry(env):
    r = env.r
    p = env.proxy([conf("room", dead_letter="dlq")])
    w = env.worker(p.endpoint, behave=lambda d: (pb.Ack.DROP, "no") if d.key == "d1" else (pb.Ack.ACK, ""))
    publish(r, "room", [{"eventId": f"k{i}"} for i in range(5)] * 2 + [{"eventId": "d1"}])
    r.xadd("room", {"payload": "{broken"})
    wait_for(lambda: has_group(r, "room", "g"), what="the group")
    wait_for(lambda: pending(r, "room", "g") == 0 and r.xlen("dlq") == 2, what="all done")
    wait_for(lambda: p.metrics()['idemproxy_outcomes_total{stream="room",group="g",outcome="duplicate"}'] == 5,
             what="duplicates counted")
    # an acked entry is counted once its XACK's reply is read, after Redis applied it
    wait_for(lambda: p.metrics()['idemproxy_outcomes_total{stream="room",group="g",outcome="acked"}'] == 5,
             what="acks counted")
    m = p.metrics()
    g = lambda k: m[k.replace("S", 'stream="room",group="g"')]
    read = g("idemproxy_entries_read_total{S}")
    outcomes = sum(g(f'idemproxy_outcomes_total{{S,outcome="{o}"}}') for o in ("acked", "duplicate", "dead_lettered", "skipped"))
    assert read == 12
    assert read == outcomes + g("idemproxy_entries_pending{S}")      # docs/operations.md's rule
    assert g('idemproxy_outcomes_total{S,outcome="acked"}') == 5
    assert g('idemproxy_outcomes_total{S,outcome="dead_lettered"}') == 2
    assert g('idemproxy_duplicates_total{S,stage="before_lock"}') + g('idemproxy_duplicates_total{S,stage="after_lock"}') == 5
    assert g("idemproxy_deliveries_total{S}") == 6
    assert g('idemproxy_acks_total{S,status="ack"}') == 5 and g('idemproxy_acks_total{S,status="drop"}') == 1
    assert g("idemproxy_dead_letters_total{S}") == 2
    assert g("idemproxy_ack_latency_seconds_count{S}") == 6
    assert g('idemproxy_ack_latency_seconds_bucket{S,le="+Inf"}') == 6
    assert g("idemproxy_lock_wait_seconds_count{S}") == 6
    assert m["idemproxy_workers_connected"] == 1
    assert m["idemproxy_redis_up"] == 1
    assert m["idemproxy_inflight"] == 0


def test_loop_busy_counts_iterations_and_not_their_sleep(env):
    """idemproxy_loop_busy_seconds (issue 18): one observation per loop iteration,
    the time from waking up to waiting again. Entries handled add iterations; an
    idle second adds a few (timers) but almost no busy time: the sleep in
    epoll_wait is not counted."""
    p = env.proxy([conf("room")])
    env.worker(p.endpoint)
    wait_for(lambda: has_group(env.r, "room", "g"), what="the group")
    H = "idemproxy_loop_busy_seconds"

    def hist():
        m = p.metrics()
        buckets = [(k, v) for k, v in m.items() if k.startswith(H + "_bucket{")]
        return m[H + "_count"], m[H + "_sum"], buckets

    c0, s0, _ = hist()
    t0 = time.monotonic()
    publish(env.r, "room", [{"eventId": f"k{i}"} for i in range(20)])
    wait_for(lambda: pending(env.r, "room", "g") == 0 and env.r.xlen("room") == 20, what="all done")
    c1, s1, buckets = hist()
    assert c1 - c0 >= 5                       # reads, claims, deliveries, commits: several turns
    assert 0 < s1 - s0 < time.monotonic() - t0
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and buckets[-1] == (H + '_bucket{le="+Inf"}', c1)
    time.sleep(1.0)                           # idle: the lease timer still ticks
    c2, s2, _ = hist()
    assert c2 > c1
    assert s2 - s1 < 0.1


def test_readyz_follows_redis(env):
    p = env.proxy([conf("room")], timeout_ms=500)
    wait_for(lambda: p.get("/readyz")[0] == 200, what="ready")
    env.redis.stop()
    wait_for(lambda: p.get("/readyz")[0] == 503, what="not ready without Redis")
    assert p.get("/healthz")[0] == 200                # the loop still runs
    assert p.metrics()["idemproxy_redis_up"] == 0
    # the group's numbers are not exported while they cannot be known
    wait_for(lambda: not any(k.startswith("idemproxy_group_") for k in p.metrics()), timeout=10,
             what="group gauges left out without Redis")
    env.redis.start()
    wait_for(lambda: p.metrics().get('idemproxy_group_pending{stream="room",group="g"}') == 0,
             timeout=20, what="group gauges back")
    wait_for(lambda: p.get("/readyz")[0] == 200, timeout=15, what="ready again")


def test_health_command(env):
    p = env.proxy([conf("room")])
    wait_for(lambda: p.get("/healthz")[0] == 200, what="metrics server")
    res = subprocess.run([str(BIN), "health", "-c", str(p.config)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    p.stop()
    res = subprocess.run([str(BIN), "health", "-c", str(p.config)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 1


def test_json_logs_one_line_per_decision_and_never_the_password(env, tmp_path):
    import redis as redis_lib
    secret = "s3cret-Pa55"
    env.r.config_set("requirepass", secret)
    r = redis_lib.Redis(port=env.redis.port, password=secret, decode_responses=True)
    from pxtest import Proxy
    p = Proxy(tmp_path, "pj", f"redis://:{secret}@127.0.0.1:{env.redis.port}", env.endpoint(),
              [conf("room")])
    p.config.write_text(p.config.read_text().replace("level: debug", "level: debug\n  format: json"))
    env.proxies.append(p)
    p.start()
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "j1"}, {"eventId": "j1"}])
    r.xadd("room", {"payload": "{bad"})
    wait_for(lambda: w.keys() == ["j1"] and "duplicate" in p.log_text() and "bad entry" in p.log_text(),
             what="decisions logged")
    text = p.log_text()
    assert secret not in text
    lines = [json.loads(l) for l in text.splitlines() if l.strip()]
    assert all({"ts", "level", "msg"} <= set(l) for l in lines)
    assert any(l["level"] == "debug" and "delivered" in l["msg"] for l in lines)
    assert any(l["level"] == "warn" and "bad entry" in l["msg"] for l in lines)
    # the password file path, not its content, may appear; the URL's password never
    p.stop()
    res = subprocess.run([str(BIN), "check", "-c", str(p.config)], capture_output=True, text=True)
    assert secret not in res.stderr + res.stdout


# --- the metrics server's connection limits (issue 15) --------------------------------

def _connect_idle(port, source):
    """A TCP connection to the metrics server from 'source' that sends nothing."""
    import socket
    s = socket.socket()
    s.settimeout(5)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s


def _closed_by_server(s):
    import socket
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _healthz_from(port, source, timeout=2.0):
    """GET /healthz over a new connection from 'source': (status line, seconds)."""
    import socket
    t0 = time.monotonic()
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.split(b"\r\n", 1)[0].decode(errors="replace"), time.monotonic() - t0
    except OSError as e:
        return f"error: {e}", time.monotonic() - t0
    finally:
        s.close()


def _metrics_conns(pid, port):
    """How many accepted connections on 'port' the process holds a descriptor of."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("tcp", "tcp6"):
        try:
            rows = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if int(f[1].split(":")[1], 16) == port and f[3] != "0A" and f[9] in inodes:  # 0A: LISTEN
                n += 1
    return n


def test_idle_connections_are_bounded_and_do_not_stop_healthz(env):
    """The metrics server shares the daemon's file descriptors: at most 16
    connections per address and 64 in all are kept, 8 of them only for
    loopback (where `idemproxy health` comes from), the rest are closed at
    once, idle ones are closed after 5 s (a request's whole time), and
    /healthz keeps answering. Each phase starts from no connection, so a slow
    machine cannot let one phase's timeout free the slots the next one counts.
    127.0.0.2 and up stand for other pods' addresses."""
    p = env.proxy([conf("room")])
    wait_for(lambda: p.get("/healthz")[0] == 200, what="metrics server")
    conns = lambda: _metrics_conns(p.proc.pid, p.metrics_port)
    held = []

    def close_all():
        for s in held:
            s.close()
        held.clear()
        wait_for(lambda: conns() == 0, timeout=5, what="the server's side of closed connections gone")

    try:
        # Within the limit: 14 idle connections, and /healthz from the same address answers.
        held += [_connect_idle(p.metrics_port, "127.0.0.2") for _ in range(14)]
        line, took = _healthz_from(p.metrics_port, "127.0.0.2")
        assert line == "HTTP/1.1 200 OK" and took < 2.0, (line, took)

        # 200 more from that address: MHD takes each and closes every one over 16.
        held += [_connect_idle(p.metrics_port, "127.0.0.2") for _ in range(200)]
        wait_for(lambda: sum(_closed_by_server(s) for s in held) >= len(held) - 16, timeout=4,
                 what="every connection over 16 from one address closed")
        assert conns() <= 16, conns()
        # ... and /healthz from another address answers at once.
        line, took = _healthz_from(p.metrics_port, "127.0.0.3")
        assert line == "HTTP/1.1 200 OK" and took < 2.0, (line, took)
        close_all()

        # Many addresses: 56 connections from them in all at most, the rest
        # closed at once; loopback's 8 slots stay free for the probe.
        held += [_connect_idle(p.metrics_port, f"127.0.0.{a}") for a in range(3, 11) for _ in range(10)]
        wait_for(lambda: conns() == 56, timeout=4, what="56 connections taken in all")
        line, took = _healthz_from(p.metrics_port, "127.0.0.11", timeout=1.0)
        assert not line.startswith("HTTP/1.1 200"), "a 57th connection from another address was served"
        line, took = _healthz_from(p.metrics_port, "127.0.0.1")
        assert line == "HTTP/1.1 200 OK" and took < 2.0, ("the probe's slot", line, took)
        # The probe's own connection is closed by the server just after its
        # reply (a loaded machine may count it a moment longer); the 56 stay.
        wait_for(lambda: conns() == 56, timeout=3, what="the probe's slot given back, the 56 kept")
        close_all()

        # Idle ones are closed after 5 s; then the same address is served again.
        held += [_connect_idle(p.metrics_port, "127.0.0.2") for _ in range(16)]
        wait_for(lambda: conns() == 16, timeout=4, what="16 idle connections taken")
        time.sleep(3)
        assert conns() == 16, "an idle connection closed before its 5 s"
        wait_for(lambda: all(_closed_by_server(s) for s in held), timeout=10,
                 what="idle connections closed by the server after 5 s")
        line, took = _healthz_from(p.metrics_port, "127.0.0.2")
        assert line == "HTTP/1.1 200 OK" and took < 2.0, (line, took)
        wait_for(lambda: conns() == 0, timeout=5, what="the descriptors given back")
    finally:
        for s in held:
            s.close()


def test_slow_requests_are_cut_and_the_probe_keeps_answering(env):
    """Clients on 4 addresses, 16 connections each, sending one header byte
    a second (never idle, never done): each connection is closed once its
    request has taken 5 s, and `idemproxy health` (loopback) answers healthy
    all along, so a liveness probe that runs it never restarts the sidecar."""
    import socket
    import threading
    p = env.proxy([conf("room")])
    wait_for(lambda: p.get("/healthz")[0] == 200, what="metrics server")
    stop = threading.Event()
    lives = []  # seconds each slow connection stayed open

    def slow(source):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.bind((source, 0))
            s.connect(("127.0.0.1", p.metrics_port))
        except OSError:
            s.close()
            return
        t0 = time.monotonic()
        try:
            for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                if stop.is_set():
                    return
                s.send(bytes([b]))
                time.sleep(1.0)
        except OSError:
            lives.append(time.monotonic() - t0)
        finally:
            s.close()

    threads = [threading.Thread(target=slow, args=(f"127.0.0.{a}",), daemon=True)
               for a in range(2, 6) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        unhealthy = []
        t_end = time.monotonic() + 14
        while time.monotonic() < t_end:
            r = subprocess.run([str(BIN), "health", "-c", str(p.config)], capture_output=True, text=True,
                               timeout=10)
            if r.returncode != 0:
                unhealthy.append(r.stderr.strip())
            time.sleep(0.5)
        assert not unhealthy, unhealthy
        assert len(lives) >= 32, f"only {len(lives)} slow connections were closed by the server"
        assert max(lives) < 9, f"a slow request was kept {max(lives):.1f} s"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)


# --- one stream, several groups (issue 17) -------------------------------------------

def _series(body):
    """Every sample's series (name and label set, as exported), in order."""
    return [l.rsplit(" ", 1)[0] for l in body.splitlines() if l and not l.startswith("#")]


def test_one_stream_read_by_two_groups_exports_distinct_series(env):
    """Two stream blocks on one stream with different groups are two readers:
    each series names its group, so no name+label set appears twice (a scrape
    with a duplicate series is rejected whole by Prometheus)."""
    solo = {k: v for k, v in conf("solo").items() if k not in ("group", "consumer")}
    p = env.proxy([conf("room", group="g1"), conf("room", group="g2"), solo])
    wait_for(lambda: p.get("/healthz")[0] == 200, what="metrics server")
    series = _series(p.get("/metrics")[1])
    dups = sorted({s for s in series if series.count(s) > 1})
    assert dups == [], dups[:10]
    m = p.metrics()
    assert m['idemproxy_entries_read_total{stream="room",group="g1"}'] == 0
    assert m['idemproxy_entries_read_total{stream="room",group="g2"}'] == 0
    assert m['idemproxy_entries_read_total{stream="solo",group=""}'] == 0


def _xinfo(r, stream, group):
    return next(g for g in r.xinfo_groups(stream) if g["name"] == group)


def test_group_lag_and_pending_follow_xinfo_groups(env):
    """idemproxy_group_lag and idemproxy_group_pending are what XINFO GROUPS
    says for each configured group (refreshed every 5 s): with no worker, the
    proxy reads max_inflight entries (pending) and leaves the rest (lag); lag
    is left out while Redis cannot tell it (nil after an XDEL in the unread
    range); once a worker acks everything both are 0."""
    r = env.r
    n = 12
    publish(r, "room", [{"eventId": f"k{i}"} for i in range(n)])
    p = env.proxy([conf("room", group="g1"), conf("room", group="g2", consumer="c2")], max_inflight=3)
    wait_for(lambda: has_group(r, "room", "g1") and has_group(r, "room", "g2"), what="the groups")
    lag = lambda g: p.metrics().get(f'idemproxy_group_lag{{stream="room",group="{g}"}}')
    pend = lambda g: p.metrics().get(f'idemproxy_group_pending{{stream="room",group="{g}"}}')

    def agrees(g):
        x = _xinfo(r, "room", g)
        return x["lag"] is not None and (lag(g), pend(g)) == (x["lag"], x["pending"])
    # max_inflight counts over all blocks: some entries read, by either group.
    wait_for(lambda: _xinfo(r, "room", "g1")["pending"] + _xinfo(r, "room", "g2")["pending"] > 0,
             what="entries read")
    time.sleep(1)
    for g in ("g1", "g2"):
        wait_for(lambda: agrees(g), timeout=15, what=f"{g}'s lag and pending as XINFO GROUPS says")
        x = _xinfo(r, "room", g)
        assert x["lag"] + x["pending"] == n and x["lag"] > 0, x   # nothing acked, some unread
    assert pend("g1") + pend("g2") > 0

    # An XDEL among the unread entries: Redis no longer knows the lag (nil), the
    # sample is left out; pending is still there.
    r.xdel("room", r.xrevrange("room", count=3)[-1][0])     # (not the last: see below)
    assert _xinfo(r, "room", "g1")["lag"] is None
    wait_for(lambda: lag("g1") is None and lag("g2") is None, timeout=15, what="lag left out")
    assert pend("g1") == _xinfo(r, "room", "g1")["pending"]
    body = p.get("/metrics")[1]
    assert "# TYPE idemproxy_group_lag gauge" in body and "NaN" not in body

    # Once a group has read up to the stream's last entry, Redis knows its lag again.
    env.worker(p.endpoint)
    wait_for(lambda: all(_xinfo(r, "room", g)["pending"] == 0 and _xinfo(r, "room", g)["lag"] == 0
                         for g in ("g1", "g2")), timeout=20, what="everything acked")
    for g in ("g1", "g2"):
        wait_for(lambda: (lag(g), pend(g)) == (0, 0), timeout=15, what=f"{g}'s lag and pending at 0")


def test_no_group_gauges_for_a_group_less_block(env):
    solo = {k: v for k, v in conf("solo").items() if k not in ("group", "consumer")}
    p = env.proxy([solo, conf("room")])
    wait_for(lambda: p.metrics().get('idemproxy_group_pending{stream="room",group="g"}') == 0,
             timeout=15, what="room's pending")
    assert not any("solo" in k for k in p.metrics() if k.startswith("idemproxy_group_"))


# --- build and process metrics, and the exposition checked by promtool (issue 17) ------

def test_build_info_and_process_metrics(env):
    p = env.proxy([conf("room")])
    wait_for(lambda: p.get("/healthz")[0] == 200, what="metrics server")
    body = p.get("/metrics")[1]
    m = p.metrics()
    version = subprocess.run([str(BIN), "version"], capture_output=True, text=True, timeout=10).stdout
    info = [k for k in m if k.startswith("idemproxy_build_info{")]
    assert len(info) == 1 and m[info[0]] == 1, info
    import re
    got = re.fullmatch(r'idemproxy_build_info\{version="([^"]*)",commit="([0-9a-f]{12})"\}', info[0])
    # the same version and commit (build/gen/git_commit.h) as `idemproxy version`
    assert got and version.strip() == f"idemproxy {got.group(1)} (commit {got.group(2)})", (info, version)
    for fam, typ in (("process_cpu_seconds_total", "counter"), ("process_resident_memory_bytes", "gauge"),
                     ("process_open_fds", "gauge"), ("process_max_fds", "gauge"),
                     ("process_start_time_seconds", "gauge")):
        assert f"# TYPE {fam} {typ}\n" in body, fam
    pid = p.proc.pid
    assert m["process_resident_memory_bytes"] > 1 << 20
    assert m["process_open_fds"] > 3
    assert abs(m["process_open_fds"] - len(os.listdir(f"/proc/{pid}/fd"))) <= 2
    import resource
    assert m["process_max_fds"] == resource.prlimit(pid, resource.RLIMIT_NOFILE)[0]
    assert time.time() - 60 < m["process_start_time_seconds"] <= time.time() + 1
    assert 0 <= m["process_cpu_seconds_total"] < 60


def test_promtool_check_metrics_is_clean(env):
    """A live /metrics, with two groups on one stream, a group-less block, lag
    gauges and some traffic, passes `promtool check metrics` with no lint
    problem (tests/deps.sh installs promtool)."""
    import shutil
    promtool = shutil.which("promtool")
    if promtool is None:
        import pytest
        pytest.skip("promtool not installed (tests/deps.sh installs it)")
    r = env.r
    solo = {k: v for k, v in conf("solo").items() if k not in ("group", "consumer")}
    p = env.proxy([conf("room", group="g1"), conf("room", group="g2", consumer="c2"), solo],
                  max_inflight=8)
    env.worker(p.endpoint, behave=lambda d: (pb.Ack.DROP, "no") if d.key == "k0" else (pb.Ack.ACK, ""))
    publish(r, "room", [{"eventId": f"k{i}"} for i in range(5)] * 2)
    publish(r, "solo", [{"eventId": "s1"}])
    wait_for(lambda: has_group(r, "room", "g1") and has_group(r, "room", "g2"), what="the groups")
    wait_for(lambda: pending(r, "room", "g1") == 0 and pending(r, "room", "g2") == 0
             and p.metrics().get('idemproxy_group_lag{stream="room",group="g2"}') == 0
             and p.metrics().get('idemproxy_outcomes_total{stream="solo",group="",outcome="acked"}') == 1,
             timeout=20, what="traffic done and lag refreshed")
    body = p.get("/metrics")[1]
    assert 'idemproxy_group_lag{stream="room",group="g1"}' in body
    res = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0 and res.stdout.strip() == "" and res.stderr.strip() == "", \
        (res.returncode, res.stdout, res.stderr)


def test_a_taken_metrics_port_names_the_cause_and_the_setting(env):
    """Issue 33: "cannot listen on 127.0.0.1:9464" alone left the user guessing."""
    import socket
    from pxtest import Proxy
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    try:
        p = Proxy(env.tmp, "busy", env.redis.url, env.endpoint(), [conf("room")])
        p.config.write_text(p.config.read_text().replace(
            f"127.0.0.1:{p.metrics_port}", f"127.0.0.1:{held.getsockname()[1]}"))
        env.proxies.append(p)
        p.start()
        assert p.proc.wait(15) == 1
        text = p.log_text()
        assert f"cannot listen on 127.0.0.1:{held.getsockname()[1]}: Address already in use" in text, text
        assert "metrics.listen" in text, text
    finally:
        held.close()
