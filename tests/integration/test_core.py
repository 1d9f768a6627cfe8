"""End to end: redis-server, idemproxy and a worker on real sockets; the
assertions are on what the worker received and what Redis holds."""
import json
import signal
import time

import pytest

from pxtest import pb, outcomes, publish, pending, settled, wait_for

LAYOUTS = ["single", "split"]
MODES = ["group", "groupless"]


def stream_conf(mode, layout, **kw):
    s = {"stream": "room", "payload_field": "payload", "key": "#event.eventId", "layout": layout}
    if mode == "group":
        s["group"] = "game-server"
        s["consumer"] = kw.pop("consumer", "c1")
    s.update(kw)
    return s


def done_key(layout, key):
    return ("idem:" if layout == "single" else "done:") + key


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_copies_skipped(env, mode, layout):
    r = env.r
    # RouletteSpinEvent / MiniGameFinishedEvent, each published twice or three times.
    events = []
    for i in range(10):
        ev = {"eventId": f"spin-{i}", "joinCode": "A1B2", "type": "RouletteSpinEvent"}
        events += [ev] * (2 + i % 2)
    publish(r, "room", events)
    p = env.proxy([stream_conf(mode, layout, done_ttl_ms=600000)])
    w = env.worker(p.endpoint)
    wait_for(lambda: settled(p, "room", len(events)), what="every entry's outcome")
    assert sorted(w.keys()) == sorted(f"spin-{i}" for i in range(10))
    assert outcomes(p, "room")["duplicate"] == len(events) - 10
    for i in range(10):
        k = done_key(layout, f"spin-{i}")
        assert r.exists(k)
        assert 590000 < r.pttl(k) <= 600000
        if layout == "split":
            assert not r.exists(f"lock:spin-{i}")
    if mode == "group":
        wait_for(lambda: pending(r, "room", "game-server") == 0, what="nothing pending")
    d = w.got[0]
    assert d.stream == "room" and d.attempt == 1 and d.fencing_token == 0
    assert json.loads(d.payload)["eventId"] == d.key
    assert [f.name for f in d.fields] == []   # the payload field is not repeated in fields
    assert int(d.entry_id.split("-")[0]) < d.deadline_unix_ms <= time.time() * 1000 + 5000


def test_fields_as_event_and_dotted_names(env):
    r = env.r
    r.xadd("minigame", {"eventId": "m-1", "winner.name": "kim", "score": "10"})
    r.xadd("minigame", {"eventId": "m-1", "winner.name": "kim", "score": "10"})
    p = env.proxy([{"stream": "minigame", "group": "g", "key": "game:#{event.winner.name}:#{event.eventId}"}])
    w = env.worker(p.endpoint)
    wait_for(lambda: settled(p, "minigame", 2), what="both entries' outcomes")
    assert w.keys() == ["game:kim:m-1"]
    d = w.got[0]
    assert [(f.name, f.value) for f in d.fields] == [("eventId", b"m-1"), ("winner.name", b"kim"), ("score", b"10")]
    assert d.payload == b""


@pytest.mark.parametrize("layout", LAYOUTS)
def test_restart_rereads_from_zero_without_redelivery(env, layout):
    r = env.r
    publish(r, "room", [{"eventId": f"e{i}"} for i in range(20)])
    conf = [stream_conf("groupless", layout, start="0")]
    ep = env.endpoint()
    w = env.worker(ep)
    p = env.proxy(conf, endpoint=ep)
    wait_for(lambda: len(w.keys()) == 20, what="20 deliveries")
    assert p.stop() == 0
    p2 = env.proxy(conf, endpoint=ep)
    wait_for(lambda: settled(p2, "room", 20), what="every entry re-read and left")
    assert len(w.keys()) == 20          # nothing delivered twice
    assert outcomes(p2, "room")["duplicate"] == 20
    assert p2.log_text().count("duplicate (before_lock)") == 20


@pytest.mark.parametrize("mode", MODES)
def test_two_replicas_never_deliver_a_key_twice(env, mode):
    r = env.r
    events = [{"eventId": f"k{i % 60}"} for i in range(120)]
    publish(r, "room", events)
    p1 = env.proxy([stream_conf(mode, "single", consumer="c1")])
    p2 = env.proxy([stream_conf(mode, "single", consumer="c2")])
    w1 = env.worker(p1.endpoint)
    w2 = env.worker(p2.endpoint)
    # group: the replicas share the 120 entries; group-less: each reads all
    wait_for(lambda: settled([p1, p2], "room", 120 if mode == "group" else 240),
             what="every entry's outcome")
    keys = w1.keys() + w2.keys()
    assert sorted(keys) == sorted(f"k{i}" for i in range(60))


def test_retry_then_ack(env):
    def behave(d):
        return (pb.Ack.RETRY, "not yet") if d.attempt == 1 else (pb.Ack.ACK, "")
    p = env.proxy([stream_conf("group", "single", retry_backoff_ms=100)])
    w = env.worker(p.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": "r1"}])
    wait_for(lambda: len(w.got) == 2, what="two deliveries")
    assert [(d.key, d.attempt) for d in w.got] == [("r1", 1), ("r1", 2)]
    wait_for(lambda: (env.r.get("idem:r1") or "")[:1] == "D", what="done mark")
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, what="acked")


def test_drop_goes_to_dead_letter(env):
    def behave(d):
        return (pb.Ack.DROP, "cannot handle") if d.key == "bad" else (pb.Ack.ACK, "")
    p = env.proxy([stream_conf("group", "split", dead_letter="room:dlq")])
    w = env.worker(p.endpoint, behave=behave)
    ids = publish(env.r, "room", [{"eventId": "bad"}, {"eventId": "good"}])
    wait_for(lambda: env.r.xlen("room:dlq") == 1, what="dead letter")
    dl = env.r.xrange("room:dlq")[0][1]
    assert dl["idemproxy-reason"] == "cannot handle"
    assert dl["idemproxy-stream"] == "room"
    assert dl["idemproxy-entry-id"] == ids[0]
    assert dl["idemproxy-attempts"] == "1"
    assert json.loads(dl["payload"]) == {"eventId": "bad"}
    wait_for(lambda: env.r.exists("done:bad") and env.r.exists("done:good"), what="done marks")
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, what="acked")
    assert sorted(w.keys()) == ["bad", "good"]


