"""idemproxy against a real Redis Cluster (3 masters + 3 replicas, started in a
temp dir): slot routing, MOVED and ASK, a resharding and failovers under load
with three idemproxy replicas in one group (issue 7)."""
import json
import threading
import time
from collections import Counter

import pytest

from pxtest import Env, Proxy, RedisCluster, pb, wait_for

STREAMS = [f"orders:{{{i}}}" for i in range(8)]


@pytest.fixture
def cluster(tmp_path):
    d = tmp_path / "cluster"
    d.mkdir()
    c = RedisCluster(d)
    yield c
    c.stop()


class ClusterEnv(Env):
    def __init__(self, tmp, cluster):
        self.tmp = tmp
        self.cluster = cluster
        self.r = cluster.client
        self.proxies = []
        self.workers = []
        self.n = 0

    def proxy(self, streams, endpoint=None, proc_env=None, **app):
        p = Proxy(self.tmp, f"proxy{len(self.proxies) + 1}", self.cluster.seeds[:2],
                  endpoint or self.endpoint(), streams, **app)
        self.proxies.append(p)
        return p.start(**(proc_env or {}))


@pytest.fixture
def cenv(tmp_path, cluster):
    e = ClusterEnv(tmp_path, cluster)
    yield e
    e.close()


def stream_conf(name, **kw):
    # claim_idle_ms: at least 3 x redis.timeout_ms (1000 unless a test sets it; docs/configuration.md)
    return {"stream": name, "group": "g", "payload_field": "payload", "key": "#event.eventId",
            "claim_idle_ms": 3000, **kw}


def produce(r, n, copies_every=2, start=0):
    """n entries over the 8 streams; every key appears twice, the copy on
    another stream (a publisher retry), so dedup crosses nodes. Returns keys."""
    keys = []
    for i in range(start, start + n):
        k = f"evt-{i // copies_every}"
        r.xadd(STREAMS[(i * 3) % 8], {"payload": json.dumps({"eventId": k, "n": i})})
        keys.append(k)
    return set(keys)


def all_done(r, proxies, n_entries, streams=STREAMS):
    read = sum(int(p.metrics().get(f'idemproxy_entries_read_total{{stream="{s}",group="g"}}', 0))
               for p in proxies for s in streams)
    return read >= n_entries and pending_total(r, streams) == 0


def pending_total(r, streams=STREAMS):
    """Entries pending in group g over 'streams'. Errors propagate: a missing
    group or an unreachable node is not "nothing pending"."""
    return sum(r.xpending(s, "g")["pending"] for s in streams)


def owner(cluster, key):
    """The port of the master that owns key's slot, asked of the cluster."""
    slot = cluster.client.keyslot(key)
    for port, _, role, slots in cluster.nodes():
        if role == "master" and any(
                int(x.partition("-")[0]) <= slot <= int(x.partition("-")[2] or x)
                for x in slots if not x.startswith("[")):
            return port
    raise AssertionError(f"no master owns slot {slot} of {key}")


def test_streams_live_on_every_master(cluster):
    owners = {cluster.client.keyslot(s) for s in STREAMS}
    masters = set()
    for port, _, role, slots in cluster.nodes():
        if role != "master":
            continue
        for rng in slots:
            a, _, b = rng.partition("-")
            if any(int(a) <= s <= int(b or a) for s in owners):
                masters.add(port)
    assert len(masters) == 3, "the 8 test streams should be read from all three masters"


@pytest.mark.parametrize("layout,hash_tag", [("single", False), ("split", False), ("split", True)])
def test_dedup_across_masters(cenv, layout, hash_tag):
    r = cenv.r
    keys = produce(r, 600)
    px = cenv.proxy([stream_conf(s, layout=layout, hash_tag=hash_tag) for s in STREAMS])
    w = cenv.worker(px.endpoint)
    wait_for(lambda: all_done(r, [px], 600), timeout=30, what="every entry done and acked")
    got = Counter(w.keys())
    assert set(got) == keys
    assert max(got.values()) == 1, [k for k, c in got.items() if c > 1]
    tag = (lambda k: "{" + k + "}") if hash_tag else (lambda k: k)
    if layout == "single":
        assert all((r.get(f"idem:{tag(k)}") or "")[:1] == "D" for k in keys)
    else:
        assert all(r.exists(f"done:{tag(k)}") for k in keys)
        assert not any(r.exists(f"lock:{tag(k)}") for k in keys)
    # the keys really are spread over the cluster's nodes: each done mark is
    # on the master that owns its slot (a plain GET there, no redirection),
    # and every master holds some
    c = cenv.cluster
    holders = Counter()
    for k in keys:
        name = f"idem:{tag(k)}" if layout == "single" else f"done:{tag(k)}"
        port = owner(c, name)
        assert c.node(port).exists(name) == 1, f"{name} not on its owner {port}"
        holders[port] += 1
    assert set(holders) == set(c.masters()), holders
    assert px.get("/readyz")[0] == 200
    m = px.metrics()
    assert m["idemproxy_redis_up"] == 1
    assert m['idemproxy_redis_redirects_total{kind="moved"}'] == 0   # the map was right
    assert m["idemproxy_redis_errors_total"] == 0


