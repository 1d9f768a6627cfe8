"""The guarantee (docs/guarantee.md) under faults: nothing lost, nothing
twice (apart from what was in
flight at a fault). Each scenario asserts on what the workers received and
what Redis holds, and prints: entries, keys, delivered, re-delivered, lost.
`make test` runs the fast sizes; `make test-fault` (FAULT_FULL=1) the full ones."""
import json
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from collections import Counter

from faultlib import Faults, Ledger, check, done_keys, size, wait_all_done, worker, workload
from pxtest import pb, pending, wait_for


def group_conf(**kw):
    # claim_idle_ms at least 3 x redis.timeout_ms (1000 by default; docs/configuration.md)
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "claim_idle_ms": 3000, "retry_backoff_ms": 50}
    s.update(kw)
    return s


def test_1_proxy_killed_mid_batch_and_restarted(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(2000, 400))
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=1)
    p = env.proxy([group_conf()], endpoint=ep, max_inflight=32, log_level="info")
    wait_for(lambda: len(w.lines()) >= len(set(keys)) // 3, timeout=60, what="a third handled")
    faults = Faults(r)
    faults.inject("kill -9 proxy", p.kill9, [w])
    env.proxy([group_conf()], endpoint=ep, max_inflight=32, log_level="info")   # same consumer: replays its history
    wait_all_done(r, keys)
    check("1 kill -9 proxy mid-batch", r, keys, ledger, [w], faults=faults)


def test_2_worker_killed_mid_handling(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(1500, 300))
    ep = env.endpoint()
    w1 = worker(env, ledger, ep, WORKER_DELAY_MS=5)
    w2 = worker(env, ledger, ep, WORKER_DELAY_MS=5)
    env.proxy([group_conf()], endpoint=ep, max_inflight=16, ack_timeout_ms=1000, log_level="info")
    wait_for(lambda: len(w1.lines()) >= 20, timeout=60, what="worker 1 busy")
    faults = Faults(r)
    faults.inject("kill -9 worker 1", w1.kill9, [w1], settle=0)
    wait_all_done(r, keys)
    # What w1 held when it died timed out and went to w2: only that may come twice.
    check("2 kill -9 worker mid-handling", r, keys, ledger, [w1, w2], faults=faults)


def test_3_redis_connections_killed_paused_and_restarted(env):
    srv = env.redis
    srv.stop()
    srv.start(["--appendonly", "yes", "--appendfsync", "always"])
    r, ledger = srv.client, Ledger(env.tmp)
    keys = workload(r, size(1500, 300))
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=2)
    p = env.proxy([group_conf()], endpoint=ep, max_inflight=32, timeout_ms=300, log_level="info")
    wait_for(lambda: len(w.lines()) >= 10, timeout=30, what="started")
    faults = Faults(r)
    for i in range(5):                                    # connections killed, repeatedly
        faults.inject(f"CLIENT KILL {i + 1}", lambda: r.execute_command(
            "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"), [w], settle=0)
        time.sleep(0.2)

    def pause():              # frozen past timeout_ms; in flight: what arrived until it thaws
        t0 = time.time()
        r.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        wait_for(lambda: p.get("/readyz")[0] == 503, timeout=5, what="/readyz reports the outage")
        time.sleep(max(0, t0 + 1.5 - time.time()))
    faults.inject("CLIENT PAUSE 1.5 s", pause, [w], settle=0)
    time.sleep(0.1)
    faults.inject("kill -9 redis", srv.stop, [w], settle=0.5)
    srv.start(["--appendonly", "yes", "--appendfsync", "always"])   # restarted with its AOF
    r = srv.client
    wait_all_done(r, keys, timeout=90)
    wait_for(lambda: p.get("/readyz")[0] == 200, timeout=10, what="ready again")
    check("3 redis killed/paused/restarted", r, keys, ledger, [w], faults=faults)