def test_max_deliveries_then_dead_letter(env):
    p = env.proxy([stream_conf("group", "single", dead_letter="dlq", max_deliveries=3,
                               retry_backoff_ms=50)])
    w = env.worker(p.endpoint, behave=lambda d: (pb.Ack.RETRY, "still failing"))
    publish(env.r, "room", [{"eventId": "poison"}])
    wait_for(lambda: env.r.xlen("dlq") == 1, what="dead letter")
    assert [d.attempt for d in w.got] == [1, 2, 3]
    dl = env.r.xrange("dlq")[0][1]
    assert dl["idemproxy-attempts"] == "3"
    assert "max_deliveries" in dl["idemproxy-reason"] and "still failing" in dl["idemproxy-reason"]
    wait_for(lambda: (env.r.get("idem:poison") or "")[:1] == "D", what="done mark")
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, what="acked")


def test_ack_timeout_redelivers(env):
    def behave(d):
        return None if d.attempt == 1 else (pb.Ack.ACK, "")
    p = env.proxy([stream_conf("group", "single", retry_backoff_ms=50)], ack_timeout_ms=700)
    w = env.worker(p.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": "slow"}])
    wait_for(lambda: len(w.got) == 2, timeout=10, what="redelivery after the ack timeout")
    assert [d.attempt for d in w.got] == [1, 2]
    wait_for(lambda: (env.r.get("idem:slow") or "")[:1] == "D", what="done mark")
    assert "ack timeout" in p.log_text()


def test_garbage_reply_counts_as_retry(env):
    def behave(d):
        return b"\xff\xff\xff" if d.attempt == 1 else (pb.Ack.ACK, "")
    p = env.proxy([stream_conf("group", "single", retry_backoff_ms=50)])
    w = env.worker(p.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": "g1"}])
    wait_for(lambda: len(w.got) == 2, what="redelivery after a garbage reply")
    wait_for(lambda: (env.r.get("idem:g1") or "")[:1] == "D", what="done mark")
    assert "invalid reply" in p.log_text()


def test_wrong_echo_counts_as_retry(env):
    def behave(d):
        if d.attempt == 1:
            return pb.Ack(status=pb.Ack.ACK, entry_id="0-1").SerializeToString()
        return (pb.Ack.ACK, "")
    p = env.proxy([stream_conf("group", "single", retry_backoff_ms=50)])
    w = env.worker(p.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": "echo"}])
    wait_for(lambda: len(w.got) == 2, what="redelivery after a wrong echo")
    assert "echoes another entry id" in p.log_text()


def test_worker_connects_late_c_worker(env):
    publish(env.r, "room", [{"eventId": f"late{i}"} for i in range(5)] * 2)
    p = env.proxy([stream_conf("group", "single")])
    time.sleep(1.0)
    w = env.cworker(p.endpoint)
    wait_for(lambda: settled(p, "room", 10), what="every entry's outcome")
    assert p.metrics()['idemproxy_deliveries_total{stream="room",group="game-server"}'] == 5
    wait_for(lambda: len(w.lines()) >= 5, what="C worker lines")
    assert sorted(w.lines()) == sorted(f"late{i} attempt=1" for i in range(5))
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, what="acked")


def test_no_ack_lost_with_many_deliveries_in_flight(env):
    """libnanomsg's REP drops a reply silently when its pipe back to the proxy
    is full (a few hundred unread acks). With max_inflight far above that and
    one C worker, no ack may be lost: each key is delivered once, attempt 1,
    and nothing waits for an ack timeout."""
    n = 6000
    publish(env.r, "room", [{"eventId": f"w{i}"} for i in range(n)])
    p = env.proxy([stream_conf("group", "single")], max_inflight=4000, ack_timeout_ms=4000,
                  log_level="warn")
    w = env.cworker(p.endpoint)
    wait_for(lambda: len(w.lines()) >= n, timeout=60, what=f"{n} deliveries")
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, timeout=10, what="all acked")
    lines = w.lines()
    assert len(lines) == n and sorted(lines) == sorted(f"w{i} attempt=1" for i in range(n))
    m = p.metrics()
    assert m['idemproxy_ack_timeouts_total{stream="room",group="game-server"}'] == 0
    assert m['idemproxy_deliveries_total{stream="room",group="game-server"}'] == n


def test_c_worker_started_before_proxy(env):
    ep = env.endpoint()
    w = env.cworker(ep)
    time.sleep(0.3)
    publish(env.r, "room", [{"eventId": "early"}])
    env.proxy([stream_conf("group", "single")], endpoint=ep)
    wait_for(lambda: w.lines() == ["early attempt=1"], what="C worker delivery")


def test_lock_key_serialises_one_resource_across_replicas(env):
    spans = []

    def behave(d):
        t0 = time.time()
        time.sleep(0.15)
        spans.append((t0, time.time(), d.key))
        return (pb.Ack.ACK, "")
    conf = dict(lock_key="lock:game:room:#{event.roomId}", wait_ms=5000)
    p1 = env.proxy([stream_conf("groupless", "single", **conf)])
    p2 = env.proxy([stream_conf("groupless", "single", **conf)])
    env.worker(p1.endpoint, behave=behave)
    env.worker(p2.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": f"leave{i}", "roomId": "R1"} for i in range(8)])
    wait_for(lambda: len(spans) == 8, timeout=20, what="8 handled")
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        assert b[0] >= a[1] - 0.005, f"overlap: {a} {b}"
    assert sorted(s[2] for s in spans) == [f"leave{i}" for i in range(8)]
    # The last span is recorded before its ACK is even sent: the release follows.
    wait_for(lambda: not env.r.exists("lock:game:room:R1"), 5, "the room's lock released")


def test_on_busy_dead_letter_refuses_at_once(env):
    env.r.set("seat-lock:7", "someone-else", px=60000)
    p = env.proxy([stream_conf("group", "split", lock_key="seat-lock:#{event.seatId}",
                               on_busy="dead_letter", dead_letter="dlq")])
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "book1", "seatId": 7}, {"eventId": "book2", "seatId": 8}])
    wait_for(lambda: env.r.xlen("dlq") == 1, what="refused entry dead-lettered")
    assert env.r.xrange("dlq")[0][1]["idemproxy-reason"] == "busy"
    wait_for(lambda: w.keys() == ["book2"], what="the free seat delivered")
    assert not env.r.exists("done:book1")         # refused, not done
    assert not env.r.exists("lock:book1")         # the dedup lock was released
    assert env.r.get("seat-lock:7") == "someone-else"
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, what="acked")


def test_busy_dedup_lock_is_looked_at_again(env):
    # Another consumer (say, the seeds' code during a migration) holds the lock.
    env.r.set("lock:mig1", "other-token", px=1500)
    p = env.proxy([stream_conf("group", "split", lease_ms=2000)])
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "mig1"}])
    p.wait_log("busy:")
    assert w.keys() == []
    # It never wrote done: once its lease ends, we take the entry.
    wait_for(lambda: w.keys() == ["mig1"], timeout=10, what="delivered after the holder's lease")
    wait_for(lambda: env.r.exists("done:mig1"), what="done")


