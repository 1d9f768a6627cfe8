"""`idemproxy keys` (issue 31, docs/operations.md): a read-only dry run of a stream's
templates over its last N entries. Entries are written with explicit ids, so
their times (and so how far apart copies arrived) are known exactly, and every
number the command reports is checked, in text and in --json, with its exit
codes."""
import json
import time

from pxtest import BIN, wait_for  # noqa: F401  (BIN: the binary under test)
from test_operator import run, write_cfg

T0 = 1_700_000_000_000  # ms of the first entry
TTL = 600_000


def xadd(r, ms, seq, payload):
    r.xadd("room", {"payload": payload if isinstance(payload, str) else json.dumps(payload)},
           id=f"{ms}-{seq}")


def fill(r):
    """12 distinct keys over 20 good entries, 3 render errors of 2 reasons,
    2 keys with conflicting copies, 1 key whose copies are 11 min apart."""
    t = T0
    for i in range(10):                       # k0..k9 once each: 10 entries
        xadd(r, t, 0, {"eventId": f"k{i}", "amount": i}); t += 1000
    xadd(r, t, 0, {"eventId": "k0", "amount": 0}); t += 1000           # a true copy
    xadd(r, t, 0, {"amount": 1, "eventId": "k1"}); t += 1000           # true copy, other order
    xadd(r, t, 0, {"eventId": "k2", "amount": 999}); t += 1000         # conflict
    xadd(r, t, 0, {"eventId": "k2", "amount": 2}); t += 1000           # true copy of k2
    xadd(r, t, 0, {"eventId": "k3", "amount": 3, "note": "x"}); t += 1000  # conflict (whole event)
    xadd(r, t, 0, {"eventId": "k4", "amount": 4}); t += 1000
    xadd(r, t, 0, {"eventId": "k4", "amount": 4}); t += 1000           # k4: 3 copies
    xadd(r, t, 0, {"noId": 1}); t += 1000                              # missing key
    xadd(r, t, 0, "not json"); t += 1000                                # not JSON
    xadd(r, t, 0, {"noId": 2}); t += 1000                              # missing key again
    t += 660_000                                                        # 11 min later
    xadd(r, t, 0, {"eventId": "k5", "amount": 5})                      # k5 beyond done_ttl_ms
    xadd(r, t, 1, {"eventId": "n1", "amount": 6})                     # two new keys
    xadd(r, t, 2, {"eventId": "n2", "amount": 7})
    return 10 + 7 + 3 + 3, t - (T0 + 5000)


def test_keys_reports_each_number(env, tmp_path):
    r = env.r
    n, apart = fill(r)
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", key="#event.eventId",
                    group="g", lock_key="lk:#{event.amount}", done_ttl_ms=TTL)
    before = {k: r.type(k) for k in r.keys("*")}
    res = run("keys", "-c", str(cfg), "--stream", "room", "--json")
    assert res.returncode == 3, res.stderr
    j = json.loads(res.stdout)
    assert j["entries"] == n == 23
    assert j["distinct_keys"] == 12
    assert j["render_errors"] == 3
    reasons = {x["reason"]: (x["count"], x["example_entry"]) for x in j["render_error_reasons"]}
    assert len(reasons) == 2
    assert sum(c for c, _ in reasons.values()) == 3
    missing = [k for k in reasons if "eventId" in k]
    assert len(missing) == 1 and reasons[missing[0]][0] == 2
    assert reasons[missing[0]][1] == f"{T0 + 19000}-0"      # an example: one of the two
    assert [k for k in reasons if k.startswith("payload is not JSON")]
    assert j["fingerprint"] is None                          # by the whole event
    assert j["conflicts"] == 2
    assert sorted(x["key"] for x in j["conflict_keys"]) == ["k2", "k3"]
    assert j["done_ttl_ms"] == TTL and j["beyond_ttl"] == 1
    assert [(x["key"], x["apart_ms"]) for x in j["beyond_ttl_keys"]] == [("k5", apart)]
    top = [(x["key"], x["copies"]) for x in j["top_keys"]]
    assert sorted(top[:2]) == [("k2", 3), ("k4", 3)]           # worst first
    assert dict(top) == {"k4": 3, "k2": 3, "k0": 2, "k1": 2, "k3": 2, "k5": 2}
    assert j["lock_keys"] == 11                              # amounts 0-9 and 999
    # read only: no group, no key written
    assert {k: r.type(k) for k in r.keys("*")} == before
    assert r.xinfo_groups("room") == []

    text = run("keys", "-c", str(cfg), "--stream", "room")
    assert text.returncode == 3
    out = text.stdout
    assert "23 entries read" in out and "12 distinct keys" in out
    assert "3 entries whose key cannot be rendered" in out
    assert "2 keys whose copies carry different payloads (by the whole event)" in out
    assert "1 keys whose copies arrived further apart than done_ttl_ms (600000 ms)" in out
    assert out.index("cannot be rendered") < out.index("different payloads") < out.index("further apart")
    assert "lock_key: 11 distinct values" in out


def test_keys_fingerprint_count_and_exit_codes(env, tmp_path):
    r = env.r
    fill(r)[0]
    # with the configured fingerprint (amount only), k3's extra member is no conflict
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", key="#event.eventId",
                    fingerprint="#{event.amount}", done_ttl_ms=TTL)
    j = json.loads(run("keys", "-c", str(cfg), "--stream", "room", "--json").stdout)
    assert j["fingerprint"] == "#{event.amount}"
    assert j["conflicts"] == 1 and [x["key"] for x in j["conflict_keys"]] == ["k2"]
    # --count: the last 3 entries only (k5, k6, k7): nothing found, exit 0
    res = run("keys", "-c", str(cfg), "--stream", "room", "--count", "3", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    j = json.loads(res.stdout)
    assert (j["entries"], j["distinct_keys"], j["render_errors"], j["conflicts"], j["beyond_ttl"]) == \
        (3, 3, 0, 0, 0)
    assert j["top_keys"] == []
    assert "no findings" in run("keys", "-c", str(cfg), "--stream", "room", "--count", "3").stdout
    # usage: 2
    assert run("keys", "-c", str(cfg), "--stream", "room", "--count", "0").returncode == 2
    assert run("keys", "-c", str(cfg), "--stream", "nope").returncode == 2
    assert run("keys", "-c", str(cfg)).returncode == 2
    # Redis unreachable: 1
    down = write_cfg(tmp_path, "redis://127.0.0.1:1", name="down.yaml", payload_field="payload")
    res = run("keys", "-c", str(down), "--stream", "room")
    assert res.returncode == 1, res.stderr


def test_keys_reads_100k_entries_in_seconds(env, tmp_path):
    r = env.r
    pipe = r.pipeline(transaction=False)
    for i in range(100_000):
        pipe.xadd("big", {"payload": json.dumps({"eventId": f"e{i % 50_000}", "n": i % 50_000,
                                                 "room": "r1"})})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    cfg = write_cfg(tmp_path, env.redis.url, stream="big", payload_field="payload")
    t = time.monotonic()
    res = run("keys", "-c", str(cfg), "--stream", "big", "--count", "100000", "--json", timeout=60)
    took = time.monotonic() - t
    assert res.returncode == 0, res.stdout + res.stderr
    j = json.loads(res.stdout)
    assert (j["entries"], j["distinct_keys"], j["conflicts"]) == (100_000, 50_000, 0)
    assert took < 10, f"{took:.1f} s"
