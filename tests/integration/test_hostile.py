"""Hostile producers and servers (issue 37): what a producer writes into an
entry, or a Redis server sends back, must not crash the daemon, blow up its
memory, or be taken for idemproxy's own records."""
import re

import redis

from pxtest import pending, wait_for


def test_deep_dotted_field_name_is_bad_input_and_loses_nothing_else(env):
    """Fields mode: a field name of 250,000 dotted parts (500 KB, under
    max_entry_bytes) once nested 250,000 json-c objects, whose recursive free
    overflowed the stack: SIGSEGV, the entry left pending, and every replica
    that reclaimed it crashed too. Now it is bad input like any other."""
    r = env.r
    p = env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "key": "#event.eventId",
                    "dead_letter": "dlq"}], max_entry_bytes=1048576)
    w = env.worker(p.endpoint)
    r.xadd("room", {"eventId": "before"})
    deep = ".".join(["a"] * 250000)
    bad_id = r.xadd("room", {"eventId": "deep", deep: "v"})
    r.xadd("room", {"eventId": "after"})
    wait_for(lambda: r.xlen("dlq") == 1, timeout=20, what="the dead letter")
    raw = redis.Redis(port=env.redis.port)
    dl = {k.decode(): v.decode() for k, v in raw.xrange("dlq")[0][1].items()}
    assert "field name 1 nests deeper than 31 objects" in dl["idemproxy-reason"], dl["idemproxy-reason"]
    assert dl["idemproxy-entry-id"] == bad_id
    assert dl[deep] == "v" and dl["eventId"] == "deep"        # the entry, whole
    wait_for(lambda: sorted(w.keys()) == ["after", "before"], what="the good entries")
    wait_for(lambda: pending(r, "room", "g") == 0, what="nothing pending")
    assert re.search(rf"stream room entry {bad_id} key \S+ attempt \d+: bad entry: field name 1 nests",
                     p.log_text())
    assert p.proc.poll() is None            # still running