def test_split_release_survives_script_flush(env):
    """The release is an EVALSHA; after SCRIPT FLUSH it comes back NOSCRIPT
    and is sent again as EVAL with the arguments the command kept."""
    p = env.proxy([stream_conf("group", "split")])
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "before"}])
    wait_for(lambda: env.r.exists("done:before") and not env.r.exists("lock:before"),
             what="first entry done and released")
    env.r.script_flush()
    env.r.config_resetstat()
    publish(env.r, "room", [{"eventId": f"after-{i}"} for i in range(40)] * 2)
    keys = [f"after-{i}" for i in range(40)]
    wait_for(lambda: sorted(w.keys()) == sorted(["before"] + keys), what="every key once")
    wait_for(lambda: pending(env.r, "room", "game-server") == 0, what="acked")
    assert all(env.r.exists(f"done:{k}") for k in keys)
    assert env.r.keys("lock:*") == []                # every lock released
    assert env.r.info("commandstats")["cmdstat_eval"]["calls"] >= 1   # NOSCRIPT, then EVAL
    assert p.metrics()["idemproxy_redis_errors_total"] == 0


def test_lease_extended_past_lease_ms(env):
    p = env.proxy([stream_conf("group", "single", lease_ms=2000)], ack_timeout_ms=20000)
    w = env.worker(p.endpoint, manual=True)
    publish(env.r, "room", [{"eventId": "long"}])
    wait_for(lambda: w.inbox, what="delivery")
    value = env.r.get("idem:long")
    assert value.startswith("L:")
    time.sleep(4.5)                           # more than twice the lease
    assert env.r.get("idem:long") == value    # still ours: extended
    assert 0 < env.r.pttl("idem:long") <= 2000
    w.answer(pb.Ack.ACK)
    wait_for(lambda: (env.r.get("idem:long") or "")[:1] == "D", what="done")
    assert "lease lost" not in p.log_text()


def test_many_held_leases_all_extended(env):
    """Extensions are paced (a few per timer tick, not every lease at once);
    still, with hundreds of entries held past two leases, no lock expires: not
    those delivered (the worker's window: it never answers, so the window
    stays at its start) nor those claimed and waiting for the window."""
    n = 600
    # max_inflight leaves a reader batch of room, so the last few entries are read too.
    p = env.proxy([stream_conf("group", "single", lease_ms=2000)], ack_timeout_ms=30000,
                  max_inflight=n + 256, log_level="info")
    w = env.worker(p.endpoint, behave=lambda d: None)    # receives, never answers
    publish(env.r, "room", [{"eventId": f"held-{i}"} for i in range(n)])
    keys = [f"idem:held-{i}" for i in range(n)]
    wait_for(lambda: all(v and v.startswith("L:") for v in env.r.mget(keys)), what=f"{n} claims")
    window = int(p.metrics()["idemproxy_delivery_window"])
    assert 1 <= window < 128
    wait_for(lambda: len(w.got) >= window, what="a window of deliveries")
    first = env.r.mget(keys)
    end = time.monotonic() + 5.0                          # two and a half leases
    while time.monotonic() < end:
        assert env.r.mget(keys) == first                  # every lock still ours
        time.sleep(0.2)
    assert all(0 < t <= 2000 for t in env.r.eval(
        "local t = {} for i, k in ipairs(KEYS) do t[i] = redis.call('pttl', k) end return t",
        len(keys), *keys))
    assert len(w.got) == window                           # the rest wait for replies
    assert p.metrics()["idemproxy_inflight"] == n
    assert "lease lost" not in p.log_text()


@pytest.mark.parametrize("mode", MODES)
def test_max_inflight_bounds_claimed_entries_only(env, mode):
    """max_inflight counts claimed entries not yet committed (docs/configuration.md): with a
    worker that never answers, exactly that many are claimed and held (the
    worker's window of them delivered, the rest waiting for it), and no more
    are read; copies of done keys are not claimed, so they still leave."""
    r = env.r
    for i in range(20):
        r.set(f"idem:done-{i}", "D", px=600000)
    publish(r, "room", [{"eventId": f"done-{i}"} for i in range(20)] +
            [{"eventId": f"new-{i}"} for i in range(30)])
    p = env.proxy([stream_conf(mode, "single")], max_inflight=8, ack_timeout_ms=60000)
    w = env.worker(p.endpoint, behave=lambda d: None)     # receives, never answers
    wait_for(lambda: p.metrics().get("idemproxy_inflight") == 8, what="8 entries claimed")
    time.sleep(1.0)                                       # room for more would be used by now
    m = p.metrics()
    window = int(m["idemproxy_delivery_window"])
    assert 1 <= window < 8
    assert len(w.got) == window
    assert sorted(d.key for d in w.got) == sorted(f"new-{i}" for i in range(window))
    g = "game-server" if mode == "group" else ""       # a group-less block's group label is ""
    assert m[f'idemproxy_outcomes_total{{stream="room",group="{g}",outcome="duplicate"}}'] == 20
    assert m["idemproxy_inflight"] == 8
    assert m[f'idemproxy_entries_read_total{{stream="room",group="{g}"}}'] == 28
    assert all(r.get(f"idem:new-{i}").startswith("L:") for i in range(8))
    assert all(r.get(f"idem:new-{i}") is None for i in range(8, 30))
    if mode == "group":
        assert pending(r, "room", "game-server") == 8     # the copies were XACKed


