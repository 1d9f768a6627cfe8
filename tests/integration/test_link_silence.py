"""timeout_ms bounds a command's silence, not its transfer (docs/guarantee.md; issue 30,
finding 4). A reply whose bytes are still arriving is not timed out, so one huge
entry on a slow link is read (and dead-lettered: it is over max_entry_bytes)
instead of stopping the stream; a reply that stops arriving mid-way still
times out after timeout_ms of silence. Real redis-server, real idemproxy; the
link to Redis is a throttling forwarder (slowlink.py)."""
import re

import pytest
import redis

from pxtest import Proxy, pending, publish, wait_for
from slowlink import SlowLink

BIG = 6_000_000        # bytes of padding: over max_entry_bytes (1 MiB by default)
RATE = 1_500_000       # bytes a second from Redis: the big reply takes 4 s


def conf(group):
    s = {"stream": "room", "payload_field": "payload", "key": "#event.eventId",
         "dead_letter": "dlq"}
    if group:
        s.update(group="g", consumer="c1")
    return s


def setup(env, group, stall=None):
    """A big entry, then three small ones; a proxy reading them through a
    forwarder carrying RATE bytes a second (a connection's replies stop after
    'stall' bytes); its worker."""
    raw = redis.Redis(port=env.redis.port)
    big = raw.xadd("room", {"payload": b'{"eventId": "huge", "pad": "' + b"x" * BIG + b'"}'}).decode()
    publish(env.r, "room", [{"eventId": f"small-{i}"} for i in range(3)])
    slow = SlowLink(env.redis.port, 0, rate=RATE)
    if stall:
        slow.stall_replies_after(stall)
    p = Proxy(env.tmp, f"proxy{len(env.proxies) + 1}", slow.url, env.endpoint(), [conf(group)],
              timeout_ms=1000)
    env.proxies.append(p)
    p.start()
    return big, slow, p, env.worker(p.endpoint)


def outcome(env, group, big, w):
    """The small entries delivered, the big one dead-lettered once, by reference."""
    r = env.r
    wait_for(lambda: sorted(w.keys()) == ["small-0", "small-1", "small-2"], 30,
             "the small entries delivered")
    wait_for(lambda: r.xlen("dlq") == 1, 10, "the big entry dead-lettered")
    (_, d), = r.xrange("dlq")
    assert d["idemproxy-entry-id"] == big and "max_entry_bytes" in d["idemproxy-reason"], d
    assert "huge" not in w.keys()
    if group:
        wait_for(lambda: pending(r, "room", "g") == 0, 10, "everything acked")


@pytest.mark.parametrize("group", [True, False], ids=["group", "groupless"])
def test_a_huge_entry_on_a_slow_link_is_read_not_timed_out(env, group):
    """Before: the read's deadline (BLOCK 2000 + timeout_ms) passed while the
    4 s reply was still arriving; the link was dropped, the read asked again
    from the same place, for ever: nothing delivered. Now every byte that
    arrives restarts the silence allowed."""
    big, slow, p, w = setup(env, group)
    try:
        outcome(env, group, big, w)
        assert "command timed out" not in p.log_text()
    finally:
        slow.close()


@pytest.mark.parametrize("group", [True, False], ids=["group", "groupless"])
def test_a_reply_that_stops_mid_way_still_times_out(env, group):
    """The big reply stops after 1 MB and its connection stays open: after
    timeout_ms of silence (not before) the link is dropped, and the read asked
    again on a new connection brings the stream through."""
    big, slow, p, w = setup(env, group, stall=1_000_000)
    try:
        wait_for(lambda: slow.stall_closed_at is not None, 15, "the stalled link dropped")
        silent = slow.stall_closed_at - slow.stalled_at
        assert 0.9 <= silent < 10, silent
        # the line may be written just after the close the forwarder saw
        wait_for(lambda: re.search(r"link lost: command timed out", p.log_text()), 5, "the timeout logged")
        outcome(env, group, big, w)
    finally:
        slow.close()