def test_fencing_on_a_cluster(cenv):
    """The fence script runs on the master of idemproxy:fence's slot: every
    delivery of a key on any master gets a token, all distinct, near the
    server's clock in microseconds, and names its lock (the key)."""
    r = cenv.r
    keys = produce(r, 60)
    px = cenv.proxy([stream_conf(s, fencing=True) for s in STREAMS])
    w = cenv.worker(px.endpoint)
    wait_for(lambda: all_done(r, [px], 60), timeout=30, what="every entry done and acked")
    assert set(w.keys()) == keys
    toks = [d.fencing_token for d in w.got]
    assert len(set(toks)) == len(toks) and all(t > 1_600_000_000_000_000 for t in toks), toks
    assert int(r.get("idemproxy:fence")) >= max(toks)   # a copy's claim raises it too
    assert all(d.lock == d.key for d in w.got)


def test_ask_and_moved_during_a_slot_migration(cenv):
    """A dedup key whose slot is being migrated: the claim gets ASK and lands on
    the importing node (ASKING + SET); once the slot moves, MOVED repoints it."""
    c = cenv.cluster
    r = cenv.r
    key = "ask-me"
    slot = r.keyslot(f"idem:{key}")
    src = next(p for p, _, role, slots in c.nodes() if role == "master" and any(
        int(x.partition("-")[0]) <= slot <= int(x.partition("-")[2] or x) for x in slots))
    dst = next(p for p in c.masters() if p != src)
    c.node(dst).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", c.node_id(src))
    c.node(src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", c.node_id(dst))
    px = cenv.proxy([stream_conf(STREAMS[0])])
    w = cenv.worker(px.endpoint)
    r.xadd(STREAMS[0], {"payload": json.dumps({"eventId": key})})
    wait_for(lambda: w.keys() == [key], what="the delivery")
    wait_for(lambda: pending_total(r, STREAMS[:1]) == 0, what="the ack")
    # the done mark went to the importing node (ASK), not the source
    dn = c.node(dst)
    with dn.pipeline(transaction=False) as pipe:
        pipe.execute_command("ASKING")
        pipe.get(f"idem:{key}")
        assert (pipe.execute()[1] or "")[:1] == "D"
    assert c.node(src).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    for port in c.masters():
        c.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", c.node_id(dst))
    # a copy now: the proxy's map still says src, which answers MOVED
    r.xadd(STREAMS[0], {"payload": json.dumps({"eventId": key})})
    wait_for(lambda: pending_total(r, STREAMS[:1]) == 0 and px.metrics().get(
        f'idemproxy_entries_read_total{{stream="{STREAMS[0]}",group="g"}}') == 2, what="the copy")
    assert w.keys() == [key]
    m = px.metrics()
    assert m['idemproxy_redis_redirects_total{kind="ask"}'] >= 1
    assert m['idemproxy_redis_redirects_total{kind="moved"}'] >= 1
    assert m["idemproxy_redis_errors_total"] == 0


def run_producer(r, n, rate, stop):
    """Publish n entries at about 'rate' per second on a thread; every key twice."""
    keys = set()

    def go():
        i = 0
        while i < n and not stop.is_set():
            keys.update(produce(r, 20, start=i))
            i += 20
            time.sleep(20 / rate)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, keys


def test_three_replicas_through_a_resharding_and_a_failover(cenv):
    c = cenv.cluster
    r = cenv.r
    confs = [stream_conf(s, layout="split", hash_tag=True) for s in STREAMS]
    proxies = [cenv.proxy(confs, proc_env={"HOSTNAME": f"px{i}"}) for i in range(3)]
    workers = [cenv.worker(p.endpoint) for p in proxies]
    stop = threading.Event()
    t, keys = run_producer(r, 3000, 600, stop)
    time.sleep(1.0)
    m = c.masters()
    c.reshard(m[0], m[1], 2000)          # MOVED and ASK under load
    time.sleep(0.5)
    c.failover(m[2])                     # a replica promoted, coordinated: nothing lost
    t.join(timeout=60)
    assert not t.is_alive()
    wait_for(lambda: all_done(r, proxies, 3000), timeout=60, what="every entry done and acked")
    got = Counter(k for w in workers for k in w.keys())
    assert set(got) == keys
    assert max(got.values()) == 1, [k for k, n in got.items() if n > 1][:10]
    assert all(len(w.keys()) > 0 for w in workers), "every replica took a share"
    assert sum(p.metrics()['idemproxy_redis_redirects_total{kind="moved"}'] for p in proxies) > 0
    assert all(p.get("/readyz")[0] == 200 for p in proxies)


def test_master_killed(cenv):
    """kill -9 of a master: not ready while its slots have no master, no entry
    lost, and the acks the proxy holds through the outage are written once a
    replica is promoted, without delivering those keys again."""
    c = cenv.cluster
    r = cenv.r
    confs = [stream_conf(s, lease_ms=20000) for s in STREAMS]
    px = cenv.proxy(confs, timeout_ms=500, ack_timeout_ms=30000)
    w = cenv.worker(px.endpoint)
    keys = produce(r, 200)
    wait_for(lambda: all_done(r, [px], 200), timeout=30, what="the first entries")
    w.close()
    # three deliveries held by manual workers across the kill
    held = [cenv.worker(px.endpoint, manual=True) for _ in range(3)]
    more = produce(r, 6, start=200)
    wait_for(lambda: all(h.inbox for h in held), timeout=10, what="three deliveries in hand")
    victim = c.masters()[0]
    c.kill(victim)
    wait_for(lambda: px.get("/readyz")[0] == 503, timeout=10, what="not ready while a master is down")
    held_keys = [h.inbox[0].key for h in held]
    for h in held:
        h.answer(pb.Ack.ACK)                  # acks arrive while the cluster cannot write
    wait_for(c.served, timeout=30, what="a replica promoted")
    wait_for(lambda: px.get("/readyz")[0] == 200, timeout=15, what="ready again")
    wait_for(lambda: all((r.get(f"idem:{k}") or "")[:1] == "D" for k in held_keys), timeout=10,
             what="the held acks' done marks")
    for h in held:
        h.close()                           # manual workers would hold the next deliveries
    w2 = cenv.worker(px.endpoint)
    later = produce(r, 200, start=206)
    wait_for(lambda: all_done(r, [px], 406), timeout=30, what="every entry done after the failover")
    got = Counter(w.keys() + [k for h in held for k in h.keys()] + w2.keys())
    assert set(got) == keys | more | later   # nothing lost
    assert all(got[k] == 1 for k in held_keys), "a held ack was lost and its key delivered again"
    assert px.log_text().count("commands: cluster ready") >= 2


@pytest.mark.parametrize("dl", ["dlq:a", "x{orders}dlq", "d}lq", "{}dlq"])
def test_dead_letter_and_its_written_mark_share_a_slot(cenv, dl):
    """A dead letter is written by a script with its written-mark (written
    once, issue 15, 4): both keys must hash to the dead-letter stream's slot,
    whether its name has a hash tag, none, or a '}' that is not one."""
    r = cenv.r
    px = cenv.proxy([stream_conf(STREAMS[0], dead_letter=dl)])
    cenv.worker(px.endpoint)
    eid = r.xadd(STREAMS[0], {"payload": "{not json"})
    wait_for(lambda: r.xlen(dl) == 1, 20, "the dead letter")
    assert r.xrange(dl)[0][1]["idemproxy-entry-id"] == eid
    # By name: one node's view right after the cluster formed may still list a
    # replica as a master, whose copy of the mark is the same key.
    marks = sorted({k for port in cenv.cluster.masters()
                    for k in cenv.cluster.node(port).keys("idemproxy:dlw:*")})
    assert len(marks) == 1 and r.keyslot(marks[0]) == r.keyslot(dl), (marks, dl)
    assert px.metrics()["idemproxy_redis_errors_total"] == 0


def slot_owners(cluster):
    """{slot: master port}, from one CLUSTER NODES."""
    out = {}
    for port, _, role, slots in cluster.nodes():
        if role != "master":
            continue
        for x in slots:
            if not x.startswith("["):
                a, _, b = x.partition("-")
                for s in range(int(a), int(b or a) + 1):
                    out[s] = port
    return out


def keys_per_master(cluster, per, prefix, name=lambda k: f"idem:{k}"):
    """'per' keys whose dedup lock (name(k)) lives on each master: {port: [keys]}."""
    owners = slot_owners(cluster)
    out = {p: [] for p in set(owners.values())}
    i = 0
    while any(len(v) < per for v in out.values()):
        k = f"{prefix}{i}"
        i += 1
        p = owners[cluster.client.keyslot(name(k))]
        if len(out[p]) < per:
            out[p].append(k)
    return out


def test_one_master_down_keeps_healthy_leases(tmp_path):
    """Issue 15, item 11: with one master down for longer than lease_ms, the
    leases of keys on the healthy masters are still extended (their lock
    values stay ours), so the copies of those keys are never delivered. The
    failover is slow here (node timeout 4 s) and the lease short (1.5 s).
    With cluster-require-full-coverage yes (Redis' default) every master
    answers CLUSTERDOWN from the moment the dead one is marked FAIL until its
    replica is promoted, and no lease can be extended then (README, Known
    limits); the nodes here keep serving their own slots, so the whole outage
    is one the proxy must ride out."""
    d = tmp_path / "cluster"
    d.mkdir()
    c = RedisCluster(d, node_timeout=4000, extra=["--cluster-require-full-coverage", "no"])
    e = ClusterEnv(tmp_path, c)
    try:
        r = c.client
        owners = slot_owners(c)
        where = lambda name: owners[r.keyslot(name)]   # noqa: E731
        victim = min(set(owners.values()))   # a master with slots: a fresh replica may
                                             # still show as a master without any
        healthy_streams = [s for s in STREAMS if where(s) != victim]
        keys = keys_per_master(c, 2, "lease-")
        px = e.proxy([stream_conf(s, lease_ms=1500) for s in STREAMS], timeout_ms=300,
                     ack_timeout_ms=60000)
        gate = threading.Event()           # the worker is slow: it answers once the gate opens

        def slow(d):
            gate.wait(60)
            return pb.Ack.ACK, ""
        workers = [e.worker(px.endpoint, behave=slow) for _ in range(2)]
        wait_for(lambda: px.get("/readyz")[0] == 200, timeout=15, what="ready")
        every = [k for v in keys.values() for k in v]
        for i, k in enumerate(every):
            r.xadd(healthy_streams[i % len(healthy_streams)],
                   {"payload": json.dumps({"eventId": k, "n": 0})})
        lock = lambda k: c.node(where(f"idem:{k}")).get(f"idem:{k}")   # noqa: E731
        wait_for(lambda: all((lock(k) or "").startswith("L:") for k in every), timeout=15,
                 what="every key claimed")
        healthy = [k for p, v in keys.items() if p != victim for k in v]
        # a copy of each healthy key, on another stream: busy while we hold it
        for i, k in enumerate(healthy):
            r.xadd(healthy_streams[(i + 1) % len(healthy_streams)],
                   {"payload": json.dumps({"eventId": k, "n": 1})})
        wait_for(lambda: sum(int(px.metrics().get(f'idemproxy_entries_read_total{{stream="{s}",group="g"}}', 0))
                             for s in STREAMS) >= len(every) + len(healthy), timeout=10,
                 what="the copies read")
        before = {k: lock(k) for k in healthy}
        assert all(v and v.startswith("L:") for v in before.values()), before
        c.kill(victim)
        t0 = time.time()
        wait_for(lambda: px.get("/readyz")[0] == 503, timeout=5, what="not ready with a master down")
        time.sleep(max(0.0, t0 + 3.2 - time.time()))     # over twice the lease, the failover not done
        assert px.get("/readyz")[0] == 503, "the failover ended too early for this test"
        after = {k: lock(k) for k in healthy}
        assert after == before, "healthy leases lost while another master was down"
        wait_for(c.served, timeout=30, what="a replica promoted")
        wait_for(lambda: px.get("/readyz")[0] == 200, timeout=15, what="ready again")
        assert {k: lock(k) for k in healthy} == before, "healthy leases lost during the failover"
        gate.set()
        wait_for(lambda: all((lock(k) or "")[:1] == "D" for k in healthy), timeout=15, what="the healthy keys done")
        wait_for(lambda: pending_total(r, healthy_streams) == 0, timeout=20, what="the copies handled")
        time.sleep(0.5)
        got = Counter(k for w in workers for k in w.keys())
        assert all(got[k] == 1 for k in healthy), {k: got[k] for k in healthy}
    finally:
        e.close()
        c.stop()


def test_attempt_survives_a_restart_when_the_streams_node_is_slow(cenv):
    """Issue 15: in cluster mode the attempt could restart at 1. A restart
    replays this consumer's pending entries; their delivery counts (XPENDING,
    on the stream's master) become their attempts. On one server that reply
    comes before any claim's, on one connection; on a cluster the claim goes
    to another master and could be answered, and the entry delivered, first:
    attempt 1 again, and Redis' count set back to 1, so max_deliveries never
    ends a poison entry that crashes its consumer. The test hook holds the
    XPENDING back 1 s (a stream master slower than the lock's)."""
    r = cenv.r
    s = STREAMS[0]
    env = {"HOSTNAME": "px-attempt", "IDEMPROXY_DEBUG_COUNTS_DELAY_MS": 1000}
    px = cenv.proxy([stream_conf(s, max_deliveries=3, lease_ms=2000)], ack_timeout_ms=60000,
                    proc_env=env)
    w = cenv.worker(px.endpoint, behave=lambda d: None)       # never answers
    r.xadd(s, {"payload": json.dumps({"eventId": "poison"})})
    wait_for(lambda: len(w.got) == 1, timeout=15, what="the first delivery")
    attempts = [w.got[0].attempt]
    for _ in range(2):                    # the consumer's process crashes with it, twice
        px.kill9()
        # the restart comes after the dead process's lease ran out, so the
        # claim succeeds at once
        wait_for(lambda: r.get("idem:poison") is None, timeout=10, what="the old lease gone")
        px.start(**env)
        wait_for(lambda: len(w.got) == len(attempts) + 1, timeout=20, what="the delivery after a restart")
        attempts.append(w.got[-1].attempt)
    assert attempts == [1, 2, 3], attempts
    assert r.xpending_range(s, "g", "-", "+", 10)[0]["times_delivered"] == 3
    # the third restart: max_deliveries (3) reached, dead-lettered, not delivered again
    px.kill9()
    wait_for(lambda: r.get("idem:poison") is None, timeout=10, what="the old lease gone")
    px.start(**env)
    wait_for(lambda: pending_total(r, [s]) == 0, timeout=20, what="the poison entry ended")
    time.sleep(0.3)
    assert len(w.got) == 3


@pytest.mark.parametrize("layout,on_conflict", [("single", "dead_letter"), ("split", "dead_letter"),
                                                ("split", "skip")])
def test_fingerprint_conflict_across_masters(cenv, layout, on_conflict):
    """Issue 31 on a cluster: the copies of a key arrive on streams on other
    masters; the one with another payload is a conflict (dead-lettered, or
    with skip counted only), the true copy a duplicate, and lock and done
    keys (split, no hash tag) sit in other slots than the streams."""
    r = cenv.r
    s1, s2, s3 = STREAMS[0], STREAMS[3], STREAMS[5]
    px = cenv.proxy([stream_conf(s, layout=layout, fingerprint="#event", on_conflict=on_conflict,
                                 dead_letter="dlq:{0}") for s in (s1, s2, s3)])
    w = cenv.worker(px.endpoint)
    for i in range(20):
        r.xadd(s1, {"payload": json.dumps({"eventId": f"k{i}", "amount": 5})})
    wait_for(lambda: len(w.keys()) == 20, 30, "the originals delivered")
    done = "idem:" if layout == "single" else "done:"
    wait_for(lambda: all(r.exists(f"{done}k{i}") for i in range(20)), 10, "the originals done")
    for i in range(20):
        r.xadd(s2, {"payload": json.dumps({"amount": 5, "eventId": f"k{i}"})})   # true copies
        r.xadd(s3, {"payload": json.dumps({"eventId": f"k{i}", "amount": 999})})  # conflicts

    def counted():
        m = px.metrics()
        return sum(m.get(f'idemproxy_conflicts_total{{stream="{s}",group="g"}}', 0) for s in (s2, s3))
    wait_for(lambda: counted() == 20, 30, "every conflict counted")
    wait_for(lambda: all(r.xpending(s, "g")["pending"] == 0 for s in (s1, s2, s3)), 15, "all acked")
    assert Counter(w.keys()) == Counter({f"k{i}": 1 for i in range(20)})
    m = px.metrics()
    assert m[f'idemproxy_conflicts_total{{stream="{s2}",group="g"}}'] == 0
    assert m[f'idemproxy_outcomes_total{{stream="{s2}",group="g",outcome="duplicate"}}'] == 20
    out = "dead_lettered" if on_conflict == "dead_letter" else "duplicate"
    assert m[f'idemproxy_outcomes_total{{stream="{s3}",group="g",outcome="{out}"}}'] == 20
    if on_conflict == "dead_letter":
        reasons = [f["idemproxy-reason"] for _, f in r.xrange("dlq:{0}")]
        assert len(reasons) == 20 and all(x.startswith("conflict: fingerprint ") for x in reasons)
    else:
        assert not r.exists("dlq:{0}")


def op(*args, timeout=120):
    """An operator command (inspect, redrive) run with the binary under test."""
    import subprocess
    from pxtest import BIN
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout)


