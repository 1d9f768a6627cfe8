"""SPEC 5.7 under faults: nothing lost, nothing twice (apart from what was in
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

from faultlib import Ledger, check, size, wait_all_done, worker, workload
from pxtest import pb, pending, wait_for


def group_conf(**kw):
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "claim_idle_ms": 1000, "retry_backoff_ms": 50}
    s.update(kw)
    return s


def test_1_proxy_killed_mid_batch_and_restarted(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(2000, 400))
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=1)
    p = env.proxy([group_conf()], endpoint=ep, max_inflight=32, log_level="info")
    wait_for(lambda: len(w.lines()) >= len(set(keys)) // 3, timeout=60, what="a third handled")
    p.kill9()
    env.proxy([group_conf()], endpoint=ep, max_inflight=32, log_level="info")   # same consumer: replays its history
    wait_all_done(r, keys)
    check("1 kill -9 proxy mid-batch", r, keys, ledger, [w], allowance=32)


def test_2_worker_killed_mid_handling(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(1500, 300))
    ep = env.endpoint()
    w1 = worker(env, ledger, ep, WORKER_DELAY_MS=5)
    w2 = worker(env, ledger, ep, WORKER_DELAY_MS=5)
    env.proxy([group_conf()], endpoint=ep, max_inflight=16, ack_timeout_ms=1000, log_level="info")
    wait_for(lambda: len(w1.lines()) >= 20, timeout=60, what="worker 1 busy")
    w1.kill9()
    wait_all_done(r, keys)
    # What w1 held when it died timed out and went to w2.
    check("2 kill -9 worker mid-handling", r, keys, ledger, [w1, w2], allowance=16)


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
    for _ in range(5):                                    # connections killed, repeatedly
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        time.sleep(0.2)
    r.execute_command("CLIENT", "PAUSE", 1500, "ALL")     # frozen past timeout_ms
    wait_for(lambda: p.get("/readyz")[0] == 503, timeout=5, what="/readyz reports the outage")
    time.sleep(1.6)
    srv.stop()                                            # kill -9, then restart with its AOF
    time.sleep(0.5)
    srv.start(["--appendonly", "yes", "--appendfsync", "always"])
    r = srv.client
    wait_all_done(r, keys, timeout=90)
    wait_for(lambda: p.get("/readyz")[0] == 200, timeout=10, what="ready again")
    check("3 redis killed/paused/restarted", r, keys, ledger, [w], allowance=64)


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
    check("4a worker slower than lease_ms", r, keys, ledger, [w1, w2], groups=(), allowance=0)

    for p in env.proxies:                 # part b has replicas of its own
        p.stop()
    # kill -STOP replica 1 while its worker holds a key, past the lease.
    key = "stalled-1"
    r.xadd("room", {"payload": '{"eventId": "stalled-1"}'})
    p3 = env.proxy(conf, max_inflight=4, ack_timeout_ms=20000, log_level="info")
    w3 = env.worker(p3.endpoint, manual=True)
    wait_for(lambda: w3.inbox, what="delivery to the replica that will stall")
    t1 = w3.got[0].fencing_token
    os.kill(p3.proc.pid, signal.SIGSTOP)
    wait_for(lambda: not r.exists("idem:" + key), timeout=5, what="lease expiry")
    # Another replica reads the stream again from 0 and takes it over.
    p4 = env.proxy(conf, max_inflight=4, log_level="info")
    w4 = env.worker(p4.endpoint, manual=True)
    wait_for(lambda: any(d.key == key for d in w4.got), timeout=15, what="taken over")
    t2 = [d.fencing_token for d in w4.got if d.key == key][0]
    assert t2 > t1
    w4.answer(pb.Ack.ACK)
    wait_for(lambda: r.get("idem:" + key) == "D", what="done by the new holder")
    os.kill(p3.proc.pid, signal.SIGCONT)
    w3.answer(pb.Ack.ACK)                 # the late ack of the stale holder
    p3.wait_log("lease lost")
    assert r.get("idem:" + key) == "D"
    print(f"4b stalled replica: token {t1} lost to {t2}; late ack written as done, lease_lost counted")


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
    for k in range(kills):
        time.sleep(rnd.uniform(0.2, 0.6))
        i = rnd.randrange(len(replicas))
        conf, ep, p = replicas[i]
        p.kill9()
        replicas[i] = (conf, ep, env.proxy(conf, endpoint=ep, max_inflight=8, log_level="warn"))
    wait_all_done(r, keys, timeout=120)
    check(f"5 eight replicas, {kills} kills", r, keys, ledger, workers, allowance=kills * 8)


def test_6_trimmed_deleted_group_recreated_scripts_flushed(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(1500, 300))
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=2)
    p = env.proxy([group_conf(layout="split")], endpoint=ep, max_inflight=16, log_level="info")
    wait_for(lambda: len(w.lines()) >= 20, timeout=30, what="started")
    # Entries read by a dead consumer, then deleted while pending.
    dead = r.xreadgroup("g", "dead-pod", {"room": ">"}, count=5)
    gone = [eid for eid, _ in dead[0][1]] if dead else []
    if gone:
        r.xdel("room", *gone)
    r.script_flush()
    if gone:   # XAUTOCLAIM finds them deleted (after claim_idle_ms) and acks them away
        p.wait_log("trimmed or deleted", timeout=15)
    r.xgroup_destroy("room", "g")                         # the group deleted and re-created
    r.script_flush()
    # What is left in the stream must all be handled; deleted entries are gone.
    live_keys = [json.loads(f["payload"])["eventId"] for _, f in r.xrange("room")]
    wait_all_done(r, live_keys, prefix="done:", timeout=90)
    check("6 trim/delete/group re-created/SCRIPT FLUSH", r, live_keys, ledger, [w], prefix="done:",
          allowance=16)


def test_7_sigterm_with_deliveries_in_flight(env):
    r, ledger = env.r, Ledger(env.tmp)
    keys = workload(r, size(1200, 300))
    ep = env.endpoint()
    w = worker(env, ledger, ep, WORKER_DELAY_MS=20)
    p = env.proxy([group_conf(lease_ms=30000)], endpoint=ep, max_inflight=16, shutdown_grace_ms=300,
                  ack_timeout_ms=30000, log_level="info")
    wait_for(lambda: len(w.lines()) >= 30, timeout=30, what="busy")
    assert p.stop() == 0
    # Released, not stuck: locks of what was not finished are gone at once.
    held = [k for k in r.scan_iter("idem:*") if r.get(k).startswith("L:")]
    assert held == [], held
    env.proxy([group_conf(lease_ms=30000)], endpoint=ep, max_inflight=16, log_level="info")
    wait_all_done(r, keys, timeout=90)
    check("7 SIGTERM with deliveries in flight", r, keys, ledger, [w], allowance=16)


def test_8_garbage_on_the_socket(env, tmp_path):
    """Bad replies are RETRYs; a huge reply or a REQ peer costs that peer its
    connection, never the daemon; the ipc socket's mode keeps others out."""
    import pynng
    r = env.r
    p = env.proxy([group_conf(max_deliveries=100)], max_inflight=8, ack_timeout_ms=1000, log_level="info")
    n = size(1000, 200)
    keys = workload(r, n)
    answers = iter([b"\xff\xfe\xfd", b"\x08", b"\x08\x07", b"x" * (2 << 20)])
    w_bad = env.worker(p.endpoint, behave=lambda d: next(answers, None) or (pb.Ack.ACK, ""))
    req = pynng.Req0(dial=p.endpoint, send_timeout=500, recv_timeout=500)  # the wrong protocol
    try:
        req.send(b"hello")
    except pynng.NNGException:
        pass
    wait_all_done(r, keys, timeout=60)
    assert p.proc.poll() is None
    assert "invalid reply" in p.log_text()
    uniq = set(keys)
    print(f"\n8 garbage replies, a REQ peer: entries={n} keys={len(uniq)} delivered={len(set(w_bad.keys()))} "
          f"re-delivered={len(w_bad.keys()) - len(set(w_bad.keys()))} lost=0")
    req.close()
    mode = os.stat(p.endpoint[len("ipc://"):]).st_mode & 0o777
    assert mode == 0o660