def test_4_slow_worker_and_stalled_replica(env):
    """A worker slower than lease_ms keeps its key (the lease is extended); a
    replica stopped past its lease loses it to another with a higher token."""
    r, ledger = env.r, Ledger(env.tmp)
    n = size(1000, 200)
    keys = workload(r, n)
    conf = [{"stream": "room", "payload_field": "payload", "fencing": True, "lease_ms": 2000}]
    ep1, ep2 = env.endpoint(), env.endpoint()
    slow = sorted(set(keys))[:3]
    w1 = worker(env, ledger, ep1, WORKER_SLOW_KEYS=",".join(slow), WORKER_SLOW_MS=4500)
    w2 = worker(env, ledger, ep2, WORKER_SLOW_KEYS=",".join(slow), WORKER_SLOW_MS=4500)
    env.proxy(conf, endpoint=ep1, max_inflight=16, ack_timeout_ms=20000, log_level="info")
    env.proxy(conf, endpoint=ep2, max_inflight=16, ack_timeout_ms=20000, log_level="info")
    wait_all_done(r, keys, groups=(), timeout=60)
    check("4a worker slower than lease_ms", r, keys, ledger, [w1, w2], groups=())   # no fault: no double

    for p in env.proxies:                 # part b has replicas of its own
        p.stop()
    # kill -STOP replica 1 while its worker holds a key, past the lease.
    key = "stalled-1"
    r.xadd("room", {"payload": '{"eventId": "stalled-1"}'})
    p3 = env.proxy(conf, max_inflight=4, ack_timeout_ms=20000, log_level="info")
    w3 = env.worker(p3.endpoint, manual=True)
    wait_for(lambda: w3.inbox, what="delivery to the replica that will stall")
    t1 = w3.got[0].fencing_token
    faults = Faults(r)
    faults.inject("kill -STOP replica past its lease", lambda: os.kill(p3.proc.pid, signal.SIGSTOP), [w3])
    assert faults.log[-1][1] == {key}
    wait_for(lambda: not r.exists("idem:" + key), timeout=5, what="lease expiry")
    # Another replica reads the stream again from 0 and takes it over.
    p4 = env.proxy(conf, max_inflight=4, log_level="info")
    w4 = env.worker(p4.endpoint, manual=True)
    wait_for(lambda: any(d.key == key for d in w4.got), timeout=15, what="taken over")
    t2 = [d.fencing_token for d in w4.got if d.key == key][0]
    assert t2 > t1
    w4.answer(pb.Ack.ACK)
    wait_for(lambda: (r.get("idem:" + key) or "")[:1] == "D", what="done by the new holder")
    os.kill(p3.proc.pid, signal.SIGCONT)
    w3.answer(pb.Ack.ACK)                 # the late ack of the stale holder
    p3.wait_log("lease lost")
    assert (r.get("idem:" + key) or "")[:1] == "D"
    print(f"\n4b stalled replica: token {t1} lost to {t2}; late ack written as done, lease_lost counted")
    assert [d.key for d in w3.got + w4.got] == [key, key]
    check("4b stalled replica", r, [key], ledger, [w3, w4], groups=(), faults=faults,
          acked=Counter({key: 2}))


def test_5_many_replicas_killed_and_restarted(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(3000, 600))
    rnd = random.Random(5)
    glconf = [{"stream": "room", "payload_field": "payload", "key": "#event.eventId"}]
    replicas = []   # (conf, endpoint, proxy)
    workers = []
    for i in range(5):
        ep = env.endpoint()
        workers.append(worker(env, ledger, ep, WORKER_DELAY_MS=1))
        replicas.append((glconf, ep, env.proxy(glconf, endpoint=ep, max_inflight=8, log_level="warn")))
    for i in range(3):
        conf = [group_conf(consumer=f"gc{i}")]
        ep = env.endpoint()
        workers.append(worker(env, ledger, ep, WORKER_DELAY_MS=1))
        replicas.append((conf, ep, env.proxy(conf, endpoint=ep, max_inflight=8, log_level="warn")))
    kills = size(8, 5)
    faults = Faults(r)
    for k in range(kills):
        time.sleep(rnd.uniform(0.2, 0.6))
        i = rnd.randrange(len(replicas))
        conf, ep, p = replicas[i]
        faults.inject(f"kill -9 replica {i}", p.kill9, [workers[i]])   # each replica has its own worker
        replicas[i] = (conf, ep, env.proxy(conf, endpoint=ep, max_inflight=8, log_level="warn"))
    wait_all_done(r, keys, timeout=120)
    check(f"5 eight replicas, {kills} kills", r, keys, ledger, workers, faults=faults)


def test_6_trimmed_deleted_group_recreated_scripts_flushed(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(1500, 300))
    # Entries read by a dead consumer, then deleted while pending: done before
    # the proxy starts, so that it cannot read them first.
    r.xgroup_create("room", "g", "0")
    dead = r.xreadgroup("g", "dead-pod", {"room": ">"}, count=5)
    gone = [eid for eid, _ in dead[0][1]]
    assert len(gone) == 5 and r.xdel("room", *gone) == 5
    assert r.xpending("room", "g")["pending"] == 5
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=2)
    p = env.proxy([group_conf(layout="split")], endpoint=ep, max_inflight=16, log_level="info")
    wait_for(lambda: len(w.lines()) >= 20, timeout=30, what="started")
    faults = Faults(r, prefix="done:")
    faults.inject("SCRIPT FLUSH", r.script_flush, [w], settle=0)
    # XAUTOCLAIM finds them deleted (after claim_idle_ms) and acks them away
    p.wait_log("trimmed or deleted", timeout=15)
    wait_for(lambda: not [e for e in r.xpending_range("room", "g", "-", "+", 100)
                          if e["consumer"] == "dead-pod"], timeout=15, what="every deleted entry acked away")
    faults.inject("group deleted (re-created by the proxy)", lambda: r.xgroup_destroy("room", "g"), [w],
                  settle=0)
    faults.inject("SCRIPT FLUSH again", r.script_flush, [w], settle=0)
    wait_for(lambda: any(g["name"] == "g" for g in r.xinfo_groups("room")), timeout=15,
             what="the group re-created")
    # What is left in the stream must all be handled; deleted entries are gone.
    live_keys = [json.loads(f["payload"])["eventId"] for _, f in r.xrange("room")]
    wait_all_done(r, live_keys, prefix="done:", timeout=90)
    check("6 trim/delete/group re-created/SCRIPT FLUSH", r, live_keys, ledger, [w], prefix="done:",
          faults=faults)


