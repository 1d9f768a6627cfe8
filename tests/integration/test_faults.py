"""Bad input, Redis going away, SIGTERM, and the two races of the seeds forced
step by step: a claim between another holder's done write and its release, and
a lease that expires while the app works."""
import json
import re
import os
import signal
import subprocess
import time

import pytest
import redis

from pxtest import pb, outcomes, publish, pending, settled, wait_for

BAD = [
    ("not json", {"payload": "{not json"},
     'payload is not JSON: unexpected \'n\' at byte 1 (quoted object property name expected): "{not json"'),
    ("bare not json", {"payload": "not json"},
     'payload is not JSON: unexpected \'o\' at byte 1 (null expected): "not json"'),
    ("array", {"payload": "[1,2]"}, "not an object"),
    ("missing key field", {"payload": json.dumps({"other": 1})}, "key '#event.eventId'"),
    ("null key", {"payload": json.dumps({"eventId": None})}, "key '#event.eventId'"),
    ("object key", {"payload": json.dumps({"eventId": {"a": 1}})}, "key '#event.eventId'"),
    ("no payload field", {"other": "x"}, "no payload field"),
    ("oversized", {"payload": json.dumps({"eventId": "big", "pad": "x" * 5000})}, "max_entry_bytes"),
    ("key not utf-8", {"payload": b'{"eventId": "\xff\xfe"}'}, "not UTF-8"),
    ("field name not utf-8", {b"\xff": "x", "payload": json.dumps({"eventId": "n"})}, "not UTF-8"),
    # Found by fuzz_event: "a\u0000b" and "a\u0000c" must not both become key "a".
    ("key with NUL", {"payload": '{"eventId": "a\\u0000b"}'}, "NUL"),
    ("field name with NUL", {b"na\x00me": "x", "payload": json.dumps({"eventId": "n"})}, "NUL"),
    ("NUL after the JSON", {"payload": b'{"eventId": "t"}\x00'}, "unexpected '\\x00' at byte 16 (trailing data)"),
]


def group_conf(**kw):
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId"}
    s.update(kw)
    return s


@pytest.mark.parametrize("name,fields,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_dead_lettered_and_loses_nothing_else(env, name, fields, reason):
    r = env.r
    p = env.proxy([group_conf(dead_letter="dlq")], max_entry_bytes=2000)
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "before"}])
    bad_id = r.xadd("room", fields)
    publish(r, "room", [{"eventId": "after"}])
    wait_for(lambda: r.xlen("dlq") == 1, what="dead letter")
    raw = redis.Redis(port=env.redis.port)               # fields may not be UTF-8
    dl = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.xrange("dlq")[0][1].items()}
    assert reason in dl["idemproxy-reason"], dl["idemproxy-reason"]
    assert dl["idemproxy-entry-id"] == bad_id
    wait_for(lambda: sorted(w.keys()) == ["after", "before"], what="the good entries")
    wait_for(lambda: pending(r, "room", "g") == 0, what="all acked")
    assert re.search(rf"stream room entry {bad_id} key \S+ attempt \d+: bad entry: ", p.log_text())
    assert p.proc.poll() is None            # still running


def test_bad_input_skip(env):
    r = env.r
    p = env.proxy([group_conf(dead_letter="dlq", on_missing_key="skip")])
    w = env.worker(p.endpoint)
    r.xadd("room", {"payload": "{oops"})
    publish(r, "room", [{"eventId": "ok"}])
    wait_for(lambda: w.keys() == ["ok"], what="good entry")
    wait_for(lambda: pending(r, "room", "g") == 0, what="bad entry acked")
    assert not r.exists("dlq")
    assert "skipped" in p.log_text()


def test_groupless_bad_input_dead_lettered_once_across_restarts_and_replicas(env):
    r = env.r
    conf = [{"stream": "room", "payload_field": "payload", "dead_letter": "dlq"}]
    r.xadd("room", {"payload": "{oops"})
    p1 = env.proxy(conf)
    p2 = env.proxy(conf)
    wait_for(lambda: "bad entry" in p1.log_text() and "bad entry" in p2.log_text(), what="both saw it")
    p1.stop()
    p3 = env.proxy(conf)
    wait_for(lambda: settled([p2, p3], "room", 2), what="both replicas done with it")
    assert r.xlen("dlq") == 1


def test_redis_going_away_keeps_acks_and_marks_nothing_unacked(env, tmp_path):
    srv = env.redis
    srv.stop()
    srv.start(["--appendonly", "yes", "--appendfsync", "always"])
    r = srv.client
    p = env.proxy([group_conf()], ack_timeout_ms=60000, timeout_ms=500)
    w = env.worker(p.endpoint, manual=True)
    publish(r, "room", [{"eventId": "a1"}, {"eventId": "a2"}])
    wait_for(lambda: len(w.inbox) == 1, what="first delivery")
    srv.stop()                                  # kill -9: Redis gone
    p.wait_log("link lost")
    w.answer(pb.Ack.ACK)                        # the app acks while Redis is down
    time.sleep(1.0)
    assert p.proc.poll() is None
    srv.start(["--appendonly", "yes", "--appendfsync", "always"])
    r = srv.client
    first = w.got[0].key
    wait_for(lambda: (r.get("idem:" + first) or "")[:1] == "D", timeout=15, what="the ack written after reconnect")
    wait_for(lambda: len(w.inbox) == 1, timeout=15, what="second delivery")
    second = w.got[-1].key
    assert second != first
    assert r.get("idem:" + second).startswith("L:")   # not done: not acked yet
    w.answer(pb.Ack.ACK)
    wait_for(lambda: (r.get("idem:" + second) or "")[:1] == "D", what="second done")
    wait_for(lambda: pending(r, "room", "g") == 0, what="all acked")
    assert sorted(d.key for d in w.got) == ["a1", "a2"]


