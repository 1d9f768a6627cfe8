"""Leases that may have run out (issue 30, findings 1 and 5;
docs/guarantee.md, docs/operations.md): an
entry is sent only while its lease is known to be held, and
idemproxy_lease_lost_total counts only leases that were held. Real
redis-server, two real proxies, one of them behind slowlink.py's forwarder,
which can refuse its link to Redis."""
import time

import pytest

from pxtest import Proxy, pb, publish, wait_for
from slowlink import SlowLink


def stream_conf(mode, **kw):
    s = {"stream": "room", "payload_field": "payload", "key": "#event.eventId", "layout": "single"}
    if mode == "group":
        s.update(group="g", claim_idle_ms=1000)
    s.update(kw)
    return s


def one(m, family, **labels):
    """The value of the one series of 'family' whose labels include 'labels'."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = [v for k, v in m.items() if k.startswith(family + "{") and all(w in k for w in want)]
    assert len(found) == 1, (family, labels, found)
    return found[0]


@pytest.mark.parametrize("fencing", [False, True], ids=["plain", "fencing"])
@pytest.mark.parametrize("mode", ["group", "groupless"])
def test_a_lease_that_ran_out_while_cut_off_is_never_sent(env, tmp_path, mode, fencing):
    """Finding 1: replica A claims E (lease_ms 1000) but has no worker to send
    it to. A's link to Redis is then refused: no extension can answer, E's lock
    expires, replica B claims E, delivers it, its worker ACKs, E is done. Then a
    worker connects to A. A sent E at once (it checked only for an extension
    that had answered 0, and none could): delivered twice, and with fencing
    the second delivery carried the lower token. Now A sends E only while the
    last reply that confirmed its lock answered a command sent less than
    lease_ms - timeout_ms ago: never while cut off; once the link is back an
    extension finds the lease lost and the claim finds E done."""
    r = env.r
    link = SlowLink(env.redis.port, 0)
    try:
        ep_a, ep_b = env.endpoint(), env.endpoint()
        a = Proxy(tmp_path, "a", link.url, ep_a,
                  [stream_conf(mode, consumer="a", lease_ms=1000, fencing=fencing)], timeout_ms=300)
        env.proxies.append(a)
        a.start()
        wait_for(lambda: a.get("/readyz")[0] == 200, 10, "A ready")
        publish(r, "room", [{"eventId": "E"}])
        wait_for(lambda: (r.get("idem:E") or "").startswith("L:"), 10, "A holds E's lock")
        link.refuse([b"*"], 3600)                      # every command A sends: its link drops
        b = env.proxy([stream_conf(mode, consumer="b", lease_ms=1000, fencing=fencing)],
                      endpoint=ep_b, timeout_ms=300)
        w_b = env.worker(ep_b)
        wait_for(lambda: (r.get("idem:E") or "")[:1] == "D", 20, "E claimed by B after A's lease, acked, done")
        assert w_b.keys() == ["E"]
        assert link.refusing >= 1
        w_a = env.worker(ep_a)
        wait_for(lambda: a.metrics().get("idemproxy_workers_connected") == 1, 10,
                 "a worker connected to A")
        # Before, A sent E within a loop turn of the connection; a second is
        # ample time to see it. Nothing may come while A is cut off.
        time.sleep(1.0)
        if fencing:                                    # a stale holder's token is the lower one
            stale = [(d.fencing_token, w_b.got[0].fencing_token) for d in w_a.got
                     if d.fencing_token <= w_b.got[0].fencing_token]
            assert stale == [], f"A sent tokens after B's higher one: {stale}"
        assert w_a.keys() == [], "A sent E on a lease that had run out while it was cut off"
        link.refuse([], 0)                             # the link is back
        wait_for(lambda: one(a.metrics(), "idemproxy_outcomes_total", outcome="duplicate") == 1, 20,
                 "A finds E done")
        assert one(a.metrics(), "idemproxy_entries_pending") == 0
        assert w_a.keys() == [], "A sent E after B's worker acked it"
        assert (r.get("idem:E") or "")[:1] == "D"
    finally:
        link.close()


@pytest.mark.parametrize("mode", ["group", "groupless"])
def test_a_lease_that_ran_out_while_cut_off_alone_is_claimed_again_and_sent_once(env, tmp_path, mode):
    """The other side of finding 1: with no other replica, an entry whose
    lease may have run out while its replica was cut off waits for Redis,
    not for ever: once the link is back, the extension finds the lock gone
    (a lease that was held: counted), the entry is claimed again and
    delivered once."""
    r = env.r
    link = SlowLink(env.redis.port, 0)
    try:
        ep = env.endpoint()
        a = Proxy(tmp_path, "a", link.url, ep, [stream_conf(mode, consumer="a", lease_ms=1000)],
                  timeout_ms=300)
        env.proxies.append(a)
        a.start()
        wait_for(lambda: a.get("/readyz")[0] == 200, 10, "A ready")
        publish(r, "room", [{"eventId": "E"}])
        wait_for(lambda: (r.get("idem:E") or "").startswith("L:"), 10, "A holds E's lock")
        link.refuse([b"*"], 3600)
        wait_for(lambda: r.get("idem:E") is None, 10, "A's lease ran out")
        w = env.worker(ep)
        wait_for(lambda: a.metrics().get("idemproxy_workers_connected") == 1, 10, "a worker connected")
        time.sleep(1.0)
        assert w.keys() == [], "sent on a lease that had run out"
        link.refuse([], 0)
        wait_for(lambda: (r.get("idem:E") or "")[:1] == "D", 20, "E claimed again, delivered and acked")
        wait_for(lambda: one(a.metrics(), "idemproxy_entries_pending") == 0, 10, "E left")
        m = a.metrics()
        assert [(d.key, d.attempt) for d in w.got] == [("E", 1)]
        assert one(m, "idemproxy_outcomes_total", outcome="acked") == 1
        assert one(m, "idemproxy_lease_lost_total") == 1
    finally:
        link.close()


@pytest.mark.parametrize("mode", ["group", "groupless"])
def test_a_failed_claim_is_no_lease_lost(env, tmp_path, mode):
    """Finding 5: a claim whose SET never reached Redis (its link dropped as
    it carried it) left the lock "maybe held"; the extension that follows
    answered 0 and was counted in idemproxy_lease_lost_total with a "lease
    lost" line, a lease that was never held, and the flag stayed: the next
    good claim was bounced through a second claim ("lease lost before
    delivery"). Now a lease is counted lost only once a reply confirmed it
    held; the entry is delivered once, and nothing is counted."""
    r = env.r
    link = SlowLink(env.redis.port, 0)
    try:
        ep = env.endpoint()
        p = Proxy(tmp_path, "cut", link.url, ep, [stream_conf(mode, consumer="a", lease_ms=900)],
                  timeout_ms=300)
        env.proxies.append(p)
        p.start()
        w = env.worker(ep)
        wait_for(lambda: p.get("/readyz")[0] == 200, 10, "ready")
        # For a second, the link drops whenever it carries the claim's SET:
        # the claim fails (not applied), the extensions meanwhile answer 0.
        link.refuse([b"$3\r\nSET\r\n$6\r\nidem:k\r\n"], 1.0)
        publish(r, "room", [{"eventId": "k"}])
        wait_for(lambda: (r.get("idem:k") or "")[:1] == "D", 20, "k delivered and done")
        wait_for(lambda: one(p.metrics(), "idemproxy_entries_pending") == 0, 10, "k left")
        assert link.refusing >= 1, "no claim was refused"
        m = p.metrics()
        assert one(m, "idemproxy_lease_lost_total") == 0
        assert one(m, "idemproxy_outcomes_total", outcome="acked") == 1
        assert [(d.key, d.attempt) for d in w.got] == [("k", 1)]
        log = p.log_text()
        assert "lease lost" not in log, [l for l in log.splitlines() if "lease lost" in l]
    finally:
        link.close()


@pytest.mark.parametrize("mode", ["group", "groupless"])
def test_a_lock_never_confirmed_and_found_gone_goes_back_to_the_claim(env, tmp_path, mode):
    """The claim's SET was applied but its reply lost (the link cut after
    it); the claim after the reconnect found our own token (not a
    confirmation: the lock's expiry may be near) and the extension sent
    right after it found the lock gone. That lease was never known held, so
    nothing is counted; but the entry waited, unsendable, for ever (every
    later extension answered 0 too). It goes back to the claim, takes the
    lock afresh, and is delivered once."""
    import threading
    r = env.r
    link = SlowLink(env.redis.port, 0.25, cut_on=b"$6\r\nidem:k\r\n", cuts=1, cut_wait=0.2)
    stop = threading.Event()
    sets = []

    def watch():
        with r.monitor() as m:
            for cmd in m.listen():
                if stop.is_set():
                    return
                c = cmd.get("command", "")
                if c.startswith("SET idem:k "):
                    sets.append(c)

    def drop_the_lock():
        # The second SET of idem:k is the claim after the reconnect: the lock
        # goes once Redis applied it, before any command sent after it.
        wait_for(lambda: len(sets) >= 2, 10, "the claim after the reconnect applied")
        r.delete("idem:k")
        dropped.set()

    dropped = threading.Event()
    link.after_command(b"$3\r\nSET\r\n$6\r\nidem:k\r\n", drop_the_lock, nth=2)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        ep = env.endpoint()
        p = Proxy(tmp_path, "cut", link.url, ep, [stream_conf(mode, consumer="a", lease_ms=4000, **({"claim_idle_ms": 6000} if mode == "group" else {}))],
                  timeout_ms=1000)
        env.proxies.append(p)
        p.start()
        wait_for(lambda: p.get("/readyz")[0] == 200, 10, "ready")
        publish(r, "room", [{"eventId": "k"}])
        wait_for(dropped.is_set, 15, "the claim, cut, and the claim after the reconnect")
        time.sleep(1.5)               # the extension has answered 0 by now
        w = env.worker(ep)            # room to send: it must be claimed again and go out
        wait_for(lambda: (r.get("idem:k") or "")[:1] == "D", 15, "k claimed again, delivered, done")
        assert [(d.key, d.attempt) for d in w.got] == [("k", 1)]
        assert one(p.metrics(), "idemproxy_lease_lost_total") == 0
    finally:
        stop.set()
        link.close()