def test_fencing_tokens_increase(env):
    def behave(d):
        return (pb.Ack.RETRY, "") if d.attempt < 3 else (pb.Ack.ACK, "")
    p = env.proxy([stream_conf("group", "single", fencing=True, retry_backoff_ms=20)])
    w = env.worker(p.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": "f1"}, {"eventId": "f2"}])
    wait_for(lambda: len(w.got) == 6, what="6 deliveries")
    for k in ("f1", "f2"):
        toks = [d.fencing_token for d in w.got if d.key == k]
        assert len(toks) == 3 and all(t > 0 for t in toks)
        assert toks == sorted(toks) and len(set(toks)) == 3


def test_fencing_tokens_go_up_after_redis_forgets_its_last_raises(env):
    """Redis restarted from a snapshot taken before the last two claims (what
    a failover to a replica that had not got them does): the fencing counter
    is back where it was, yet the next token is above every token handed out
    before, or a database fence would refuse new work for ever. Each delivery
    names its lock: the key (no lock_key)."""
    import shutil
    r = env.r
    p = env.proxy([stream_conf("group", "single", fencing=True)], timeout_ms=300)
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "f1"}])
    wait_for(lambda: (r.get("idem:f1") or "")[:1] == "D", what="f1 done")
    # and XACKed (it may ride the next write up to 10 ms later): else the
    # restored f1 is looked at again, and that claim raises the counter too.
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="f1 XACKed")
    r.save()
    shutil.copy(env.redis.dir / "dump.rdb", env.redis.dir / "old.rdb")
    publish(r, "room", [{"eventId": "f2"}, {"eventId": "f3"}])
    wait_for(lambda: len(w.got) == 3, what="f2 and f3 delivered")
    before = max(d.fencing_token for d in w.got)
    env.redis.stop()
    shutil.copy(env.redis.dir / "old.rdb", env.redis.dir / "dump.rdb")
    env.redis.start()
    assert int(r.get("idemproxy:fence")) < before, "the snapshot has the older counter"
    wait_for(lambda: p.get("/readyz")[0] == 200, timeout=15, what="reconnected")
    publish(r, "room", [{"eventId": "f4"}])
    wait_for(lambda: len(w.got) == 4, timeout=15, what="f4 delivered")
    f4 = w.got[-1]
    assert f4.key == "f4" and f4.fencing_token > before, (f4.fencing_token, before)
    assert [d.lock for d in w.got] == [d.key for d in w.got]


def test_pending_entry_of_dead_consumer_is_reclaimed(env):
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    publish(r, "room", [{"eventId": "orphan1"}, {"eventId": "orphan2"}])
    r.xreadgroup("game-server", "dead-pod", {"room": ">"})   # read, never acked
    assert pending(r, "room", "game-server") == 2
    p = env.proxy([stream_conf("group", "single", claim_idle_ms=900)], timeout_ms=300)
    w = env.worker(p.endpoint)
    wait_for(lambda: sorted(w.keys()) == ["orphan1", "orphan2"], what="reclaimed")
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="acked")
    # attempt is Redis' delivery count: read once by the dead pod, once by us
    assert [d.attempt for d in w.got] == [2, 2]


def test_trimmed_pending_entry_is_acked_away(env):
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    ids = publish(r, "room", [{"eventId": "gone1"}, {"eventId": "kept"}])
    r.xreadgroup("game-server", "dead-pod", {"room": ">"})
    r.xdel("room", ids[0])
    p = env.proxy([stream_conf("group", "single", claim_idle_ms=900)], timeout_ms=300)
    w = env.worker(p.endpoint)
    wait_for(lambda: w.keys() == ["kept"], what="the surviving entry")
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="trimmed entry acked away")
    assert "trimmed or deleted" in p.log_text()


def test_own_history_replayed_after_restart(env):
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    publish(r, "room", [{"eventId": "h1"}])
    r.xreadgroup("game-server", "c1", {"room": ">"})   # as if we read it and died
    p = env.proxy([stream_conf("group", "single", consumer="c1")])
    w = env.worker(p.endpoint)
    wait_for(lambda: w.keys() == ["h1"], what="own pending entry replayed")
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="acked")
    assert w.got[0].attempt == 2


def test_entry_delivered_max_deliveries_times_is_dead_lettered_without_delivery(env):
    # A poison entry that took down consumer after consumer: its delivery
    # count is already past max_deliveries when we reclaim it.
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    ids = publish(r, "room", [{"eventId": "poison"}, {"eventId": "fine"}])
    r.xreadgroup("game-server", "crashed-pod", {"room": ">"}, count=1)
    for _ in range(3):
        r.xclaim("room", "game-server", "crashed-pod", 0, [ids[0]])   # count 4
    p = env.proxy([stream_conf("group", "single", claim_idle_ms=900, max_deliveries=3,
                               dead_letter="dlq")], timeout_ms=300)
    w = env.worker(p.endpoint)
    wait_for(lambda: r.xlen("dlq") == 1, what="dead letter")
    assert "delivery count" in r.xrange("dlq")[0][1]["idemproxy-reason"]
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="acked")
    assert w.keys() == ["fine"]
    assert (r.get("idem:poison") or "")[:1] == "D"


def test_done_mark_expiry_allows_the_key_again(env):
    # Seed 003: a coupon re-opened after its done mark expired is handled again.
    # done_ttl_ms short, but at least lease_ms (docs/configuration.md), itself at least 2 x timeout_ms,
    # and long enough that the second copy is read before it runs out on a busy machine
    p = env.proxy([stream_conf("group", "single", done_ttl_ms=3000, lease_ms=1500)], timeout_ms=500)
    w = env.worker(p.endpoint)
    publish(env.r, "room", [{"eventId": "coupon-1"}])
    wait_for(lambda: w.keys() == ["coupon-1"], what="first")
    publish(env.r, "room", [{"eventId": "coupon-1"}])
    p.wait_log("duplicate (before_lock)")
    wait_for(lambda: not env.r.exists("idem:coupon-1"), timeout=8, what="done mark expired")
    publish(env.r, "room", [{"eventId": "coupon-1"}])
    wait_for(lambda: w.keys() == ["coupon-1", "coupon-1"], what="delivered again")


def test_idle_consumers_with_nothing_pending_are_removed(env):
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    r.xgroup_createconsumer("room", "game-server", "old-pod-1")          # restarted pods
    r.xgroup_createconsumer("room", "game-server", "old-pod-2")
    publish(r, "room", [{"eventId": "stuck"}])
    r.xreadgroup("game-server", "busy-pod", {"room": ">"})               # has a pending entry
    p = env.proxy([stream_conf("group", "single", consumer="me", claim_idle_ms=600000)],
                  proc_env={"IDEMPROXY_DEBUG_IDLE_CONSUMER_MS": 1000})
    env.worker(p.endpoint)
    names = lambda: sorted(c["name"] for c in r.xinfo_consumers("room", "game-server"))
    wait_for(lambda: names() == ["busy-pod", "me"], timeout=10, what="idle consumers removed")
    assert "removing idle consumer old-pod-1" in p.log_text()


def test_six_replicas_started_together_never_share_a_lock_token(env):
    # Replicas started within the same millisecond once drew the same lock tokens
    # (a weak seed), so each took the other's lock as its own: every key twice.
    r = env.r
    publish(r, "room", [{"eventId": f"t{i}"} for i in range(40)])
    conf = [stream_conf("groupless", "single")]
    eps = [env.endpoint() for _ in range(6)]
    workers = [env.worker(ep) for ep in eps]
    proxies = [env.proxy(conf, endpoint=ep, log_level="info") for ep in eps]
    wait_for(lambda: settled(proxies, "room", 40 * 6), timeout=20, what="every entry's outcome")
    keys = [k for w in workers for k in w.keys()]
    assert sorted(keys) == sorted(f"t{i}" for i in range(40))


