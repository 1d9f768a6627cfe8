"""Payload fingerprints and the done mark's time (issue 31,
docs/configuration.md and docs/guarantee.md):
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
    # a mark with no time gives no age
    assert p.metrics()['idemproxy_duplicate_age_seconds_count{stream="room",group="g"}'] == 0


def dead_letters(r, stream="dlq"):
    return [f for _, f in r.xrange(stream)]


def metric(p, family, stream="room", group="g"):
    return p.metrics().get(f'{family}{{stream="{stream}",group="{group}"}}')


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conflicting_copy_is_dead_lettered_a_true_copy_is_a_duplicate(env, layout):
    r = env.r
    first = {"eventId": "e1", "amount": 5, "who": {"a": 1, "b": 2}}
    other = {"eventId": "e1", "amount": 999, "who": {"a": 1, "b": 2}}
    p = env.proxy([conf(layout, fingerprint="#event", dead_letter="dlq")])
    w = env.worker(p.endpoint)
    wait_for(lambda: metric(p, "idemproxy_conflicts_total") is not None, what="metrics")
    assert metric(p, "idemproxy_conflicts_total") == 0          # exported from the start
    publish(r, "room", [first])
    wait_for(lambda: settled(p, "room", 1), what="the first outcome")
    mark = r.get(done_key(layout, "e1"))
    # the same event with its members in another order, then another payload
    r.xadd("room", {"payload": '{"who": {"b": 2, "a": 1}, "amount": 5, "eventId": "e1"}'})
    publish(r, "room", [other])
    wait_for(lambda: settled(p, "room", 3), what="every outcome")
    assert w.keys() == ["e1"]                                   # never delivered again
    o = outcomes(p, "room")
    assert (o["acked"], o["duplicate"], o["dead_lettered"]) == (1, 1, 1)
    assert metric(p, "idemproxy_conflicts_total") == 1
    dl = dead_letters(r)
    assert len(dl) == 1
    assert dl[0]["idemproxy-reason"] == (f"conflict: fingerprint {fp_of(other)} differs from "
                                         f"the done mark's {fp_of(first)}")
    # idemproxy's four fields last, in order (ops.c reads them by position)
    assert list(dl[0])[-4:] == ["idemproxy-reason", "idemproxy-stream", "idemproxy-entry-id",
                                "idemproxy-attempts"]
    assert json.loads(dl[0]["payload"]) == other
    assert r.get(done_key(layout, "e1")) == mark                # no second done mark
    wait_for(lambda: r.xpending("room", "g")["pending"] == 0, what="all acked")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conflicting_copy_with_skip_is_counted_only(env, layout):
    r = env.r
    publish(r, "room", [{"eventId": "e1", "amount": 5}])
    p = env.proxy([conf(layout, fingerprint="#{event.amount}", on_conflict="skip",
                        dead_letter="dlq")])
    w = env.worker(p.endpoint)
    wait_for(lambda: settled(p, "room", 1), what="the first outcome")
    publish(r, "room", [{"eventId": "e1", "amount": 999}, {"eventId": "e1", "amount": 5}])
    wait_for(lambda: settled(p, "room", 3), what="every outcome")
    assert w.keys() == ["e1"]
    o = outcomes(p, "room")
    assert (o["acked"], o["duplicate"], o["dead_lettered"]) == (1, 2, 0)
    assert metric(p, "idemproxy_conflicts_total") == 1
    assert not r.exists("dlq")
    assert "conflict: fingerprint" in p.log_text() and "on_conflict: skip" in p.log_text()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_of_a_key_in_progress_is_judged_by_the_holders_done_mark(env, layout):
    """A copy with another payload that finds its key held waits, as a busy
    copy does, and is a conflict once the holder's mark is there: not guessed
    while the first is with the worker."""
    from pxtest import pb
    r = env.r
    p = env.proxy([conf(layout, fingerprint="#event", dead_letter="dlq")])
    w = env.worker(p.endpoint, manual=True)
    publish(r, "room", [{"eventId": "e1", "amount": 5}])
    wait_for(lambda: len(w.inbox) == 1, what="the first with the worker")
    publish(r, "room", [{"eventId": "e1", "amount": 999}])
    wait_for(lambda: metric(p, "idemproxy_lock_busy_total") >= 1, what="the copy found it busy")
    assert not r.exists("dlq") and metric(p, "idemproxy_conflicts_total") == 0
    w.answer(pb.Ack.ACK)
    wait_for(lambda: settled(p, "room", 2), 15, "both outcomes")
    assert w.keys() == ["e1"]
    assert metric(p, "idemproxy_conflicts_total") == 1
    assert dead_letters(r)[0]["idemproxy-reason"].startswith("conflict: fingerprint ")


def age(p, suffix, le=None, stream="room"):
    lbl = f'stream="{stream}",group="g"' + (f',le="{le}"' if le else "")
    return p.metrics().get(f"idemproxy_duplicate_age_seconds_{suffix}{{{lbl}}}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_duplicate_age_of_a_copy_two_seconds_after_its_original(env, layout):
    """idemproxy_duplicate_age_seconds: the age of the done mark a copy met,
    read from the mark itself. A copy published 2 s after its original was
    done lands above 1 s and within 5 s (3 s of margin for a loaded machine)."""
    r = env.r
    p = env.proxy([conf(layout)])
    env.worker(p.endpoint)
    wait_for(lambda: age(p, "count") is not None, what="metrics")
    assert age(p, "count") == 0                                  # exported from the start
    publish(r, "room", [{"eventId": "e1"}])
    wait_for(lambda: settled(p, "room", 1), what="the original done")
    assert r.get(done_key(layout, "e1"))[:2] in ("D:", "1:")
    time.sleep(2.0)   # the copy's age: at least this, whatever the load
    publish(r, "room", [{"eventId": "e1"}])
    wait_for(lambda: settled(p, "room", 2), what="the copy's outcome")
    assert age(p, "count") == 1
    assert age(p, "bucket", "1") == 0
    assert age(p, "bucket", "5") == 1
    assert 2.0 <= age(p, "sum") <= 5.0
    assert age(p, "bucket", "600") == 1 and age(p, "bucket", "3600") == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inspect_shows_the_done_marks_time_and_fingerprint(env, tmp_path, layout):
    from test_operator import run, write_cfg
    r = env.r
    ev = {"eventId": "e1", "amount": 5}
    publish(r, "room", [ev])
    p = env.proxy([conf(layout, fingerprint="#event")])
    env.worker(p.endpoint)
    wait_for(lambda: settled(p, "room", 1), what="the entry's outcome")
    ms = int(r.get(done_key(layout, "e1")).split(":")[1])
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", layout=layout,
                    fingerprint="#event")
    res = run("inspect", "-c", str(cfg), "--stream", "room", "--key", "e1", "--json")
    assert res.returncode == 0, res.stderr
    j = json.loads(res.stdout)
    assert j["done"] is True and j["done_at_ms"] == ms and j["fingerprint"] == fp_of(ev)
    text = run("inspect", "-c", str(cfg), "--stream", "room", "--key", "e1").stdout
    assert f"marked at {ms} (" in text and f"fingerprint {fp_of(ev)}" in text
    # a mark another writer left: done, no time, no fingerprint
    r.set(done_key(layout, "e2"), "1" if layout == "split" else "D")
    j = json.loads(run("inspect", "-c", str(cfg), "--stream", "room", "--key", "e2", "--json").stdout)
    assert j["done"] is True and j["done_at_ms"] is None and j["fingerprint"] is None