def test_inspect_and_redrive_on_a_cluster(cenv):
    """inspect and redrive with a redis.cluster config: each command goes to
    the master of its key's slot. The stream, its dead-letter stream and the
    done marks sit on different masters, so a redrive cannot be one script:
    it is done in steps under a claim (ops.c, redrive_steps)."""
    r, c = cenv.r, cenv.cluster
    assert len({owner(c, "room"), owner(c, "room:dlq")}) == 2
    mode = {"drop": True}

    def behave(d):
        return (pb.Ack.DROP, "downstream down") if mode["drop"] else (pb.Ack.ACK, "")
    px = cenv.proxy([stream_conf("room", dead_letter="room:dlq")])
    w = cenv.worker(px.endpoint, behave=behave)
    keys = [f"k{i}" for i in range(6)]
    assert len({owner(c, f"idem:{k}") for k in keys}) == 3       # done marks on every master
    ids = [r.xadd("room", {"payload": json.dumps({"eventId": k})}) for k in keys]
    wait_for(lambda: r.xlen("room:dlq") == 6, 20, "six dead letters")
    wait_for(lambda: all((r.get(f"idem:{k}") or "")[:1] == "D" for k in keys), 20, "done marks")
    cfg = ("-c", str(px.config), "--stream", "room")

    res = op("inspect", *cfg, "--entry", ids[0], "--json")
    assert res.returncode == 0, res.stderr
    o = json.loads(res.stdout)
    assert o["entry"]["fields"] == {"payload": json.dumps({"eventId": "k0"})}
    assert o["key"]["key"] == "k0" and o["key"]["done"] is True
    assert [d["reason"] for d in o["dead_letters"]] == ["downstream down"]
    assert o["dead_letter_mark"] is not None
    res = op("inspect", *cfg, "--key", "k3")
    assert res.returncode == 0 and "state: done" in res.stdout, res.stdout + res.stderr

    mode["drop"] = False
    res = op("redrive", *cfg, "--entry", ids[0])
    assert res.returncode == 0, res.stderr
    assert "redriven 1, skipped 0 (5 dead letters not selected)" in res.stdout
    assert r.xlen("room:dlq") == 5 and r.xlen("room") == 7
    wait_for(lambda: [d.key for d in w.got].count("k0") == 2, 20, "k0 handled again")
    res = op("redrive", *cfg)
    assert res.returncode == 0 and "redriven 5, skipped 0" in res.stdout, res.stdout + res.stderr
    wait_for(lambda: all([d.key for d in w.got].count(k) == 2 for k in keys), 20, "each handled again")
    wait_for(lambda: pending_total(r, ["room"]) == 0, 20, "nothing pending")
    assert r.xlen("room:dlq") == 0 and r.xlen("room") == 12
    assert all((r.get(f"idem:{k}") or "")[:1] == "D" for k in keys)
    assert [k for port in c.masters() for k in c.node(port).keys("idemproxy:redrive:*")] == []
    res = op("keys", *cfg, "--json")                        # keys reads the cluster too
    assert res.returncode == 0, res.stderr
    o = json.loads(res.stdout)
    assert o["entries"] == 12 and o["distinct_keys"] == 6

    # --purge: two more dead letters, listed by a dry run, then deleted, not handled again
    mode["drop"] = True
    more = [r.xadd("room", {"payload": json.dumps({"eventId": f"p{i}"})}) for i in range(2)]
    wait_for(lambda: r.xlen("room:dlq") == 2, 20, "two dead letters")
    res = op("redrive", *cfg, "--purge", "--dry-run")
    assert res.returncode == 0 and "would purge 2" in res.stdout and more[1] in res.stdout
    assert r.xlen("room:dlq") == 2
    res = op("redrive", *cfg, "--purge")
    assert res.returncode == 0 and "purged 2, skipped 0" in res.stdout, res.stdout + res.stderr
    assert r.xlen("room:dlq") == 0 and r.xlen("room") == 14
    assert [d.key for d in w.got].count("p0") == 1