def test_fields_variable_in_a_payload_stream(env):
    # #fields is built only for streams whose templates name it.
    r = env.r
    p = env.proxy([{"stream": "room", "group": "g", "payload_field": "payload",
                    "key": "#fields['source'] + ':' + #event.eventId"}])
    w = env.worker(p.endpoint)
    r.xadd("room", {"source": "web", "payload": '{"eventId": "f1"}'})
    r.xadd("room", {"source": "web", "payload": '{"eventId": "f1"}'})
    r.xadd("room", {"source": "app", "payload": '{"eventId": "f1"}'})
    wait_for(lambda: settled(p, "room", 3), what="every entry's outcome")
    assert sorted(w.keys()) == ["app:f1", "web:f1"]


def reads_of(r, cmd):
    return r.info("commandstats").get(f"cmdstat_{cmd}", {}).get("calls", 0)


@pytest.mark.parametrize("mode", MODES)
def test_linger_reads_entries_that_arrive_alone_together(env, mode):
    """streams[].linger_ms (0 by default): after a live page shorter than it
    asked for, the reader waits that long before it reads again, so entries
    that arrive one by one are read (and claimed, and committed) together.
    Twelve entries 20 ms apart: with linger_ms 0 the default batch window
    decides, which opens for none of them (none is due within 2 ms): each is
    read on its own (the control, about 12 reads); with 100 ms, about four
    reads take them all. Each is delivered once either way."""
    r = env.r
    cmd = "xreadgroup" if mode == "group" else "xread"
    reads = {}
    for linger in (0, 100):
        stream = f"trickle{linger}"
        conf = stream_conf(mode, "single", stream=stream, linger_ms=linger, start="$")
        if mode == "group":
            conf["start"] = "0"
        p = env.proxy([conf])
        w = env.worker(p.endpoint)
        wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
        time.sleep(0.5)                     # the reader is live
        before = reads_of(r, cmd)
        for i in range(12):
            publish(r, stream, [{"eventId": f"{stream}-{i}"}])
            time.sleep(0.02)
        wait_for(lambda: len(w.keys()) == 12, what="the trickle delivered")
        reads[linger] = reads_of(r, cmd) - before
        assert sorted(w.keys()) == sorted(f"{stream}-{i}" for i in range(12))
        p.stop()
        w.close()
    assert reads[0] >= 9, reads            # the control: one read per entry, or nearly
    assert reads[100] <= 6, reads


@pytest.mark.parametrize("mode", MODES)
def test_linger_holds_an_entry_back_at_most_linger_ms(env, mode):
    """An entry that arrives while the reader lingers (just after another was
    read) waits at most linger_ms to be read. The test above bounds the number
    of reads, which a longer wait only satisfies better (a linger ten times
    too long passed it). Each entry is published as soon as the one before
    was delivered, so each arrives inside that one's linger; with 100 ms the
    quickest of five must reach the worker within 500 ms (a margin for a loaded
    machine: ten times too long is a second)."""
    r = env.r
    linger = 100
    conf = stream_conf(mode, "single", linger_ms=linger, start="0" if mode == "group" else "$")
    arrived = {}

    def behave(d):
        arrived.setdefault(d.key, time.monotonic())
        return (pb.Ack.ACK, "")

    p = env.proxy([conf])
    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    waited = []
    for i in range(6):
        t0 = time.monotonic()
        publish(r, "room", [{"eventId": f"e{i}"}])
        wait_for(lambda: f"e{i}" in arrived, 10, f"e{i} delivered")
        if i > 0:                           # e0 arrived alone, with no linger running
            waited.append(arrived[f"e{i}"] - t0)
    assert min(waited) < 5 * linger / 1000, [round(x * 1000) for x in waited]


def trickle(env, conf, n=12, apart=0.02):
    """n entries 'apart' s apart to a live proxy of 'conf': the reads it took
    (INFO commandstats) and each key's time from XADD to the worker."""
    r = env.r
    cmd = "xreadgroup" if conf.get("group") else "xread"
    stream, sent, arrived = conf["stream"], {}, {}

    def behave(d):
        arrived.setdefault(d.key, time.monotonic())
        return (pb.Ack.ACK, "")

    p = env.proxy([conf])
    w = env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    before = reads_of(r, cmd)
    for i in range(n):
        sent[f"{stream}-{i}"] = time.monotonic()
        publish(r, stream, [{"eventId": f"{stream}-{i}"}])
        time.sleep(apart)
    wait_for(lambda: len(arrived) == n, what="the trickle delivered")
    reads = reads_of(r, cmd) - before
    assert sorted(w.keys()) == sorted(sent), "each delivered once"
    p.stop()
    w.close()
    return reads, {k: arrived[k] - sent[k] for k in sent}


def batch_conf(mode, stream, **kw):
    conf = stream_conf(mode, "single", stream=stream, start="$", **kw)
    if mode == "group":
        conf["start"] = "0"
    return conf


@pytest.mark.parametrize("mode", MODES)
def test_batch_window_shares_reads_only_while_entries_arrive_close_together(env, mode):
    """streams[].batch_ms (default 2): after a short live page, the reader
    waits up to batch_ms before reading again, but only while entries arrive
    close together (another one due within batch_ms). Twelve entries 20 ms
    apart: with batch_ms 100, about four reads take them all; with the
    default 2 ms none is due within the window, and with batch_ms 0 it never
    waits: each is read on its own (about 12 reads)."""
    reads = {}
    for name, kw in (("b100", {"batch_ms": 100}), ("default", {}), ("b0", {"batch_ms": 0})):
        reads[name], _ = trickle(env, batch_conf(mode, f"trickle-{name}", **kw))
    assert reads["b100"] <= 6, reads
    assert reads["default"] >= 9, reads     # 20 ms apart: no entry due within 2 ms
    assert reads["b0"] >= 9, reads


def window_key(stream):
    """The key the batch window's BLPOP waits on (never written): in the
    stream's cluster slot, here its whole name (no braces)."""
    return f"idemproxy:window:{{{stream}}}:{stream}"