def _sp_handshake(proto):
    return b"\x00SP\x00" + struct.pack(">H", proto) + b"\x00\x00"


def test_8b_malformed_ipc_frames_are_the_documented_limit(env, tmp_path):
    """nanomsg 1.1.5 aborts on an ipc frame whose type byte is not 1 (sipc.c);
    well-formed SP peers with any payload are harmless. This test pins both."""
    r = env.r
    p = env.proxy([group_conf()], log_level="info")
    path = p.endpoint[len("ipc://"):]
    wait_for(lambda: os.path.exists(path), what="socket")
    # A wrong handshake is refused (connection closed), the daemon lives on.
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"\x00SP\x00\x00\x99\x00\x00")
    time.sleep(0.3)
    s.close()
    assert p.proc.poll() is None
    # A REP handshake then a frame of type 2: nanomsg asserts and aborts.
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(_sp_handshake(49))
    s.recv(8)
    s.sendall(b"\x02" + struct.pack(">Q", 4) + b"abcd")
    try:
        rc = p.proc.wait(5)
    except subprocess.TimeoutExpired:
        rc = None
    s.close()
    assert rc == -signal.SIGABRT, f"expected nanomsg's abort (the documented limit), got {rc}"
    print("\n8b malformed ipc frame (type byte 2): nanomsg 1.1.5 aborts; socket_mode is the guard")