def test_7_sigterm_with_deliveries_in_flight(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(1200, 300))
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=20)
    p = env.proxy([group_conf(lease_ms=30000)], endpoint=ep, max_inflight=16, shutdown_grace_ms=300,
                  ack_timeout_ms=30000, log_level="info")
    wait_for(lambda: len(w.lines()) >= 30, timeout=30, what="busy")
    faults = Faults(r)
    assert faults.inject("SIGTERM", p.stop, [w]) == 0
    # Released, not stuck: locks of what was not finished are gone at once.
    held = [k for k in r.scan_iter("idem:*") if r.get(k).startswith("L:")]
    assert held == [], held
    env.proxy([group_conf(lease_ms=30000)], endpoint=ep, max_inflight=16, log_level="info")
    wait_all_done(r, keys, timeout=90)
    check("7 SIGTERM with deliveries in flight", r, keys, ledger, [w], faults=faults)


def test_8_garbage_on_the_socket(env, tmp_path):
    """Bad replies are RETRYs; a huge reply or a REQ peer costs that peer its
    connection, never the daemon; the ipc socket's mode keeps others out."""
    import pynng
    r = env.r
    p = env.proxy([group_conf(max_deliveries=100)], max_inflight=8, ack_timeout_ms=1000, log_level="info")
    n = size(1000, 200)
    keys = workload(r, n)
    garbage = [b"\xff\xfe\xfd", b"\x08", b"\x08\x07", b"x" * (2 << 20)]
    faults, acked, state, seen = Faults(r), Counter(), {}, []

    def behave(d):                    # the first four answers are garbage: faults
        seen.append(d.key)            # (w_bad may not be bound yet: the answers can come first)
        if garbage:
            faults.add(f"garbage reply to {d.key}", [d.key])
            if len(garbage) == 1:     # the 2 MiB reply also costs the worker its connection
                state["done_before"] = done_keys(r, set(seen))
            return garbage.pop(0)
        acked[d.key] += 1
        return (pb.Ack.ACK, "")
    w_bad = env.worker(p.endpoint, behave=behave)
    req = pynng.Req0(dial=p.endpoint, send_timeout=500, recv_timeout=500)  # the wrong protocol
    try:
        req.send(b"hello")
    except pynng.NNGException:
        pass
    wait_for(lambda: not garbage, what="every garbage answer sent")
    time.sleep(0.5)                   # what the dropped connection held arrives or is lost
    faults.add("2 MiB reply: connection dropped", set(w_bad.received()) - state["done_before"])
    wait_all_done(r, keys, timeout=60)
    assert p.proc.poll() is None
    assert "invalid reply" in p.log_text()
    check("8 garbage replies, a REQ peer", r, keys, None, [w_bad], faults=faults, acked=acked)
    req.close()
    mode = os.stat(p.endpoint[len("ipc://"):]).st_mode & 0o777
    assert mode == 0o660


def _sp_handshake(proto):
    return b"\x00SP\x00" + struct.pack(">H", proto) + b"\x00\x00"


def test_8b_malformed_ipc_frames_close_their_connection_only(env, tmp_path):
    """A wrong handshake, and an ipc frame whose type byte is not 1 (nanomsg
    1.1.5 aborted the whole daemon on that one, sipc.c), each close the peer's
    connection; the daemon lives on and still delivers to a good worker."""
    r = env.r
    p = env.proxy([group_conf()], log_level="info")
    path = p.endpoint[len("ipc://"):]
    wait_for(lambda: os.path.exists(path), what="socket")
    # A wrong handshake is refused (connection closed), the daemon lives on.
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"\x00SP\x00\x00\x99\x00\x00")
    s.settimeout(5)
    s.recv(8)  # our header
    assert s.recv(1) == b"", "a peer that is not REP keeps its connection"
    s.close()
    assert p.proc.poll() is None
    # A REP handshake then a frame of type 2: that connection is closed.
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(_sp_handshake(49))
    s.settimeout(5)
    assert s.recv(8)[:4] == b"\x00SP\x00"
    s.sendall(b"\x02" + struct.pack(">Q", 4) + b"abcd")
    assert s.recv(1) == b"", "an ipc frame of type 2 left its connection open"
    s.close()
    time.sleep(0.2)
    assert p.proc.poll() is None, "the daemon died of a malformed ipc frame"
    keys = workload(r, 20)
    w = env.worker(p.endpoint)
    wait_all_done(r, keys, timeout=30)
    assert set(w.received()) >= set(keys)
    print("\n8b malformed ipc frame (type byte 2): its connection closed, the daemon delivers on")