@pytest.mark.parametrize("mode", MODES)
def test_batch_window_waits_in_redis_and_ends_on_time_on_an_idle_server(env, mode):
    """The batch window waits in Redis (issue 34): a BLPOP with the window as
    its timeout ahead of the next read, so the page is the only wake-up. An
    idle Redis ends a blocked timeout only when its loop next wakes (hz 1
    here: up to a second); at the window's end the proxy wakes it. linger_ms
    20 opens a window after every page; the worker, handed e<i>, publishes
    e<i+1>, which so arrives inside e<i>'s window, and nothing else wakes
    Redis once the done mark is written: at most one of seven may take over
    150 ms to reach the worker (a margin for a loaded machine; left to Redis,
    most took about a second)."""
    r = env.r
    conf = batch_conf(mode, "room", linger_ms=20)
    sent, arrived = {}, {}

    def behave(d):
        arrived.setdefault(d.key, time.monotonic())
        i = int(d.key[1:])
        if i < 7 and f"e{i + 1}" not in sent:
            sent[f"e{i + 1}"] = time.monotonic()
            publish(r, "room", [{"eventId": f"e{i + 1}"}])
        return (pb.Ack.ACK, "")

    p = env.proxy([conf])
    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    before = reads_of(r, "blpop")
    hz = r.config_get("hz")["hz"]
    r.config_set("hz", 1)
    time.sleep(0.3)                         # the loop's wait set at hz 10 is over
    try:
        publish(r, "room", [{"eventId": "e0"}])
        wait_for(lambda: "e7" in arrived, 20, "e0 to e7 delivered")
    finally:
        r.config_set("hz", hz)
    waited = [arrived[k] - sent[k] for k in sorted(sent)]
    assert len(waited) == 7
    assert reads_of(r, "blpop") - before >= 7, "the windows waited in Redis"
    assert not r.exists(window_key("room"))
    assert len([x for x in waited if x > 0.15]) <= 1, [round(x * 1000) for x in waited]


def loop_iterations(p):
    return p.metrics().get("idemproxy_loop_busy_seconds_count", 0)


def ack_timeouts(p):
    """idemproxy_ack_timeouts_total over every stream (its samples are labelled)."""
    return sum(v for k, v in p.metrics().items() if k.startswith("idemproxy_ack_timeouts_total{"))


@pytest.mark.parametrize("mode", MODES)
def test_answers_wait_for_the_windows_end_and_wake_the_proxy_once_per_page(env, mode):
    """While a batch window is out, the workers' answers wait in their sockets
    (issue 34): the page at the window's end wakes the proxy for both, one
    wake-up a page fewer. 150 entries about 3 ms apart, linger_ms 5 (a window
    after every page), read twice by the same proxy build: with commit_ms 5
    (the answers may wait up to 5 ms) and with commit_ms 0 (done marks at once:
    nothing waits), each delivered once either way. The loop turns per entry
    (idemproxy_loop_busy_seconds_count) are fewer with the hold; before it, a
    page cost a turn for its window's end, one for its claims and one for each
    answer, with either setting."""
    r = env.r
    turns = {}
    for name, commit in (("hold", 5), ("at once", 0)):
        stream = "room" if name == "hold" else "room2"
        p = env.proxy([batch_conf(mode, stream, linger_ms=5, commit_ms=commit)])
        w = env.worker(p.endpoint)
        wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
        time.sleep(0.5)                     # the reader is live
        before = loop_iterations(p)
        keys = [f"{name}-{i}" for i in range(150)]
        for k in keys:
            publish(r, stream, [{"eventId": k}])
            time.sleep(0.003)
        wait_for(lambda: sorted(w.keys()) == sorted(keys), what=f"{name}: each delivered")
        wait_for(lambda: all(r.exists(f"idem:{k}") for k in keys), what=f"{name}: done marks")
        turns[name] = (loop_iterations(p) - before) / len(keys)
        assert ack_timeouts(p) == 0
        w.close()
        p.stop()
    print("loop turns per entry", turns)
    assert turns["hold"] < 0.85 * turns["at once"], turns


@pytest.mark.parametrize("mode", MODES)
def test_a_delivery_waiting_for_room_while_answers_are_held_does_not_spin_the_loop(env, mode):
    """A worker slower than the stream (20 ms an entry, an entry every 1 ms,
    the default window; ack_timeout_ms 400 keeps the flow control's window
    of deliveries small) fills that window, so new ones wait for room while
    answers are held. A waiting delivery reads the held answers
    once and lets the next one wake the proxy; before, it read them again at
    every loop turn until the window ended: 35,000 turns a second against
    about 300 with commit_ms 0 (no hold), a core of CPU for nothing. Here
    the turns a second with the hold stay within three times those without."""
    r = env.r
    rate = {}
    for name, kw in (("hold", {}), ("no hold", {"commit_ms": 0})):
        stream = "slow" if name == "hold" else "slow2"
        p = env.proxy([batch_conf(mode, stream, **kw)], ack_timeout_ms=400)

        def slow(d):
            time.sleep(0.02)
            return (pb.Ack.ACK, "")

        w = env.worker(p.endpoint, behave=slow)
        wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
        time.sleep(0.5)                     # the reader is live
        before, start, i = loop_iterations(p), time.monotonic(), 0
        while time.monotonic() - start < 2.0:
            publish(r, stream, [{"eventId": f"{name}-{i}"}])
            i += 1
            time.sleep(0.001)
        rate[name] = (loop_iterations(p) - before) / (time.monotonic() - start)
        assert len(w.keys()) > 10
        w.close()
        p.stop()
    print("loop turns a second", rate)
    assert rate["hold"] < 3 * rate["no hold"] + 300, rate


