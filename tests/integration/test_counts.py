"""Group mode: Redis' delivery count is idemproxy's real deliveries of an
entry, across replicas (docs/guarantee.md): an entry that waits undelivered is not
charged a delivery, and a refresh keeps only entries this consumer still owns,
so an entry another replica took over is never delivered from here again.
Two replicas on one group; one's command link to Redis drops whenever it
carries chosen commands (slowlink.SlowLink.refuse), so its refreshes never
arrive and the other takes its entries over."""
import time

import pytest

from pxtest import Proxy, pb, pending, publish, wait_for
from slowlink import SlowLink

STREAM = {"stream": "room", "payload_field": "payload", "key": "#event.eventId",
          "layout": "single", "group": "game-server", "dead_letter": "dlq"}


def replica(env, name, url, consumer, **stream):
    p = Proxy(env.tmp, name, url, env.endpoint(), [dict(STREAM, consumer=consumer, **stream)],
              timeout_ms=200)
    env.proxies.append(p)
    return p.start()


def owner(r, eid):
    """(consumer, delivery count) of a pending entry, or None."""
    for e in r.xpending_range("room", "game-server", eid, eid, 1):
        return e["consumer"], e["times_delivered"]
    return None


@pytest.mark.parametrize("max_deliveries", [1, 2])
def test_an_entry_parked_undelivered_is_not_charged_a_delivery(env, max_deliveries):
    """A foreign lock holds E's key for 2.5 s; replica A reads E, finds it
    busy and parks it. Then for 8 s A's command link drops whenever it
    carries XCLAIM, SET or a script, so its refreshes never arrive, and
    replica B's XAUTOCLAIM takes E over (Redis counts one more). No worker
    has seen E: B's first delivery must be attempt 1. Before, A's read was
    charged as a delivery: with max_deliveries 1 E was dead-lettered without
    any worker seeing it, with 2 its first delivery was attempt 2. A parked
    entry now has its count set back to its deliveries (0) when it first
    parks. (A's claim_idle_ms is longer than B's only so that A's own
    XAUTOCLAIM, which may take back an entry it tracks, cannot race B's.)"""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    r.set("idem:k1", "L:foreign", px=2500)
    link = SlowLink(env.redis.port, 0)
    try:
        a = replica(env, "A", link.url, "a", claim_idle_ms=6000, max_deliveries=max_deliveries)
        wa = env.worker(a.endpoint)
        (eid,) = publish(r, "room", [{"eventId": "k1"}])
        wait_for(lambda: "busy: looking again" in a.log_text(), what="A parked E")
        time.sleep(0.3)                                   # what A sends as it parks arrives
        link.refuse([b"XCLAIM", b"SET", b"EVAL"], 8.0)
        b = replica(env, "B", env.redis.url, "b", claim_idle_ms=600, max_deliveries=max_deliveries)
        wb = env.worker(b.endpoint)
        wait_for(lambda: len(wa.got) + len(wb.got) + r.xlen("dlq") >= 1, timeout=20,
                 what="E delivered or dead-lettered")
        assert r.xlen("dlq") == 0, [f["idemproxy-reason"] for _, f in r.xrange("dlq")]
        assert [(d.key, d.attempt) for d in wa.got + wb.got] == [("k1", 1)]
        assert link.refusing >= 1
        wait_for(lambda: pending(r, "room", "game-server") == 0, timeout=20, what="E acked")
        time.sleep(0.5)
        assert [(d.key, d.attempt) for d in wa.got + wb.got] == [("k1", 1)]
    finally:
        link.close()