@pytest.mark.parametrize("stream,dl,reason", [
    ("room", "room:dlq", "dropped"),      # three slots: in steps, under a claim
    ("{room}", "{room}:dlq", "busy"),     # one slot, no done mark to clear: the one script
])
def test_two_redrives_at_once_on_a_cluster_redrive_each_dead_letter_once(cluster, tmp_path,
                                                                           stream, dl, reason):
    r = cluster.client
    n = 400
    for i in range(n):
        r.xadd(dl, {"payload": json.dumps({"eventId": f"d{i}"}), "n": str(i),
                    "idemproxy-reason": reason, "idemproxy-stream": stream,
                    "idemproxy-entry-id": f"1-{i}", "idemproxy-attempts": "1"})
        r.set(f"idem:d{i}", "D", px=600000)
    cfg = tmp_path / "op.yaml"
    cfg.write_text(f"redis:\n  cluster: [{', '.join(cluster.seeds[:2])}]\nmetrics:\n  listen: \"\"\n"
                   f"streams:\n  - stream: '{stream}'\n    payload_field: payload\n    dead_letter: '{dl}'\n")
    go = threading.Barrier(2)
    results = [None, None]

    def one(i):
        go.wait()
        results[i] = op("redrive", "-c", str(cfg), "--stream", stream)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for res in results:
        assert res.returncode == 0, res.stderr
    added = [f["n"] for _, f in r.xrange(stream)]
    assert sorted(added, key=int) == [str(i) for i in range(n)]     # each exactly once
    assert set(r.xrange(stream, count=1)[0][1]) == {"payload", "n"}
    assert r.xlen(dl) == 0
    # the done marks dead-lettering wrote are cleared; a busy refusal wrote none: those stay
    assert sum(r.exists(f"idem:d{i}") for i in range(n)) == (n if reason == "busy" else 0)
    assert sum(int(res.stdout.rsplit("redriven ", 1)[1].split(",")[0]) for res in results) == n
    assert [k for port in cluster.masters() for k in cluster.node(port).keys("idemproxy:redrive:*")] == []


