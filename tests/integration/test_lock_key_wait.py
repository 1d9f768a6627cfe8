"""An entry that holds its dedup lock and waits for its lock_key (the room)
(docs/guarantee.md, issue 30). Two behaviours no other test told apart from their
absence: the dedup lease is extended while the entry waits, not only once it
is with a worker; and a dedup lock that passed to another holder meanwhile
(the seeds' own consumer, which does not queue for the room) sends the entry
back to the claim once the room is taken, instead of delivering it."""
import time

from pxtest import publish, wait_for


def conf(**kw):
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "lock_key": "room-lock:#{event.roomId}", "wait_ms": 10000}
    s.update(kw)
    return s


def finished(r):
    g = [x for x in r.xinfo_groups("room") if x["name"] == "g"]
    return bool(g) and g[0]["lag"] == 0 and g[0]["pending"] == 0


def test_dedup_lease_stays_held_while_waiting_for_lock_key(env):
    """The room is busy for 5 s, lease_ms is 2000: while the entry waits, its
    dedup lock stays in Redis with its own value the whole time (extended every
    third of the lease), no lease is lost, and once the room is free the
    entry is delivered once, on the lock it has held since its claim."""
    r = env.r
    r.set("room-lock:1", "someone-else", px=5000)
    p = env.proxy([conf(layout="single", lease_ms=2000)])
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "e1", "roomId": 1}])
    mine = wait_for(lambda: r.get("idem:e1"), 5, "the dedup lock taken")
    assert mine.startswith("L:"), mine
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        held = r.get("idem:e1")
        if w.got:                  # delivered: the done mark may follow
            break
        assert held == mine, f"the dedup lock while waiting for the room: {held!r}, was {mine!r}"
        time.sleep(0.02)
    wait_for(lambda: finished(r), 10, "the entry acked")
    assert w.keys() == ["e1"]
    assert (r.get("idem:e1") or "")[:1] == "D"
    log = p.log_text()
    assert "lease lost" not in log
    assert "dedup lock lost while waiting" not in log


def test_dedup_lock_taken_by_another_holder_while_waiting_for_lock_key(env):
    """Split layout. The entry claims its dedup lock and waits for the room
    (busy for 1.5 s; lease_ms 30000, so no extension comes before the room is
    free). Meanwhile the dedup lock passes to another holder that does not
    queue for the room. Once the room is free, nothing is delivered while that
    holder holds the key; when it is gone (without finishing the key), the
    entry is claimed afresh and delivered exactly once."""
    r = env.r
    r.set("room-lock:1", "someone-else", px=1500)
    p = env.proxy([conf(layout="split", lease_ms=30000)])
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "e1", "roomId": 1}])
    wait_for(lambda: r.exists("lock:e1"), 5, "the dedup lock taken")
    r.set("lock:e1", "seeds-consumer")               # another holder, for as long as it likes
    lost = "dedup lock lost while waiting for room-lock:1"
    wait_for(lambda: lost in p.log_text() or w.got, 10, "the room free and taken")
    assert w.got == [], "delivered while another holder held the dedup lock"
    for _ in range(50):                              # parked behind the holder for a second
        assert w.got == [], "delivered while another holder held the dedup lock"
        time.sleep(0.02)
    assert r.get("lock:e1") == "seeds-consumer"
    r.delete("lock:e1")                              # the holder is gone, the key not done
    wait_for(lambda: finished(r), 15, "the entry delivered and acked")
    assert w.keys() == ["e1"]
    assert r.exists("done:e1")
    assert r.keys("room-lock:*") == []