def test_redis_unreachable_at_start_keeps_retrying(env):
    env.redis.stop()
    p = env.proxy([group_conf()])
    time.sleep(1.5)
    assert p.proc.poll() is None
    assert "connect failed" in p.log_text()
    env.redis.start()
    w = env.worker(p.endpoint)
    publish(env.redis.client, "room", [{"eventId": "later"}])
    wait_for(lambda: w.keys() == ["later"], timeout=15, what="delivered once Redis is up")
    assert p.stop() == 0


def test_sigterm_drain_writes_acks_within_grace(env):
    r = env.r
    p = env.proxy([group_conf()], shutdown_grace_ms=5000)
    w = env.worker(p.endpoint, manual=True)
    publish(r, "room", [{"eventId": "t1"}])
    wait_for(lambda: w.inbox, what="delivery")
    p.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert p.proc.poll() is None                 # waiting for the ack
    w.answer(pb.Ack.ACK)
    assert p.proc.wait(10) == 0
    assert (r.get("idem:t1") or "")[:1] == "D"
    assert pending(r, "room", "g") == 0


def test_xack_rides_with_the_next_claim_and_a_stop_sends_it(env):
    """An XACK waits for the next claim or commit to share its write (issue 18),
    never past a stop. With the wait stretched to 10 minutes: the first entry,
    done, stays pending until the second entry's claim carries its XACK; the
    second's waits in turn, and SIGTERM sends it."""
    r = env.r
    p = env.proxy([group_conf()], proc_env={"IDEMPROXY_DEBUG_XACK_RIDE_MS": 600000})
    w = env.worker(p.endpoint)
    first = publish(r, "room", [{"eventId": "r1"}])[0]
    wait_for(lambda: (r.get("idem:r1") or "")[:1] == "D", what="r1 done")
    time.sleep(0.3)
    assert [x["message_id"] for x in r.xpending_range("room", "g", "-", "+", 10)] == [first]
    second = publish(r, "room", [{"eventId": "r2"}])[0]
    wait_for(lambda: (r.get("idem:r2") or "")[:1] == "D", what="r2 done")
    wait_for(lambda: [x["message_id"] for x in r.xpending_range("room", "g", "-", "+", 10)] == [second],
             what="r1's XACK carried by r2's claim, r2's waiting")
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0
    assert pending(r, "room", "g") == 0
    assert w.keys() == ["r1", "r2"]


def test_a_copy_parked_behind_its_holder_looks_again_once_the_key_is_done(env):
    """A copy parked behind a holder of this instance is woken when the holder's
    done mark is written, not when its XACK is (which waits for a ride: here
    10 minutes, by the hook); otherwise it waits for the holder's XACK."""
    r = env.r
    p = env.proxy([group_conf(lease_ms=60000)], max_inflight=4,
                  proc_env={"IDEMPROXY_DEBUG_XACK_RIDE_MS": 600000})
    w = env.worker(p.endpoint, manual=True)
    publish(r, "room", [{"eventId": "k"}, {"eventId": "k"}])
    wait_for(lambda: len(w.inbox) == 1, what="first delivery")
    p.wait_log("busy: looking again in 60000")            # the copy parked behind the holder
    w.answer(pb.Ack.ACK)
    dups = lambda: sum(v for k, v in p.metrics().items() if k.startswith("idemproxy_duplicates_total"))  # noqa: E731
    wait_for(lambda: dups() == 1, timeout=5, what="the copy found the key done")
    assert (r.get("idem:k") or "")[:1] == "D"
    p.proc.send_signal(signal.SIGTERM)                    # and the stop sends both XACKs
    assert p.proc.wait(10) == 0
    assert pending(r, "room", "g") == 0
    assert w.keys() == ["k"]


def test_sigterm_releases_unanswered_claims_after_grace(env):
    r = env.r
    p = env.proxy([group_conf(lease_ms=60000)], shutdown_grace_ms=800, ack_timeout_ms=60000)
    w = env.worker(p.endpoint, manual=True)
    publish(r, "room", [{"eventId": "t2"}])
    wait_for(lambda: w.inbox, what="delivery")
    assert r.get("idem:t2").startswith("L:")
    t0 = time.time()
    assert p.stop() == 0
    assert time.time() - t0 < 5
    assert not r.exists("idem:t2")               # released for another replica
    assert pending(r, "room", "g") == 1          # not acked: another replica takes it


