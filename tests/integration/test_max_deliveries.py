"""max_deliveries at its boundary (docs/guarantee.md, issue 30): an entry Redis has
handed out exactly max_deliveries times, by a consumer that crashed or by this
one before a restart, is dead-lettered without another delivery; one handed
out once fewer gets its last delivery. Redis' delivery count is the evidence
(a read that brings an entry back counts the delivery it is read for, so the
deliveries before it are one fewer). A poison check at claim that let
`attempt == max_deliveries` through (`>` for `>=`) passed every other test:
they used a count past the boundary, never at it."""
from pxtest import pb, pending, publish, wait_for

# claim_idle_ms at least three times timeout_ms (issue 30).
TIMEOUT_MS, CLAIM_IDLE_MS = 300, 1000


def conf(**kw):
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "max_deliveries": 3, "dead_letter": "dlq",
         "claim_idle_ms": CLAIM_IDLE_MS, "retry_backoff_ms": 50}
    s.update(kw)
    return s


def dead_letters(r):
    return [f for _, f in r.xrange("dlq")] if r.exists("dlq") else []


def test_reclaimed_entry_delivered_max_deliveries_times_is_not_delivered_again(env):
    """A crashed consumer was handed 'spent' 3 times and 'last' twice
    (max_deliveries 3). XAUTOCLAIM takes both over: 'last' is delivered once,
    as attempt 3; 'spent' is dead-lettered, never delivered, and marked done."""
    r = env.r
    r.xgroup_create("room", "g", id="0", mkstream=True)
    spent, last = publish(r, "room", [{"eventId": "spent"}, {"eventId": "last"}])
    r.xreadgroup("g", "crashed-pod", {"room": ">"})                  # count 1 each
    r.xclaim("room", "g", "crashed-pod", 0, [spent, last])           # spent 2, last 2
    r.xclaim("room", "g", "crashed-pod", 0, [spent])                 # spent 3
    counts = {e["message_id"]: e["times_delivered"] for e in r.xpending_range("room", "g", "-", "+", 10)}
    assert counts == {spent: 3, last: 2}
    p = env.proxy([conf()], timeout_ms=TIMEOUT_MS)
    w = env.worker(p.endpoint)
    wait_for(lambda: pending(r, "room", "g") == 0, 15, "both entries ended")
    assert [(d.key, d.attempt) for d in w.got] == [("last", 3)]
    dl = dead_letters(r)
    assert len(dl) == 1 and dl[0]["idemproxy-entry-id"] == spent, dl
    assert "max_deliveries (3) reached: delivery count 3" in dl[0]["idemproxy-reason"]
    assert (r.get("idem:spent") or "")[:1] == "D" and (r.get("idem:last") or "")[:1] == "D"


def test_entry_delivered_max_deliveries_times_before_a_restart_is_not_delivered_again(env):
    """This consumer delivers an entry as attempts 1 and 2 (RETRY), has
    attempt 3, the last of max_deliveries 3, in hand, and is killed (kill -9).
    After the restart its history replay brings the entry back: dead-lettered,
    never delivered a fourth time."""
    r = env.r
    ep = env.endpoint()
    p = env.proxy([conf(lease_ms=1000)], endpoint=ep, timeout_ms=TIMEOUT_MS)
    w = env.worker(ep, manual=True)
    (eid,) = publish(r, "room", [{"eventId": "k"}])
    for attempt in (1, 2):
        wait_for(lambda: w.inbox and w.inbox[0].attempt == attempt, 10, f"delivery {attempt}")
        w.answer(pb.Ack.RETRY, "not yet")
    wait_for(lambda: w.inbox and w.inbox[0].attempt == 3, 10, "delivery 3")
    wait_for(lambda: r.xpending_range("room", "g", "-", "+", 1)[0]["times_delivered"] == 3, 5,
             "Redis counts 3 deliveries")
    p.kill9()
    w.close()
    env.proxy([conf(lease_ms=1000)], endpoint=ep, timeout_ms=TIMEOUT_MS)
    w2 = env.worker(ep)
    wait_for(lambda: pending(r, "room", "g") == 0, 15, "the entry ended after the restart")
    assert w2.got == [], [(d.key, d.attempt) for d in w2.got]
    dl = dead_letters(r)
    assert len(dl) == 1 and dl[0]["idemproxy-entry-id"] == eid, dl
    assert "max_deliveries (3) reached: delivery count 3" in dl[0]["idemproxy-reason"]
    assert (r.get("idem:k") or "")[:1] == "D"