@pytest.mark.parametrize("mode", MODES)
def test_an_ack_timer_reads_the_held_answers_before_it_times_out(env, mode):
    """An answer held for the window's end (above) is not an ack timeout:
    when an ack timer fires while answers are held, the proxy reads them
    first. linger_ms 100 and commit_ms 100 (windows and holds of 100 ms, kept
    open by a copy published every 10 ms), ack_timeout_ms 1600; five workers
    each answer ACK 1560 ms after their delivery, so each answer waits for a
    window's end that falls after its ack timer about three times in five.
    Each entry is delivered once, no ack times out, each is done; without the
    read first most of them were timed out and delivered a second time."""
    r = env.r
    conf = batch_conf(mode, "room", linger_ms=100, commit_ms=100)
    p = env.proxy([conf], ack_timeout_ms=1600)

    def slow(d):
        if d.key != "filler":
            time.sleep(1.56)
        return (pb.Ack.ACK, "")

    ws = [env.worker(p.endpoint, behave=slow) for _ in range(5)]
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 5, what="the workers")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "filler"}])
    wait_for(lambda: r.exists("idem:filler"), what="the filler done: the rest are copies")
    keys = [f"u{i}" for i in range(5)]
    t_end = time.monotonic() + 3.5
    i = 0
    while time.monotonic() < t_end:
        if i % 3 == 0 and i // 3 < len(keys):
            publish(r, "room", [{"eventId": keys[i // 3]}])
        publish(r, "room", [{"eventId": "filler"}])
        i += 1
        time.sleep(0.01)
    wait_for(lambda: all(r.exists(f"idem:{k}") for k in keys), what="each done")
    got = [(d.key, d.attempt) for w in ws for d in w.got if d.key != "filler"]
    assert sorted(got) == [(k, 1) for k in keys], got
    assert ack_timeouts(p) == 0


@pytest.mark.parametrize("mode", MODES)
def test_an_unanswered_delivery_times_out_while_windows_follow_one_another(env, mode):
    """The read an ack timer does first (above) is done once per delivery:
    an answer that never comes still times out on time while the windows,
    and their holds, follow one another. linger_ms 50, commit_ms 50 and
    ack_timeout_ms 800 (holds of 50 ms), a copy every 10 ms for 2.5 s; the
    worker never answers the first delivery of 'silent'. Its ack timeout is
    counted well before the copies stop, the loop does not spin meanwhile,
    and it is delivered again and done. (The once-per-delivery flag itself
    is not seen here: between one window's end and the next read's reply no
    hold is on, and the connections go back in the watch.)"""
    r = env.r
    conf = batch_conf(mode, "room", linger_ms=50, commit_ms=50)
    p = env.proxy([conf], ack_timeout_ms=800)

    def behave(d):
        return None if d.key == "silent" and d.attempt == 1 else (pb.Ack.ACK, "")

    w = env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "filler"}])
    wait_for(lambda: r.exists("idem:filler"), what="the filler done: the rest are copies")
    publish(r, "room", [{"eventId": "silent"}])
    before = loop_iterations(p)
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        publish(r, "room", [{"eventId": "filler"}])
        time.sleep(0.01)
    turns = (loop_iterations(p) - before) / 2.5
    print("loop turns a second", turns)
    assert ack_timeouts(p) == 1
    assert turns < 2000, turns
    wait_for(lambda: r.exists("idem:silent"), what="silent delivered again and done")
    assert [d.attempt for d in w.got if d.key == "silent"] == [1, 2]


@pytest.mark.parametrize("mode", MODES)
def test_a_read_queued_behind_a_window_keeps_its_whole_block_time(env, mode):
    """The read queued behind the window's BLPOP starts its BLOCK (2 s) only
    once the window ends, so its deadline counts the window too: with
    redis.timeout_ms 50 and a 100 ms window, an idle stream after one entry
    keeps its link (before: timed out 2.05 s after the read was queued, while
    Redis still held it, every time), and the next entry is delivered."""
    r = env.r
    p = env.proxy([batch_conf(mode, "room", linger_ms=100, lease_ms=1000)], timeout_ms=50)
    w = env.worker(p.endpoint)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "a"}])
    wait_for(lambda: w.keys() == ["a"], 10, "a delivered")
    time.sleep(3.0)                         # idle: the window, then the read's 2 s block
    publish(r, "room", [{"eventId": "b"}])
    wait_for(lambda: sorted(w.keys()) == ["a", "b"], 10, "b delivered")
    lost = [ln for ln in p.log_text().splitlines() if "link lost" in ln]
    assert lost == [], lost


@pytest.mark.parametrize("mode", MODES)
def test_batch_window_waits_in_the_proxy_when_redis_refuses_its_blpop(env, mode):
    """A BLPOP refused (here its key holds a string: WRONGTYPE; a user
    without +blpop gets NOPERM, tests/integration/test_auth.py) keeps the
    window in the proxy on that link: one warning, one refused BLPOP, and the
    window still batches (twelve entries 20 ms apart, linger_ms 100: a few
    reads take them all, as the linger test above). The key is left as it
    was. Without the fallback every window would be refused at once and
    each entry read on its own."""
    r = env.r
    r.set(window_key("room"), "not a list")
    cmd = "xreadgroup" if mode == "group" else "xread"
    conf = batch_conf(mode, "room", linger_ms=100)
    p = env.proxy([conf])
    w = env.worker(p.endpoint)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    before, blpops = reads_of(r, cmd), reads_of(r, "blpop")
    for i in range(12):
        publish(r, "room", [{"eventId": f"t{i}"}])
        time.sleep(0.02)
    wait_for(lambda: len(w.keys()) == 12, what="the trickle delivered")
    assert sorted(w.keys()) == sorted(f"t{i}" for i in range(12))
    assert reads_of(r, cmd) - before <= 6
    assert reads_of(r, "blpop") - blpops == 1
    warned = [ln for ln in p.log_text().splitlines() if "the batch window waits in this process" in ln]
    assert len(warned) == 1 and "WRONGTYPE" in warned[0], warned
    assert r.get(window_key("room")) == "not a list"


@pytest.mark.parametrize("mode", MODES)
def test_done_mark_rides_with_the_next_pages_claim(env, mode):
    """streams[].commit_ms (default 5): while the batch window is open, an
    acked entry's done mark waits for the claims of the next page and goes in
    their write (issue 34), at most commit_ms. linger_ms 50 keeps the window
    open after every page, commit_ms 100: the worker, handed e1, publishes e2
    and then acks e1, so e2 is read when e1's window ends, some 50 ms after
    e1's ACK. On the command link (MONITOR, by client) e1's done mark is the
    command right before e2's claim (first in the write, so a copy in the page
    finds its key done), and in group mode e1's XACK comes after its done mark;
    a done mark written at once went out alone, well before e2's claim."""
    import threading
    r = env.r
    conf = batch_conf(mode, "room", linger_ms=50, commit_ms=100)
    arrived = {}

    def behave(d):
        arrived.setdefault(d.key, time.monotonic())
        if d.key == "e1":
            publish(r, "room", [{"eventId": "e2"}])
        return (pb.Ack.ACK, "")

    p = env.proxy([conf])
    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    seen, stop = [], threading.Event()

    def watch():
        with r.monitor() as m:
            for c in m.listen():
                seen.append((c.get("client_address"), c.get("client_port"), c.get("command", "")))
                if stop.is_set():
                    return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.2)                         # MONITOR is on
    (id1,) = publish(r, "room", [{"eventId": "e1"}])
    wait_for(lambda: "e2" in arrived, 10, "e1 and e2 delivered")
    wait_for(lambda: all((r.get(f"idem:{k}") or "")[:1] == "D" for k in ("e1", "e2")), 10, "both done")
    if mode == "group":
        wait_for(lambda: pending(r, "room", "game-server") == 0, 10, "both acked")
    stop.set()
    r.ping()                                # one more command ends the watch
    t.join(5)
    cmds = list(seen)
    at = lambda pred: next(i for i, c in enumerate(cmds) if pred(c[2]))
    claim2 = at(lambda c: c.startswith("SET idem:e2 L:"))
    done1 = at(lambda c: c.startswith("SET idem:e1 D:"))
    link = cmds[done1][:2]
    mine = [c[2].split(" ")[:2] for c in cmds[done1:] if c[:2] == link]
    assert done1 < claim2 and mine[:2] == [["SET", "idem:e1"], ["SET", "idem:e2"]], \
        [c[2][:40] for c in cmds]
    if mode == "group":
        assert done1 < at(lambda c: c.startswith("XACK room") and str(id1) in c), "done mark first"
    assert sorted(arrived) == ["e1", "e2"]