@pytest.fixture
def small_cluster(tmp_path):
    """Three masters, no replicas: enough for the operator commands."""
    d = tmp_path / "small"
    d.mkdir()
    c = RedisCluster(d, replicas=0)
    yield c
    c.stop()


def hand_dead_letter(r, stream, dl, key, n=0, reason="dropped"):
    """A dead letter as the daemon writes it, and the done mark it wrote."""
    i = r.xadd(dl, {"payload": json.dumps({"eventId": key}), "n": str(n), "idemproxy-reason": reason,
                    "idemproxy-stream": stream, "idemproxy-entry-id": f"1-{n}",
                    "idemproxy-attempts": "1"})
    r.set(f"idem:{key}", "D1", px=600000)
    return i


def op_config(cluster, tmp_path, stream, dl):
    cfg = tmp_path / "op.yaml"
    cfg.write_text(f"redis:\n  cluster: [{', '.join(cluster.seeds[:2])}]\nmetrics:\n  listen: \"\"\n"
                   f"streams:\n  - stream: '{stream}'\n    payload_field: payload\n    dead_letter: '{dl}'\n")
    return ("-c", str(cfg), "--stream", stream)


def claims(cluster):
    return [(port, k) for port in cluster.masters() for k in cluster.node(port).keys("idemproxy:redrive:*")]


