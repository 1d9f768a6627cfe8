"""Log lines about an entry name it (issue 17): in JSON as the fields stream,
entry_id, key and attempt, in text before the message; a worker's RETRY
reason is logged with the entry, at most once a second under a flood."""
import json
import re
import time

from pxtest import Proxy, pb, publish, wait_for


def conf(stream, **kw):
    s = {"stream": stream, "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "retry_backoff_ms": 50}
    s.update(kw)
    return s


def json_proxy(env, streams, level="debug"):
    p = Proxy(env.tmp, f"pj{len(env.proxies) + 1}", env.redis.url, env.endpoint(), streams,
              log_level=level)
    p.config.write_text(p.config.read_text().replace(f"level: {level}",
                                                     f"level: {level}\n  format: json"))
    env.proxies.append(p)
    return p.start()


def test_json_lines_carry_stream_entry_id_key_and_attempt_as_fields(env):
    r = env.r
    p = json_proxy(env, [conf("room")])
    w = env.worker(p.endpoint, behave=lambda d: (pb.Ack.RETRY, "not yet")
                   if d.key == "r1" and d.attempt == 1 else (pb.Ack.ACK, ""))
    j1, r1, dup = publish(r, "room", [{"eventId": "j1"}, {"eventId": "r1"}, {"eventId": "j1"}])
    bad = r.xadd("room", {"payload": "{bad"})
    wait_for(lambda: sorted(w.keys()) == ["j1", "r1", "r1"] and "bad entry" in p.log_text()
             and "duplicate" in p.log_text(), 15, "every entry handled")
    lines = [json.loads(l) for l in p.log_text().splitlines() if l.strip()]
    about = [l for l in lines if "entry_id" in l]
    assert all(set(l) == {"ts", "level", "stream", "entry_id", "key", "attempt", "msg"}
               and l["stream"] == "room" for l in about), about
    assert not any("entry_id" in l for l in lines if l["msg"].startswith("app socket bound"))

    delivered = sorted((l["entry_id"], l["key"], l["attempt"]) for l in about if l["msg"] == "delivered")
    assert delivered == sorted([(j1, "j1", 1), (r1, "r1", 1), (r1, "r1", 2)]), delivered
    retry = [l for l in about if l["msg"].startswith("retry in")]
    assert [(l["entry_id"], l["key"], l["attempt"], l["level"]) for l in retry] == [(r1, "r1", 1, "info")]
    assert retry[0]["msg"].endswith(": not yet"), retry
    dups = [l for l in about if l["msg"].startswith("duplicate (")]
    assert [(l["entry_id"], l["key"]) for l in dups] == [(dup, "j1")], dups
    bads = [l for l in about if l["msg"].startswith("bad entry: ")]
    assert [(l["entry_id"], l["key"], l["level"]) for l in bads] == [(bad, None, "warn")], bads
    # the message no longer repeats what the fields say
    assert not any(l["entry_id"] in l["msg"] for l in about)


def test_text_lines_name_the_entry_before_the_message(env):
    r = env.r
    p = env.proxy([conf("room")])
    w = env.worker(p.endpoint)
    [eid] = publish(r, "room", [{"eventId": "t 1"}])
    wait_for(lambda: w.keys() == ["t 1"], 10, "delivered")
    wait_for(lambda: "delivered" in p.log_text(), 5, "the delivery logged")
    assert re.search(rf" debug stream room entry {eid} key t 1 attempt 1: delivered$", p.log_text(), re.M)


def test_retry_reasons_are_logged_with_the_entry_and_rate_limited(env):
    r = env.r
    p = env.proxy([conf("room", retry_backoff_ms=0, max_deliveries=1000000)], log_level="info")
    w = env.worker(p.endpoint, behave=lambda d: (pb.Ack.RETRY, f"db down for {d.key}"))
    [first] = publish(r, "room", [{"eventId": "first"}])
    # the first RETRY of a quiet log is logged at once, with the entry and the reason
    wait_for(lambda: re.search(rf" info  stream room entry {first} key first attempt 1: "
                               r"retry in 0 ms: db down for first$", p.log_text(), re.M),
             10, "the first RETRY's reason logged")
    start = time.monotonic()
    publish(r, "room", [{"eventId": f"k{i}"} for i in range(20)])
    time.sleep(4)
    elapsed = time.monotonic() - start
    retries = p.metrics()['idemproxy_acks_total{stream="room",group="g",status="retry"}']
    lines = [l for l in p.log_text().splitlines() if ": retry in " in l]
    assert retries >= 200, f"{retries} RETRYs: not a flood"
    # one line a second, plus the first one
    assert 2 <= len(lines) <= elapsed + 3, f"{len(lines)} lines for {retries} RETRYs"
    for l in lines:
        m = re.search(r"stream room entry (\S+) key (\S+) attempt (\d+): retry in 0 ms: db down for (\S+)", l)
        assert m and m.group(2) == m.group(4), l
    assert any(re.search(r"\(and \d+ more like it since the last\)$", l) for l in lines[1:]), lines
    assert len(w.keys()) >= retries - 2


def test_a_reader_reconnect_logs_no_busygroup(env):
    """The reader's XGROUP CREATE ... MKSTREAM answers BUSYGROUP whenever the
    group exists, so at every start and reconnect but a stream's first: an
    expected answer, neither a warning nor a Redis error."""
    r = env.r
    r.xgroup_create("room", "g", id="$", mkstream=True)
    p = env.proxy([conf("room")])
    w = env.worker(p.endpoint)
    publish(r, "room", [{"eventId": "b1"}])
    wait_for(lambda: w.keys() == ["b1"], what="delivered")
    assert p.metrics()["idemproxy_redis_errors_total"] == 0   # its start's BUSYGROUP
    r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    publish(r, "room", [{"eventId": "b2"}])
    wait_for(lambda: w.keys() == ["b1", "b2"], what="delivered after the reconnect")
    assert "reconnect" in p.log_text() or "connected" in p.log_text()
    assert "BUSYGROUP" not in p.log_text()