@pytest.mark.parametrize("mode", MODES)
def test_a_copy_read_while_its_original_rides_finds_it_done(env, mode):
    """The ride's write puts the done marks before the claims: the worker,
    handed e1, publishes a copy of e1 and acks; the copy is read in the page
    e1's done mark waits for (linger_ms 50, commit_ms 100), and its claim
    must find e1 done, a plain duplicate: not e1's own lock (counted busy,
    parked behind it, claimed again), as when the claims went first."""
    r = env.r
    conf = batch_conf(mode, "room", linger_ms=50, commit_ms=100)
    got = []

    def behave(d):
        got.append(d.key)
        if len(got) == 1:
            publish(r, "room", [{"eventId": "e1"}])
        return (pb.Ack.ACK, "")

    p = env.proxy([conf])
    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "e1"}])
    wait_for(lambda: outcomes(p, "room").get("duplicate", 0) >= 1, 10, "the copy skipped")
    time.sleep(0.3)
    assert got == ["e1"]
    busy = sum(v for k, v in p.metrics().items() if k.startswith("idemproxy_lock_busy_total"))
    assert busy == 0, "the copy met e1's lock, not its done mark"


@pytest.mark.parametrize("mode", MODES)
def test_a_riding_done_mark_waits_commit_ms_at_most(env, mode):
    """The ride is bounded: a lone entry, acked while its window is open
    (linger_ms 50), with no page after it for its done mark to ride with,
    is marked done when commit_ms (100) runs out, not when the reader's
    blocking read (2 s) next comes back empty."""
    r = env.r
    acked = []

    def behave(d):
        acked.append(time.monotonic())
        return (pb.Ack.ACK, "")

    p = env.proxy([batch_conf(mode, "room", linger_ms=50, commit_ms=100)])
    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "lone"}])
    wait_for(lambda: (r.get("idem:lone") or "")[:1] == "D", 5, "lone done")
    took = time.monotonic() - acked[0]
    assert took < 0.6, f"done {took:.2f} s after the ACK"


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_writes_a_riding_done_mark_at_once(env, mode):
    """SIGTERM while a done mark waits to ride (commit_ms 100, a grace of
    30 ms, shorter than the wait): it is written at once, then the XACK, and
    the process exits 0 with the entry done and nothing pending."""
    import threading
    r = env.r
    p = env.proxy([batch_conf(mode, "room", linger_ms=50, commit_ms=100)], shutdown_grace_ms=30)

    def behave(d):
        threading.Timer(0.005, lambda: p.proc and p.proc.send_signal(signal.SIGTERM)).start()
        return (pb.Ack.ACK, "")

    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "last"}])
    wait_for(lambda: p.proc is None or p.proc.poll() is not None, 10, "the proxy gone after SIGTERM")
    assert p.stop() == 0
    assert (r.get("idem:last") or "")[:1] == "D"
    if mode == "group":
        assert pending(r, "room", "game-server") == 0


@pytest.mark.parametrize("mode", MODES)
def test_links_cut_while_a_done_mark_rides_write_it_after_the_reconnect(env, mode):
    """Redis drops every link of the proxy (CLIENT KILL) 5 ms after the
    worker's ACK, while the done mark waits to ride (commit_ms 100): it is
    written once the links are back; the entry is done, delivered once and
    (group) not pending."""
    import threading
    r = env.r
    p = env.proxy([batch_conf(mode, "room", linger_ms=50, commit_ms=100)])

    def behave(d):
        threading.Timer(0.005, lambda: r.client_kill_filter(_type="normal", skipme=True)).start()
        return (pb.Ack.ACK, "")

    w = env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    publish(r, "room", [{"eventId": "cut"}])
    wait_for(lambda: (r.get("idem:cut") or "")[:1] == "D", 10, "cut done")
    if mode == "group":
        wait_for(lambda: pending(r, "room", "game-server") == 0, 10, "nothing pending")
    time.sleep(0.5)                         # a second delivery would have come by now
    assert w.keys() == ["cut"]


@pytest.mark.parametrize("mode", MODES)
def test_batch_window_never_holds_an_entry_after_a_quiet_spell(env, mode):
    """The window opens only after a page that came within 50 ms of the one
    before: an entry after a quiet spell is read at once, and so is one that
    follows it closely (the window a fixed linger would open after the first
    is not opened). batch_ms 100, pairs of entries 10 ms apart with 300 ms of
    quiet before each pair: the second of a pair would wait about 90 ms in a
    window; the quickest of three must reach the worker within 50 ms (a
    margin for a loaded machine)."""
    r = env.r
    conf = batch_conf(mode, "room", batch_ms=100)
    arrived = {}

    def behave(d):
        arrived.setdefault(d.key, time.monotonic())
        return (pb.Ack.ACK, "")

    p = env.proxy([conf])
    env.worker(p.endpoint, behave=behave)
    wait_for(lambda: p.metrics().get("idemproxy_workers_connected") == 1, what="the worker")
    time.sleep(0.5)                         # the reader is live
    first, second = [], []
    for i in range(3):
        time.sleep(0.3)                     # quiet
        t0 = time.monotonic()
        publish(r, "room", [{"eventId": f"a{i}"}])
        time.sleep(0.01)
        t1 = time.monotonic()
        publish(r, "room", [{"eventId": f"b{i}"}])
        wait_for(lambda: f"b{i}" in arrived and f"a{i}" in arrived, 10, f"pair {i} delivered")
        first.append(arrived[f"a{i}"] - t0)
        second.append(arrived[f"b{i}"] - t1)
    ms = lambda xs: [round(x * 1000) for x in xs]
    assert min(first) < 0.05, ms(first)
    assert min(second) < 0.05, (ms(first), ms(second))