def test_purge_leaves_a_dead_letter_a_cluster_redrive_has_claimed(small_cluster, tmp_path):
    """A redrive in steps holds a claim on the dead letter while it clears
    the done mark and adds the entry back: a purge then must not delete the
    dead letter as well (purged and redriven at once, the done mark the purge
    says it keeps cleared). It skips it, as the one script would."""
    c, r = small_cluster, small_cluster.client
    cfg = op_config(c, tmp_path, "room", "room:dlq")
    dlid = hand_dead_letter(r, "room", "room:dlq", "k0")
    keep = hand_dead_letter(r, "room", "room:dlq", "k1", n=1)
    # another run between its claim and its last step (the name: commit.c)
    r.set(f"idemproxy:redrive:{{room:dlq}}:room:dlq:{dlid}", "host:1:1", px=600000)
    res = op("redrive", *cfg, "--purge")
    assert res.returncode == 0, res.stderr
    assert "purged 1, skipped 1" in res.stdout, res.stdout
    assert [i for i, _ in r.xrange("room:dlq")] == [dlid] and f"purged {keep}" in res.stdout
    assert f"purged {dlid}" not in res.stdout and f"skip {dlid}" in res.stdout


def test_a_half_redriven_dead_letter_is_not_redriven_again(small_cluster, tmp_path):
    """A cluster redrive that stops after adding the entry back (killed, or
    its last step's reply lost) leaves the dead letter and its claim. A
    claim that then runs out lets a later run add the entry a second time:
    once the entry may be back, the claim stays until an operator looks."""
    c, r = small_cluster, small_cluster.client
    k = next(f"k{i}" for i in range(20)                 # three slots on three masters
             if len({owner(c, "room"), owner(c, "room:dlq"), owner(c, f"idem:k{i}")}) == 3)
    cfg = op_config(c, tmp_path, "room", "room:dlq")
    hand_dead_letter(r, "room", "room:dlq", k)
    for port in c.masters():                    # the last step (XDEL) refused: the run stops there
        c.node(port).execute_command("ACL", "SETUSER", "default", "-xdel")
    try:
        res = op("redrive", *cfg)
    finally:
        for port in c.masters():
            c.node(port).execute_command("ACL", "SETUSER", "default", "+xdel")
    assert res.returncode == 1 and "half redriven" in res.stderr, res.stdout + res.stderr
    assert r.xlen("room") == 1 and r.xlen("room:dlq") == 1 and not r.exists(f"idem:{k}")
    # ten minutes later: a claim that expires has expired
    for port, k in claims(c):
        if c.node(port).pttl(k) > 0:
            c.node(port).pexpire(k, 1)
    time.sleep(0.05)
    res = op("redrive", *cfg)
    assert res.returncode == 0, res.stderr
    assert r.xlen("room") == 1, "the entry was added back twice"
    assert "redriven 0, skipped 1" in res.stdout and "half redriven" in res.stderr, res.stdout + res.stderr
    assert r.xlen("room:dlq") == 1


