"""The operator commands (issue 17): `idemproxy inspect` and `idemproxy redrive`
against a real Redis, and the smaller command-line additions (key --stream/--id/
--fields, check -c -, version, --help)."""
import json
import subprocess
import threading
import time

import pytest

from pxtest import BIN, Proxy, pb, publish, wait_for
from slowlink import SlowLink


def run(*args, stdin=None, timeout=30):
    return subprocess.run([str(BIN), *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def write_cfg(tmp_path, url, name="op.yaml", **stream):
    """A config with one stream block; 'stream' gives its options."""
    lines = [f"redis:\n  url: {url}", "metrics:\n  listen: \"\"", "streams:"]
    first = True
    for k, v in {"stream": "room", **stream}.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, str):
            v = "'" + v.replace("'", "''") + "'"
        lines.append(f"  {'- ' if first else '  '}{k}: {v}")
        first = False
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def jrun(*args):
    res = run(*args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# --- inspect --key -------------------------------------------------------------

@pytest.mark.parametrize("layout", ["single", "split"])
def test_inspect_key_done_locked_unknown(env, tmp_path, layout):
    r = env.r
    cfg = write_cfg(tmp_path, env.redis.url, layout=layout, fencing=True, group="g")
    if layout == "single":
        r.set("idem:k-done", "D", px=60000)
        r.set("idem:k-locked", "L:tok123", px=5000)
    else:
        r.set("done:k-done", "1", px=60000)
        r.set("lock:k-locked", "tok123", px=5000)
    r.set("idemproxy:fence", 7)

    res = run("inspect", "-c", str(cfg), "--stream", "room", "--key", "k-done")
    assert res.returncode == 0, res.stderr
    assert "state: done" in res.stdout
    assert "expires in" in res.stdout
    assert "fencing counter: 7" in res.stdout
    j = jrun("inspect", "-c", str(cfg), "--stream", "room", "--key", "k-done")
    assert j["key"] == "k-done" and j["layout"] == layout
    assert j["done"] is True and j["locked"] is False
    assert 0 < j["done_ttl_ms"] <= 60000
    assert j["done_name"] == ("idem:k-done" if layout == "single" else "done:k-done")
    assert j["fence"] == 7

    res = run("inspect", "-c", str(cfg), "--stream", "room", "--key", "k-locked")
    assert res.returncode == 0, res.stderr
    assert "state: locked" in res.stdout and "tok123" in res.stdout
    assert "lease left" in res.stdout
    j = jrun("inspect", "-c", str(cfg), "--stream", "room", "--key", "k-locked")
    assert j["done"] is False and j["locked"] is True
    assert j["lock_token"] == "tok123"
    assert 0 < j["lease_left_ms"] <= 5000

    res = run("inspect", "-c", str(cfg), "--stream", "room", "--key", "k-unknown")
    assert res.returncode == 0, res.stderr
    assert "state: not done, not locked" in res.stdout
    j = jrun("inspect", "-c", str(cfg), "--stream", "room", "--key", "k-unknown")
    assert j["done"] is False and j["locked"] is False
    assert j["done_ttl_ms"] is None and j["lock_token"] is None


def test_inspect_hash_tag_names_and_no_fencing(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, layout="split", hash_tag=True)
    env.r.set("done:{k1}", "1")
    j = jrun("inspect", "-c", str(cfg), "--stream", "room", "--key", "k1")
    assert j["done_name"] == "done:{k1}" and j["lock_name"] == "lock:{k1}"
    assert j["done"] is True and j["done_ttl_ms"] == -1      # no expiry
    assert "fence" not in j
    res = run("inspect", "-c", str(cfg), "--stream", "room", "--key", "k1")
    assert "never expires" in res.stdout and "fencing" not in res.stdout


def test_inspect_and_redrive_exit_codes(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, dead_letter="room:dead")
    base = ("-c", str(cfg), "--stream", "room")
    assert run("inspect", *base).returncode == 2                           # neither --key nor --entry
    assert run("inspect", *base, "--key", "a", "--entry", "1-0").returncode == 2
    res = run("inspect", "-c", str(cfg), "--stream", "nope", "--key", "a")
    assert res.returncode == 2 and "nope" in res.stderr
    assert run("inspect", "-c", str(tmp_path / "missing.yaml"), "--stream", "room",
               "--key", "a").returncode == 2
    assert run("redrive", *base, "--max", "x").returncode == 2
    assert run("redrive", *base, "--key", "a").returncode == 2              # not a redrive option
    no_dl = write_cfg(tmp_path, env.redis.url, name="nodl.yaml")
    res = run("redrive", "-c", str(no_dl), "--stream", "room")
    assert res.returncode == 2 and "dead_letter" in res.stderr
    # Redis unreachable: 1
    down = write_cfg(tmp_path, "redis://127.0.0.1:1", name="down.yaml", dead_letter="room:dead")
    res = run("inspect", "-c", str(down), "--stream", "room", "--key", "a")
    assert res.returncode == 1 and res.stdout == ""
    assert run("redrive", "-c", str(down), "--stream", "room").returncode == 1
    assert run("redrive", *base, "--entry", "x-1").returncode == 2         # not an entry id
    assert run("inspect", *base, "--key", "a", "--purge").returncode == 2   # not an inspect option
    # A cluster config is taken (test_cluster.py runs them on one): a cluster
    # that cannot be reached is 1, as one server is
    cl = tmp_path / "cl.yaml"
    cl.write_text("redis:\n  cluster: [127.0.0.1:1]\n  timeout_ms: 200\nmetrics:\n  listen: \"\"\n"
                  "streams:\n  - stream: room\n    dead_letter: room:dead\n")
    for cmd in ("inspect", "redrive"):
        extra = ("--key", "a") if cmd == "inspect" else ()
        res = run(cmd, "-c", str(cl), "--stream", "room", *extra)
        assert res.returncode == 1 and "cannot connect" in res.stderr, res.stderr


# --- inspect --entry -----------------------------------------------------------

def group_stream(**kw):
    s = {"stream": "room", "group": "game-server", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "dead_letter": "room:dead", "retry_backoff_ms": 50}
    s.update(kw)
    return s


def test_inspect_pending_entry(env):
    p = env.proxy([group_stream()], ack_timeout_ms=20000)
    w = env.worker(p.endpoint, behave=lambda d: None)          # receives, never answers
    [eid] = publish(env.r, "room", [{"eventId": "e-pend", "roomId": "r1"}])
    wait_for(lambda: len(w.got) == 1, what="delivery")
    res = run("inspect", "-c", str(p.config), "--stream", "room", "--entry", eid)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"entry: {eid}" in out
    assert "payload" in out and "e-pend" in out
    assert "pending: consumer c1" in out and "delivery count 1" in out
    assert "key: e-pend" in out
    assert "state: locked" in out
    assert "dead letters: none" in out
    j = jrun("inspect", "-c", str(p.config), "--stream", "room", "--entry", eid)
    assert j["entry"]["id"] == eid
    assert json.loads(j["entry"]["fields"]["payload"]) == {"eventId": "e-pend", "roomId": "r1"}
    assert j["pending"]["consumer"] == "c1" and j["pending"]["deliveries"] == 1
    assert j["pending"]["idle_ms"] >= 0
    assert j["key"]["key"] == "e-pend" and j["key"]["locked"] is True
    assert j["dead_letters"] == []


def test_inspect_dead_lettered_entry(env):
    p = env.proxy([group_stream()])
    env.worker(p.endpoint, behave=lambda d: (pb.Ack.DROP, "no such room"))
    [eid] = publish(env.r, "room", [{"eventId": "e-dead"}])
    wait_for(lambda: env.r.xlen("room:dead") == 1, what="dead letter")
    wait_for(lambda: env.r.xpending("room", "game-server")["pending"] == 0, what="acked")
    [(dlid, _)] = env.r.xrange("room:dead")
    res = run("inspect", "-c", str(p.config), "--stream", "room", "--entry", eid)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "pending: no (not pending in group game-server)" in out
    assert "state: done" in out
    assert f"dead letter {dlid} in room:dead: reason no such room, attempts 1" in out
    assert "dead-letter mark: written" in out
    j = jrun("inspect", "-c", str(p.config), "--stream", "room", "--entry", eid)
    assert j["pending"] is None
    assert j["key"]["done"] is True
    assert [d["id"] for d in j["dead_letters"]] == [dlid]
    assert j["dead_letters"][0]["reason"] == "no such room"
    assert j["dead_letters"][0]["attempts"] == 1      # a number, not "1" (issue 33)
    assert j["dead_letter_mark"] == dlid
    # an id that is not in the stream: said so, still 0
    res = run("inspect", "-c", str(p.config), "--stream", "room", "--entry", "1-1")
    assert res.returncode == 0, res.stderr
    assert "not in the stream" in res.stdout


# --- redrive -------------------------------------------------------------------

def snapshot(r):
    """Everything Redis holds, with TTLs present or not (not their values)."""
    out = {}
    for k in sorted(r.keys("*")):
        t = r.type(k)
        if t == "stream":
            v = r.xrange(k)
            groups = [(g["name"], g["pending"], g["last-delivered-id"]) for g in r.xinfo_groups(k)]
            v = (v, groups)
        elif t == "string":
            v = r.get(k)
        else:
            v = t
        out[k] = (t, v, r.pttl(k) > 0)
    return out


def test_redrive_after_drop_with_running_proxy(env):
    mode = {"drop": True}

    def behave(d):
        return (pb.Ack.DROP, "downstream down") if mode["drop"] else (pb.Ack.ACK, "")
    p = env.proxy([group_stream()])
    w = env.worker(p.endpoint, behave=behave)
    keys = [f"rd{i}" for i in range(5)]
    publish(env.r, "room", [{"eventId": k} for k in keys])
    wait_for(lambda: env.r.xlen("room:dead") == 5, what="five dead letters")
    wait_for(lambda: all((env.r.get(f"idem:{k}") or "")[:1] == "D" for k in keys), what="done marks")
    # and acked: the XACK rides with the next write for up to 10 ms, and redrive
    # skips an entry still pending ("run again later")
    wait_for(lambda: env.r.xpending("room", "game-server")["pending"] == 0, what="the drops acked")
    mode["drop"] = False
    res = run("redrive", "-c", str(p.config), "--stream", "room")
    assert res.returncode == 0, res.stderr
    assert "redriven 5, skipped 0" in res.stdout
    assert env.r.xlen("room:dead") == 0
    assert env.r.xlen("room") == 10
    wait_for(lambda: len(w.got) == 10, what="the five delivered again")
    assert sorted(d.key for d in w.got[5:]) == keys
    wait_for(lambda: env.r.xpending("room", "game-server")["pending"] == 0, what="acked")
    assert all((env.r.get(f"idem:{k}") or "")[:1] == "D" for k in keys)
    assert env.r.xlen("room:dead") == 0
    # nothing left: a second run redrives nothing
    res = run("redrive", "-c", str(p.config), "--stream", "room")
    assert res.returncode == 0 and "redriven 0, skipped 0" in res.stdout


def add_dead(r, n, reason="dropped", stream="room", dl="room:dead", done=True, tag=""):
    """n dead letters as idemproxy writes them (layout single: their done marks too)."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        key = f"{tag}d{i}"
        pipe.xadd(dl, {"payload": json.dumps({"eventId": key}), "n": str(i),
                       "idemproxy-reason": reason, "idemproxy-stream": stream,
                       "idemproxy-entry-id": f"1-{i}", "idemproxy-attempts": "1"})
        if done:
            pipe.set(f"idem:{key}", "D", px=600000)
    pipe.execute()


def test_redrive_dry_run_changes_nothing(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, group="g", payload_field="payload",
                    dead_letter="room:dead")
    add_dead(env.r, 3)
    env.r.xadd("room", {"payload": json.dumps({"eventId": "x"})})
    env.r.xgroup_create("room", "g", id="0")
    before = snapshot(env.r)
    res = run("redrive", "-c", str(cfg), "--stream", "room", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("would redrive ") - 1 == 3 and res.stdout.count("(entry 1-") == 3
    assert "key d0" in res.stdout
    assert "would redrive 3, skip 0" in res.stdout
    assert snapshot(env.r) == before


def test_two_redrives_at_once_redrive_each_dead_letter_once(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    n = 3000
    add_dead(env.r, n)
    cmd = [str(BIN), "redrive", "-c", str(cfg), "--stream", "room"]
    go = threading.Barrier(2)
    results = [None, None]

    def one(i):
        go.wait()
        results[i] = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for res in results:
        assert res.returncode == 0, res.stderr
    added = [f["n"] for _, f in env.r.xrange("room")]
    assert sorted(added, key=int) == [str(i) for i in range(n)]     # each exactly once
    assert env.r.xlen("room:dead") == 0
    assert env.r.keys("idem:*") == []                                # every done mark cleared
    redriven = [int(res.stdout.rsplit("redriven ", 1)[1].split(",")[0]) for res in results]
    assert sum(redriven) == n
    # the added entries are the originals, without the idemproxy-* fields
    assert set(env.r.xrange("room", count=1)[0][1]) == {"payload", "n"}
    # progress every 1000 from whichever run did them
    assert any("redrive: 1000 looked at" in res.stdout for res in results)


def test_redrive_reason_and_max(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    add_dead(env.r, 4, reason="timeout talking to db", tag="t")
    add_dead(env.r, 3, reason="invalid order", tag="v")
    add_dead(env.r, 2, reason="timeout", stream="other", tag="o", done=False)   # another stream's
    add_dead(env.r, 1, reason="busy", tag="b")          # refused: its done mark is not its own
    res = run("redrive", "-c", str(cfg), "--stream", "room", "--reason", "timeout", "--max", "3")
    assert res.returncode == 0, res.stderr
    assert "redriven 3, skipped 0" in res.stdout
    left = [f for _, f in env.r.xrange("room:dead")]
    assert sum(1 for f in left if f["idemproxy-reason"] == "timeout talking to db") == 1
    assert sum(1 for f in left if f["idemproxy-reason"] == "invalid order") == 3
    assert sum(1 for f in left if f["idemproxy-stream"] == "other") == 2
    assert [json.loads(f["payload"])["eventId"] for _, f in env.r.xrange("room")] == ["td0", "td1", "td2"]
    assert not env.r.exists("idem:td0") and env.r.exists("idem:td3")
    res = run("redrive", "-c", str(cfg), "--stream", "room", "--reason", "busy")
    assert "redriven 1, skipped 0" in res.stdout
    assert (env.r.get("idem:bd0") or "")[:1] == "D"                 # a busy refusal wrote no done mark
    res = run("redrive", "-c", str(cfg), "--stream", "room")
    assert "redriven 4, skipped 0" in res.stdout
    assert [f["idemproxy-stream"] for _, f in env.r.xrange("room:dead")] == ["other", "other"]


def test_redrive_skips_dead_letters_by_reference(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    env.r.xadd("room:dead", {"idemproxy-reason": "entry is 5000000 bytes, over max_entry_bytes 1048576",
                             "idemproxy-stream": "room", "idemproxy-entry-id": "5-0",
                             "idemproxy-attempts": "0"})
    res = run("redrive", "-c", str(cfg), "--stream", "room")
    assert res.returncode == 0, res.stderr
    assert "redriven 0, skipped 1" in res.stdout
    assert "5-0" in res.stdout and env.r.xlen("room:dead") == 1 and not env.r.exists("room")


def dead_ids(r, dl="room:dead"):
    return [f["idemproxy-entry-id"] for _, f in r.xrange(dl)]


def test_redrive_entry_picks_one_dead_letter(env, tmp_path):
    """--entry ID: the one dead letter whose id is ID, or that holds entry ID
    (as inspect --entry shows both); the others stay where they are."""
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    add_dead(env.r, 4)                                   # entries 1-0 .. 1-3, keys d0 .. d3
    base = ("redrive", "-c", str(cfg), "--stream", "room")
    res = run(*base, "--entry", "1-2")
    assert res.returncode == 0, res.stderr
    assert "redriven 1, skipped 0 (3 dead letters not selected)" in res.stdout
    assert [json.loads(f["payload"])["eventId"] for _, f in env.r.xrange("room")] == ["d2"]
    assert dead_ids(env.r) == ["1-0", "1-1", "1-3"]
    assert not env.r.exists("idem:d2") and env.r.exists("idem:d1") and env.r.exists("idem:d3")
    # by the dead letter's own id
    dlid = env.r.xrange("room:dead")[0][0]
    res = run(*base, "--entry", dlid, "--dry-run")
    assert res.returncode == 0 and "would redrive 1, skip 0" in res.stdout and dlid in res.stdout
    assert dead_ids(env.r) == ["1-0", "1-1", "1-3"]      # a dry run moves nothing
    res = run(*base, "--entry", dlid)
    assert "redriven 1, skipped 0" in res.stdout
    assert [json.loads(f["payload"])["eventId"] for _, f in env.r.xrange("room")] == ["d2", "d0"]
    assert dead_ids(env.r) == ["1-1", "1-3"]
    # none such: nothing moves, and it says so
    res = run(*base, "--entry", "1-0")
    assert res.returncode == 0 and "redriven 0, skipped 0" in res.stdout
    assert "no dead letter" in res.stderr and "1-0" in res.stderr
    assert dead_ids(env.r) == ["1-1", "1-3"] and env.r.xlen("room") == 2


def test_purge_deletes_dead_letters_without_redriving(env, tmp_path):
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    add_dead(env.r, 3, reason="invalid order", tag="v")
    add_dead(env.r, 2, reason="timeout", tag="t")
    add_dead(env.r, 2, reason="timeout", stream="other", tag="o", done=False)   # another stream's
    base = ("redrive", "-c", str(cfg), "--stream", "room", "--purge")
    before = snapshot(env.r)
    res = run(*base, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("would purge ") == 6 and "would purge 5, skip 0 (2 dead letters" in res.stdout
    assert snapshot(env.r) == before                     # listed, nothing deleted
    res = run(*base, "--reason", "timeout")
    assert res.returncode == 0, res.stderr
    assert "purged 2, skipped 0" in res.stdout
    left = [(f["idemproxy-stream"], f["idemproxy-reason"]) for _, f in env.r.xrange("room:dead")]
    assert left == [("room", "invalid order")] * 3 + [("other", "timeout")] * 2
    res = run(*base, "--entry", "1-1")                   # entry 1-1 of room: vd1
    assert "purged 1, skipped 0" in res.stdout
    res = run(*base)
    assert "purged 2, skipped 0" in res.stdout
    assert [f["idemproxy-stream"] for _, f in env.r.xrange("room:dead")] == ["other", "other"]
    # nothing went back to the stream, and the done marks stay: purged is not handled again
    assert not env.r.exists("room")
    assert all(env.r.get(f"idem:{t}d{i}") == "D" for t in "vt" for i in range(2))


# --- key, check -c -, version, --help ------------------------------------------

def test_key_stream_id_fields():
    res = run("key", "#{stream}:#{id}:#{fields.kind}:#{event.a}", "--stream", "orders",
              "--id", "1700000000000-3", "--fields", "kind=paid", "--fields", "x=y=z", stdin='{"a": 1}')
    assert res.returncode == 0, res.stderr
    assert res.stdout == "orders:1700000000000-3:paid:1\n"
    res = run("key", "#fields.x", "--fields", "x=y=z", stdin="{}")
    assert res.stdout == "y=z\n"
    assert run("key", "#fields.x", "--fields", "novalue", stdin="{}").returncode == 2
    # without them, as before: #stream and #id render as "", and #fields is missing
    assert run("key", "#fields.x", stdin="{}").returncode == 2


def test_check_reads_stdin():
    good = "streams:\n  - stream: room\n"
    res = run("check", "-c", "-", stdin=good)
    assert res.returncode == 0, res.stderr
    assert "ok, 1 stream" in res.stderr
    res = run("check", "-c", "-", stdin="streams:\n  - stream: room\n    bogus: 1\n")
    assert res.returncode == 2
    assert "<stdin>:3:5:" in res.stderr


def test_version_and_help_content():
    for args in (("version",), ("--version",)):
        res = run(*args)
        assert res.returncode == 0
        assert res.stdout.startswith("idemproxy 0.")
    import re
    head = subprocess.run(["git", "-C", str(BIN.parent.parent), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if head:
        assert re.search(r"commit [0-9a-f]{12}", run("version").stdout)
    res = run("--help")
    assert res.returncode == 0
    for word in ("IDEMPROXY_REDIS_URL", "IDEMPROXY_ENDPOINT", "IDEMPROXY_LOG_LEVEL", "inspect",
                 "redrive", "exit codes", "${VAR}", "--purge", "redrive -c FILE --stream S [--entry ID]",
                 "redis.cluster"):
        assert word in res.stdout, word
    assert "refused" not in res.stdout                  # no command refuses a cluster config now
    assert run("version", "extra").returncode == 2


def test_redrive_entry_takes_one_of_two_dead_letters_of_an_entry(env, tmp_path):
    """Two dead letters can hold one entry (two groups sharing a dead-letter
    stream, or a written-mark that expired before the entry came round
    again). --entry ID takes one, as it says; redriving both added the entry
    twice. The other is named, to be taken by its own id."""
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    add_dead(env.r, 1)
    add_dead(env.r, 1, reason="timeout")                 # entry 1-0 again
    first, second = [i for i, _ in env.r.xrange("room:dead")]
    for purge in ((), ("--purge",)):
        res = run("redrive", "-c", str(cfg), "--stream", "room", "--entry", "1-0", *purge)
        assert res.returncode == 0, res.stderr
        assert ("purged 1, skipped 0" if purge else "redriven 1, skipped 0") in res.stdout, res.stdout
        assert second in res.stderr and "own id" in res.stderr, res.stderr
        assert [i for i, _ in env.r.xrange("room:dead")] == [second]
        assert env.r.xlen("room") == 1
        env.r.xadd("room:dead", {"payload": json.dumps({"eventId": "d0"}), "n": "0",
                                 "idemproxy-reason": "x", "idemproxy-stream": "room",
                                 "idemproxy-entry-id": "1-0", "idemproxy-attempts": "1"})
        first, second = second, env.r.xrange("room:dead")[-1][0]


def test_redrive_leaves_a_dead_letter_whose_commit_is_still_written(env, tmp_path):
    """The daemon XACKs a dead-lettered entry once its dead letter and done
    mark are both confirmed; a lost reply makes it write them again (the
    dead letter once, by its written-mark; the done mark anew). A redrive in
    between cleared the done mark and added the entry back, and the done mark
    written again then made the redriven entry a copy: skipped and acked,
    never handled, its dead letter gone, "redriven 1" reported. Redrive
    leaves a dead letter whose entry is still pending in the group."""
    link = SlowLink(env.redis.port, 0)
    try:
        ep = env.endpoint()
        # max_inflight 1: the redriven entry is read only after the commit is written
        p = Proxy(tmp_path, "px", link.url, ep, [group_stream()], timeout_ms=1000, max_inflight=1)
        env.proxies.append(p)
        p.start()
        mode = {"drop": True}

        def behave(d):
            return (pb.Ack.DROP, "downstream down") if mode["drop"] else (pb.Ack.ACK, "")
        w = env.worker(ep, behave=behave)
        wait_for(lambda: p.get("/readyz")[0] == 200, 10, "ready")

        def applied():   # both written, their replies lost; the retried done mark held off
            if env.r.xlen("room:dead") == 1 and (env.r.get("idem:a") or "")[:1] == "D":
                link.refuse([b"$6\r\nidem:a\r\n$15\r\nD:"], 6.0)
                return True
            return False
        link.cut_reply_to(b"idemproxy-reason", applied)
        publish(env.r, "room", [{"eventId": "a"}])
        wait_for(lambda: link.cuts == 1, 10, "the commit's replies lost")
        mode["drop"] = False
        cfg = write_cfg(tmp_path, env.redis.url, **group_stream())
        res = run("redrive", "-c", str(cfg), "--stream", "room")
        assert res.returncode == 0, res.stderr
        assert link.refusing >= 1 or env.r.xpending("room", "game-server")["pending"] == 1
        wait_for(lambda: env.r.xpending("room", "game-server")["pending"] == 0, 20, "committed")
        assert "redriven 0, skipped 1" in res.stdout and "pending" in res.stdout, res.stdout
        res = run("redrive", "-c", str(cfg), "--stream", "room")   # now it may go
        assert "redriven 1, skipped 0" in res.stdout, res.stdout + res.stderr
        assert res.returncode == 0, res.stderr
        wait_for(lambda: [d.key for d in w.got].count("a") == 2, 20, "the dead letter handled again")
        assert env.r.xlen("room:dead") == 0
    finally:
        link.close()


def test_redrive_entry_finds_a_dead_letter_older_than_its_entry_id(env, tmp_path):
    """A dead letter's id comes from the dead-letter stream's clock: on a
    cluster another master's, which may lag the stream's, and an entry a
    producer added with an id of its own may be ahead of any clock. --entry
    searched only from the entry id's time and said no dead letter held it."""
    cfg = write_cfg(tmp_path, env.redis.url, payload_field="payload", dead_letter="room:dead")
    ahead = f"{int(time.time() * 1000) + 3_600_000}-0"     # an hour ahead of the dead letter
    env.r.xadd("room:dead", {"payload": json.dumps({"eventId": "d0"}), "idemproxy-reason": "dropped",
                             "idemproxy-stream": "room", "idemproxy-entry-id": ahead,
                             "idemproxy-attempts": "1"})
    res = run("redrive", "-c", str(cfg), "--stream", "room", "--entry", ahead)
    assert res.returncode == 0, res.stderr
    assert "redriven 1, skipped 0" in res.stdout, res.stdout + res.stderr
    assert env.r.xlen("room") == 1 and env.r.xlen("room:dead") == 0