SPLIT = {"stream": "room", "payload_field": "payload", "key": "#event.eventId", "layout": "split"}


def test_race_holder_finishes_between_our_check_and_our_lock(env):
    """Seed 000: our first done check passes, then another holder writes done
    and releases, then we take the lock: the check after the lock says done."""
    r = env.r
    p = env.proxy([SPLIT], proc_env={"IDEMPROXY_DEBUG_CLAIM_PAUSE_MS": 1500})
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "abc-123"}])
    p.wait_log("claim of key abc-123 paused")
    assert r.set("lock:abc-123", "holder-A", nx=True, px=5000)   # A locks
    r.set("done:abc-123", "1", px=600000)                         # A is done
    r.delete("lock:abc-123")                                      # A releases
    wait_for(lambda: settled(p, "room", 1), what="the entry's outcome")
    assert outcomes(p, "room")["duplicate"] == 1
    assert w.keys() == []
    assert not r.exists("lock:abc-123")          # our lock, taken and released
    assert r.exists("done:abc-123")


def test_race_claim_between_done_write_and_release(env):
    """Seed 000's diagram: our claim lands after holder A wrote done and before
    A released its lock. We must neither deliver nor touch A's lock."""
    r = env.r
    p = env.proxy([SPLIT], proc_env={"IDEMPROXY_DEBUG_CLAIM_PAUSE_MS": 1500})
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "abc-124"}])
    p.wait_log("claim of key abc-124 paused")
    r.set("lock:abc-124", "holder-A", px=10000)
    r.set("done:abc-124", "1", px=600000)
    p.wait_log("duplicate (after_lock)")
    assert r.get("lock:abc-124") == "holder-A"   # A's lock untouched
    r.delete("lock:abc-124")
    wait_for(lambda: settled(p, "room", 1), what="the entry's outcome")
    assert outcomes(p, "room")["duplicate"] == 1
    assert w.keys() == []


def test_race_single_layout_holder_done_while_we_wait(env):
    r = env.r
    r.set("idem:abc-125", "L:holder-A", px=1000)
    p = env.proxy([{"stream": "room", "payload_field": "payload", "lease_ms": 2000}])
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "abc-125"}])
    p.wait_log("busy:")
    r.set("idem:abc-125", "D", px=600000)        # A finishes
    p.wait_log("duplicate (after_lock)", timeout=10)
    assert w.keys() == []


def test_lease_expires_mid_handling(env):
    """Replica 1 stalls (kill -STOP) past its lease while its worker holds the
    delivery; replica 2 takes the key with a higher fencing token; replica 1's
    late ack still writes the done mark and counts the lost lease."""
    r = env.r
    conf = [{"stream": "room", "payload_field": "payload", "fencing": True, "lease_ms": 2000}]
    publish(r, "room", [{"eventId": "seat-9"}])
    p1 = env.proxy(conf, ack_timeout_ms=60000)
    w1 = env.worker(p1.endpoint, manual=True)
    wait_for(lambda: w1.inbox, what="delivery to replica 1")
    t1 = w1.got[0].fencing_token
    os.kill(p1.proc.pid, signal.SIGSTOP)
    wait_for(lambda: not r.exists("idem:seat-9"), timeout=5, what="lease expiry")
    p2 = env.proxy(conf)
    w2 = env.worker(p2.endpoint)
    wait_for(lambda: w2.keys() == ["seat-9"], what="replica 2 takes the key")
    t2 = w2.got[0].fencing_token
    assert t2 > t1
    wait_for(lambda: (r.get("idem:seat-9") or "")[:1] == "D", what="done by replica 2")
    os.kill(p1.proc.pid, signal.SIGCONT)
    w1.answer(pb.Ack.ACK)
    p1.wait_log("lease lost")
    wait_for(lambda: settled([p1, p2], "room", 2), what="both replicas done with it")
    assert outcomes(p1, "room")["acked"] == 1
    assert (r.get("idem:seat-9") or "")[:1] == "D"
    assert w2.keys() == ["seat-9"]               # replica 2 saw it once


def test_sigterm_during_startup_exits_0(env, tmp_path):
    """SIGTERM while the daemon is still starting (a pod stopped as it starts;
    chaos seeds 241, 336, 348 sent it right after a restart): it was killed by
    the signal (-15, 143 to Kubernetes) instead of exiting 0. Here startup is
    held at a known point: the config file is a FIFO the test has not written
    yet, so the daemon waits in open() until it does. (The dynamic loader's
    first milliseconds, before main, stay a window.)"""
    from pxtest import BIN, Proxy
    p = Proxy(env.tmp, "fifo", env.redis.url, env.endpoint(),
              [{"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
                "key": "#event.eventId"}])
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    log = open(tmp_path / "fifo-run.log", "wb")
    proc = subprocess.Popen([str(BIN), "-c", str(fifo)], stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(0.5)                              # well into main, waiting for the FIFO
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:                                         # startup goes on
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, p.config.read_bytes())
            os.close(fd)
        except OSError:                              # ENXIO: no reader, the daemon is gone
            pass
        rc = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert rc == 0, (rc, (tmp_path / "fifo-run.log").read_text()[-500:])