def test_a_run_that_stalls_past_its_claim_does_nothing_more(small_cluster, tmp_path):
    """A run that stalls (stopped, swapped out) between taking its claim and
    the next step, past the claim's 10 minutes: another run takes the dead
    letter, adds the entry back, and the entry is handled again (a new done
    mark). When the first run goes on, it must neither clear that done mark
    (a copy would then be delivered once more) nor add the entry again."""
    import os
    import signal
    import subprocess
    from pxtest import BIN
    c, r = small_cluster, small_cluster.client
    k = next(f"k{i}" for i in range(20)
             if len({owner(c, "room"), owner(c, "room:dlq"), owner(c, f"idem:k{i}")}) == 3)
    cfg = op_config(c, tmp_path, "room", "room:dlq")
    slow = tmp_path / "slow.yaml"                 # its replies may wait while it is stopped
    slow.write_text(open(cfg[1]).read().replace("redis:\n", "redis:\n  timeout_ms: 20000\n", 1)
                    + "    lease_ms: 50000\n")
    hand_dead_letter(r, "room", "room:dlq", k)
    dl_master = c.node(owner(c, "room:dlq"))
    dl_master.execute_command("CLIENT", "PAUSE", "30000", "WRITE")   # its claim waits here
    a = subprocess.Popen([str(BIN), "redrive", "-c", str(slow), "--stream", "room"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(cl.get("cmd") == "eval" and "b" in cl.get("flags", "")
                             for cl in dl_master.client_list()), 20, "the claim sent, held")
        os.kill(a.pid, signal.SIGSTOP)
        dl_master.execute_command("CLIENT", "UNPAUSE")
        wait_for(lambda: claims(c), 10, "the claim taken")
        for port, name in claims(c):              # ten minutes later
            c.node(port).pexpire(name, 1)
        wait_for(lambda: not claims(c), 10, "the claim expired")
        res = op("redrive", *cfg)
        assert res.returncode == 0 and "redriven 1" in res.stdout, res.stdout + res.stderr
        r.set(f"idem:{k}", "D:handled-again", px=600000)   # the daemon handled it again
    finally:
        os.kill(a.pid, signal.SIGCONT)
        dl_master.execute_command("CLIENT", "UNPAUSE")
    out, err = a.communicate(timeout=60)
    assert r.xlen("room") == 1, "the entry was added back twice\n" + out + err
    assert r.get(f"idem:{k}") == "D:handled-again", "the stalled run cleared a later done mark"