def test_an_entry_taken_over_is_never_redelivered_from_here(env):
    """Replica A delivers E; its worker takes 2.5 s and answers RETRY. For
    1.6 s A's command link drops whenever it carries XCLAIM or a script, so
    its refreshes never arrive, and replica B's XAUTOCLAIM takes E over (B
    parks it behind A's lock). Before, A never noticed: its next refresh
    (XCLAIM min-idle 0) took E back, and both redelivered it, each counting
    on its own: 4 deliveries with max_deliveries 3, attempt 2 sent twice.
    A refresh now keeps only the entries this consumer still owns; E, taken
    over, is not redelivered from here once its worker answers RETRY, and B
    delivers it from its own count (docs/guarantee.md)."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    link = SlowLink(env.redis.port, 0)
    first = []

    def slow_first(d):
        if not first:
            first.append(d.attempt)
            time.sleep(2.5)
        return pb.Ack.RETRY, "not yet"

    conf = dict(claim_idle_ms=600, max_deliveries=3, retry_backoff_ms=1500)
    try:
        a = replica(env, "A", link.url, "a", **conf)
        wa = env.worker(a.endpoint, behave=slow_first)
        publish(r, "room", [{"eventId": "k1"}])
        wait_for(lambda: len(wa.got) == 1, what="A delivered E")
        link.refuse([b"XCLAIM", b"EVAL"], 1.6)
        b = replica(env, "B", env.redis.url, "b", **conf)
        wb = env.worker(b.endpoint, behave=lambda d: (pb.Ack.RETRY, "not yet"))
        wait_for(lambda: r.xlen("dlq") == 1, timeout=30, what="E dead-lettered")
        wait_for(lambda: pending(r, "room", "game-server") == 0, timeout=20, what="E acked")
        time.sleep(2.0)                                   # any delivery still to come
        attempts = sorted(d.attempt for d in wa.got + wb.got)
        assert link.refusing >= 1
        assert wb.got, "B never took E over: the scenario did not happen"
        assert len(attempts) == len(set(attempts)), f"an attempt sent twice: {attempts}"
        assert len(attempts) <= 3, attempts
        assert r.xlen("dlq") == 1
    finally:
        link.close()


def test_an_entry_waiting_for_a_worker_is_not_charged_a_delivery(env):
    """Replica A claims E but has no worker: E waits for a window, holding
    its lock. Then A's command link drops whenever it carries XCLAIM, SET or
    a script for 6 s, so its refreshes and lease extensions never arrive:
    the lease runs out and replica B's XAUTOCLAIM takes E over (Redis counts
    one more). No worker has seen E: B's first delivery must be attempt 1,
    not a dead letter with max_deliveries 1. An entry still waiting for a
    worker at a refresh has its count set back to its deliveries, once, so
    flow control's short waits cost nothing. Once its link is back, A lets
    E go (B's, or done). (A's claim_idle_ms is longer than
    B's so that A's own XAUTOCLAIM cannot race B's.)"""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    link = SlowLink(env.redis.port, 0)
    try:
        a = replica(env, "A", link.url, "a", claim_idle_ms=3000, lease_ms=2000, max_deliveries=1)
        (eid,) = publish(r, "room", [{"eventId": "k1"}])
        wait_for(lambda: (r.get("idem:k1") or "").startswith("L:"), what="A claimed E")
        wait_for(lambda: owner(r, eid) == ("a", 0), timeout=10,
                 what="E's count set back while it waits for a worker")
        link.refuse([b"XCLAIM", b"SET", b"EVAL"], 6.0)
        b = replica(env, "B", env.redis.url, "b", claim_idle_ms=600, lease_ms=2000, max_deliveries=1)
        wb = env.worker(b.endpoint)
        wait_for(lambda: len(wb.got) + r.xlen("dlq") >= 1, timeout=20, what="E delivered or dead-lettered")
        assert r.xlen("dlq") == 0, [f["idemproxy-reason"] for _, f in r.xrange("dlq")]
        assert [(d.key, d.attempt) for d in wb.got] == [("k1", 1)]
        wait_for(lambda: pending(r, "room", "game-server") == 0, timeout=20, what="E acked")
        wait_for(lambda: a.metrics().get('idemproxy_entries_pending{stream="room",group="game-server"}') == 0,
                 timeout=15, what="A let E go")
    finally:
        link.close()


def test_a_draining_replica_keeps_what_its_worker_holds_fresh(env):
    """SIGTERM stops reading, but the drain waits up to shutdown_grace_ms for
    the workers' answers. The refresh stopped with the reads, so an entry a
    worker still held looked idle after claim_idle_ms and another replica
    took it over: read there too, counted a duplicate where there was no
    copy (docs/guarantee.md: no live replica's work is taken over;
    docs/operations.md). The
    refresh now goes on until the drain ends."""
    import signal
    r = env.r
    r.xgroup_create("s", "g", id="0", mkstream=True)
    blk = {"stream": "s", "group": "g", "key": "#event.eventId", "payload_field": "payload",
           "claim_idle_ms": 3000}
    ep_a, ep_b = env.endpoint(), env.endpoint()
    wa = env.worker(ep_a, manual=True)
    pa = env.proxy([dict(blk, consumer="A")], endpoint=ep_a, shutdown_grace_ms=9000, ack_timeout_ms=20000)
    r.xadd("s", {"payload": '{"eventId":"k1"}'})
    wait_for(lambda: len(wa.inbox) == 1, 10, "k1 with A's worker")
    env.worker(ep_b)
    pb_ = env.proxy([dict(blk, consumer="B")], endpoint=ep_b)
    pa.proc.send_signal(signal.SIGTERM)              # A drains: its worker still has k1
    t0 = time.time()
    owners = set()
    while time.time() - t0 < 6.5:                    # over twice claim_idle_ms
        owners |= {x["consumer"] for x in r.xpending_range("s", "g", "-", "+", 5)}
        time.sleep(0.2)
    wa.answer(pb.Ack.ACK)
    wait_for(lambda: r.xpending("s", "g")["pending"] == 0, 10, "k1 acked")
    assert owners == {"A"}, f"k1 was taken over while A's worker held it: {owners}"
    m = pb_.metrics()
    assert m['idemproxy_entries_read_total{stream="s",group="g"}'] == 0


def test_an_entry_taken_over_while_the_link_was_down_is_not_sent_again(env):
    """A's worker answered RETRY (retry_after_ms 4000); while A waited, the
    entry was taken over by consumer B (as B's XAUTOCLAIM does once A's
    refreshes stop reaching Redis) and A's links dropped. The refresh that
    finds a takeover ran only every claim_idle_ms / 3 (10 s here), so A's
    backoff ended first and A claimed and delivered it again (docs/guarantee.md:
    not redelivered from here). A refreshes as soon as its command link is
    back, before anything else it sends."""
    r = env.r
    r.xgroup_create("s", "g", id="0", mkstream=True)
    got = []

    def behave(d):
        got.append(d.attempt)
        return pb.Ack(status=pb.Ack.RETRY, reason="later", retry_after_ms=4000).SerializeToString()

    p = env.proxy([{"stream": "s", "group": "g", "consumer": "A", "key": "#event.eventId",
                    "payload_field": "payload", "claim_idle_ms": 30000}])
    env.worker(p.endpoint, behave=behave)
    (eid,) = publish(r, "s", [{"eventId": "k1"}])
    wait_for(lambda: got == [1], 10, "the first delivery, answered RETRY")
    time.sleep(0.3)
    r.xclaim("s", "g", "B", 0, [eid], justid=True)       # B takes it over
    r.client_kill_filter(_type="normal", skipme=True)    # A's links drop; A reconnects
    wait_for(lambda: "taken over" in p.log_text(), 3, "A sees the takeover")
    time.sleep(5)                                        # past A's 4 s backoff
    assert got == [1], f"A delivered k1 again after it was taken over: attempts {got}"
    assert [x["consumer"] for x in r.xpending_range("s", "g", "-", "+", 5)] == ["B"]


def test_a_replayed_entry_a_worker_holds_is_not_charged_a_delivery(env):
    """Chaos seed 226 of --net: A delivers E (Redis counts 1) and its worker
    holds it. A's links drop (a Redis restart, here CLIENT KILL); on
    reconnect the reader replays A's history, which counts E once more
    (Redis: 2), and A sets the count back, as E is still its own, with no
    delivery more. That set-back goes on the command link, which was not up
    yet (the seed: the reader's link came back 7 ms first) or, here, drops
    whenever it carries a script for 3 s: it never arrived, and nothing sent
    it again until E's next delivery. A then died (kill -9) with Redis'
    count at 2: restarted, it delivered E as attempt 3 after one delivery.
    A count whose set was lost is sent again when the command link is back
    (and at each refresh); E's next delivery is attempt 2."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    link = SlowLink(env.redis.port, 0)
    stream = dict(STREAM, consumer="a", claim_idle_ms=30000, lease_ms=10000)
    a = Proxy(env.tmp, "A", link.url, env.endpoint(), [stream], timeout_ms=200, ack_timeout_ms=30000)
    env.proxies.append(a)
    try:
        a.start()
        wa = env.worker(a.endpoint, manual=True)
        (eid,) = publish(r, "room", [{"eventId": "k1"}])
        wait_for(lambda: len(wa.inbox) == 1, what="E with A's worker")
        assert owner(r, eid) == ("a", 1)
        link.refuse([b"\r\nEVAL"], 3.0)
        r.client_kill_filter(_type="normal", skipme=True)   # A's links drop; A replays its history
        wait_for(lambda: owner(r, eid) == ("a", 2), timeout=5, what="the replay's read counted")
        wait_for(lambda: link.refusing >= 1, timeout=5, what="a script refused")
        wait_for(lambda: owner(r, eid) == ("a", 1), timeout=10,
                 what="E's count set back once the command link is back")
        a.kill9()
        wa.close()
        r.delete("idem:k1")                                # its lease, run out sooner
        a.start()
        wb = env.worker(a.endpoint)
        wait_for(lambda: len(wb.got) == 1, timeout=10, what="E delivered again after the restart")
        assert [(d.key, d.attempt) for d in wb.got] == [("k1", 2)]
    finally:
        link.close()
