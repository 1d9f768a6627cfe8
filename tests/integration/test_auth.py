"""Connecting to a Redis with (or without) a password and ACL users: AUTH only
with a password, redis.username, the minimal ACL of docs/redis.md, and what a
refusal (WRONGPASS, NOPERM) does: one line, not ready, retrying with backoff,
nothing lost once the permission is there."""
import re
import subprocess
import time

import pytest

from pxtest import BIN, ROOT, Proxy, pb, outcomes, pending, publish, settled, wait_for

PASSWORD = "s3cret-app"


def doc_acl():
    """The minimal ACL of docs/redis.md ("The minimal ACL"): its command rules."""
    text = (ROOT / "docs" / "redis.md").read_text()
    block = re.search(r"\*\*The minimal ACL\.\*\*.*?```text\n(ACL SETUSER .*?)```", text, re.S)
    assert block, "docs/redis.md: the minimal ACL block"
    return [w for w in block.group(1).split() if w[0] in "+-" and w != "-@all"]


# The minimal ACL's keys for the streams and names of SCENARIO below, and the
# commands of docs/redis.md.
MINIMAL_KEYS = "~room ~room:dlq ~lock:* ~done:* ~seat:* ~idemproxy:*"
MINIMAL_COMMANDS = " ".join(doc_acl())

# claim_idle_ms: at least 3 x redis.timeout_ms (1000 here; docs/configuration.md)
SCENARIO = {"stream": "room", "group": "game-server", "consumer": "c1",
            "payload_field": "payload", "key": "#event.eventId", "layout": "split",
            "lock_key": "seat:#{event.seatId}", "wait_ms": 2000, "dead_letter": "room:dlq",
            "fencing": True, "retry_backoff_ms": 20, "claim_idle_ms": 3000}


def setuser(r, name, *rules):
    r.execute_command("ACL", "SETUSER", name, "reset", "on", f">{PASSWORD}", *rules)


def minimal_rules(drop=()):
    """The minimal ACL's rules, without the commands in 'drop'."""
    cmds = [c for c in MINIMAL_COMMANDS.split() if c[1:] not in drop]
    return ["resetchannels", *MINIMAL_KEYS.split(), "-@all", *cmds]


def proxy(env, password_file=None, username=None, streams=(SCENARIO,), **kw):
    redis = {}
    if password_file is not None:
        redis["password_file"] = password_file
    if username is not None:
        redis["username"] = username
    p = Proxy(env.tmp, f"proxy{len(env.proxies) + 1}", env.redis.url, env.endpoint(),
              list(streams), redis=redis, **kw)
    env.proxies.append(p)
    return p.start()


def ready(p):
    return p.get("/readyz")[0] == 200


def lines(p, pattern):
    """The log lines above debug that match (the proxies log at debug)."""
    return [ln for ln in p.log_text().splitlines() if re.search(pattern, ln) and " debug " not in ln]


def orphans(r):
    """Before the proxy starts: two entries a dead consumer read and never
    acked, for XAUTOCLAIM to take over."""
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    publish(r, "room", [{"eventId": "orphan1", "seatId": "9"}, {"eventId": "orphan2", "seatId": "9"}])
    r.xreadgroup("game-server", "dead-pod", {"room": ">"})


def run_scenario(env, p, wait_ready=True):
    """After orphans(): copies skipped, a DROP dead-lettered, a RETRY
    redelivered, the orphans taken over, every entry under its seat lock with
    a fencing token. Asserts the outcomes in Redis."""
    r = env.r
    tries, tokens = {}, []

    def behave(d):
        tries[d.key] = tries.get(d.key, 0) + 1
        tokens.append(d.fencing_token)
        if d.key == "bad":
            return (pb.Ack.DROP, "cannot handle")
        if d.key == "again" and tries[d.key] == 1:
            return (pb.Ack.RETRY, "later")
        return (pb.Ack.ACK, "")

    w = env.worker(p.endpoint, behave=behave)
    if wait_ready:
        wait_for(lambda: ready(p), what="ready")
    events = []
    for i in range(5):
        events += [{"eventId": f"e{i}", "seatId": str(i % 2)}] * 2       # each published twice
    events += [{"eventId": "bad", "seatId": "1"}, {"eventId": "again", "seatId": "0"}]
    publish(r, "room", events)
    total = len(events) + 2
    wait_for(lambda: settled(p, "room", total), timeout=30, what="every entry's outcome")
    assert sorted(set(w.keys())) == sorted(["orphan1", "orphan2", "bad", "again"] +
                                          [f"e{i}" for i in range(5)])
    assert outcomes(p, "room")["duplicate"] == 5
    assert tries["again"] == 2
    assert len(tokens) == total - 5 + 1 and all(t > 0 for t in tokens)
    assert len(set(tokens)) == len(tokens)
    dl = r.xrange("room:dlq")
    assert len(dl) == 1 and dl[0][1]["idemproxy-reason"] == "cannot handle"
    for k in ["orphan1", "orphan2", "bad", "again"] + [f"e{i}" for i in range(5)]:
        assert r.exists(f"done:{k}"), k
        assert not r.exists(f"lock:{k}"), k
    assert not r.exists("seat:0") and not r.exists("seat:1")       # lock_key released
    assert int(r.get("idemproxy:fence")) >= 11                        # one token per claim
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="all acked")
    return w


def blpop_calls(r):
    return r.info("commandstats").get("cmdstat_blpop", {}).get("calls", 0)


def trickle(r, n=12):
    """Entries about 1 ms apart: the window (linger_ms) opens after their
    pages, its BLPOP as the user; all done."""
    for i in range(n):
        publish(r, "room", [{"eventId": f"t{i}", "seatId": "5"}])
        time.sleep(0.0005)
    wait_for(lambda: all(r.exists(f"done:t{i}") for i in range(n)), what="the trickle done")


def test_a_user_without_blpop_keeps_the_batch_window_in_the_daemon(env, tmp_path):
    """The minimal ACL without +blpop: the batch window's BLPOP is refused once
    per connection (one ACL LOG line, its count 1), the window then waits in
    the daemon, one warning says so (once in the process's life), and
    everything is delivered."""
    r = env.r
    r.execute_command("ACL", "LOG", "RESET")
    setuser(r, "app", *minimal_rules(drop=("blpop",)))
    pw = tmp_path / "password"
    pw.write_text(PASSWORD + "\n")
    p = proxy(env, password_file=pw, username="app",
              streams=[dict(SCENARIO, lock_key="", fencing=False, linger_ms=5)])
    w = env.worker(p.endpoint)
    wait_for(lambda: ready(p), what="ready")
    trickle(r)
    trickle(r)
    assert sorted(set(w.keys())) == sorted(f"t{i}" for i in range(12))
    log = [(e["object"], int(e["count"])) for e in r.execute_command("ACL", "LOG")]
    assert log == [("blpop", 1)], log
    warned = lines(p, r"the batch window waits in this process")
    assert len(warned) == 1 and "NOPERM" in warned[0], warned


def test_no_password_and_an_empty_password_file_send_no_auth(env, tmp_path):
    """A Redis without a password and a password file that is empty (or only a
    line end): no AUTH (before: AUTH "" was refused, never ready)."""
    pw = tmp_path / "password"
    pw.write_text("\n")
    p = proxy(env, password_file=pw, streams=[dict(SCENARIO, lock_key="", fencing=False)])
    w = env.worker(p.endpoint)
    wait_for(lambda: ready(p), what="ready")
    publish(env.r, "room", [{"eventId": "a"}, {"eventId": "b"}, {"eventId": "a"}])
    wait_for(lambda: settled(p, "room", 3), what="every entry's outcome")
    assert sorted(w.keys()) == ["a", "b"]
    assert env.r.exists("done:a") and env.r.exists("done:b")
    assert not lines(p, r"AUTH|WRONGPASS|NOAUTH|handshake refused")


def test_minimal_acl_runs_a_full_scenario(env, tmp_path):
    """The minimal ACL of docs/redis.md: everything idemproxy does with group mode,
    split layout, lock_key, dead_letter, fencing and reclaims, and nothing in
    ACL LOG (no command or key was refused)."""
    r = env.r
    r.execute_command("ACL", "LOG", "RESET")
    setuser(r, "app", *minimal_rules())
    pw = tmp_path / "password"
    pw.write_text(PASSWORD + "\n")
    orphans(r)
    # linger_ms: a window after every short page, so the trickle below opens some
    p = proxy(env, password_file=pw, username="app", streams=[dict(SCENARIO, linger_ms=5)])
    run_scenario(env, p)
    blpops = blpop_calls(r)
    trickle(r)                               # close together: the batch window opens
    assert blpop_calls(r) > blpops, "the window waited in Redis"
    assert r.execute_command("ACL", "LOG") == []
    assert not lines(p, r"NOPERM|AUTH refused|lacks permission")
    clients = [c for c in r.client_list() if c["user"] == "app"]
    assert len(clients) >= 2, clients        # the command link and the reader's, both as app


def test_missing_permission_is_one_line_not_ready_then_recovers(env, tmp_path):
    """A user without +xautoclaim: not ready, one NOPERM line naming the
    command (rate-limited, not one per reconnect), no spin; once ACL SETUSER
    grants it, the daemon recovers and every entry is handled."""
    r = env.r
    setuser(r, "app", *minimal_rules(drop={"xautoclaim"}))
    pw = tmp_path / "password"
    pw.write_text(PASSWORD)
    orphans(r)
    p = proxy(env, password_file=pw, username="app")
    w_started = time.time()
    wait_for(lambda: lines(p, "NOPERM"), timeout=15, what="the NOPERM line")
    noperm = lines(p, "NOPERM")
    assert re.search(r'redis: user "app" lacks permission: NOPERM .*\'xautoclaim\'', noperm[0]), noperm
    time.sleep(6)
    assert not ready(p)
    assert p.get("/readyz")[0] == 503
    noperm = lines(p, "NOPERM")
    assert 1 <= len(noperm) <= 2, noperm           # one line per 10 s at most
    # no spin: a few reconnects with a growing backoff, not hundreds
    connects = r.info("stats")["total_connections_received"]
    time.sleep(3)
    assert r.info("stats")["total_connections_received"] - connects <= 6
    assert len(lines(p, r"link lost|connected|redis: (ready|not ready)")) <= 3, p.log_text()[-3000:]   # before the first
    r.execute_command("ACL", "SETUSER", "app", "+xautoclaim")
    run_scenario(env, p, wait_ready=False)
    wait_for(lambda: ready(p), timeout=15, what="ready once granted")
    assert time.time() - w_started < 60


def test_wrong_password_is_one_line_not_ready_then_recovers(env, tmp_path):
    """WRONGPASS: one line naming the user, not ready, retrying with backoff;
    the password file is read again at each connect, so fixing it (a rotated
    Secret) is enough."""
    r = env.r
    setuser(r, "app", *minimal_rules())
    pw = tmp_path / "password"
    pw.write_text("not-the-password\n")
    p = proxy(env, password_file=pw, username="app",
              streams=[dict(SCENARIO, lock_key="", fencing=False)])
    wait_for(lambda: lines(p, "WRONGPASS"), timeout=10, what="the WRONGPASS line")
    assert re.search(r'redis: AUTH refused for user "app": WRONGPASS', lines(p, "WRONGPASS")[0])
    time.sleep(5)
    assert p.get("/readyz")[0] == 503
    assert len(lines(p, "WRONGPASS")) == 1, lines(p, "WRONGPASS")
    assert not lines(p, r"NOAUTH|handshake refused")
    publish(r, "room", [{"eventId": "x"}])
    pw.write_text(PASSWORD + "\n")
    w = env.worker(p.endpoint)
    wait_for(lambda: ready(p), timeout=15, what="ready once the file is fixed")
    wait_for(lambda: settled(p, "room", 1), what="the entry handled")
    assert w.keys() == ["x"] and r.exists("done:x")
    assert PASSWORD not in p.log_text() and "not-the-password" not in p.log_text()


def test_server_wanting_a_password_none_configured_is_one_line(env):
    """requirepass on the server and no password configured: one line that
    says so (not a NOAUTH line per link and reconnect), not ready; ready and
    delivering once the server no longer wants one."""
    r = env.r
    publish(r, "room", [{"eventId": "y"}])
    r.config_set("requirepass", PASSWORD)          # this connection stays authenticated
    try:
        p = proxy(env, streams=[dict(SCENARIO, lock_key="", fencing=False)])
        wait_for(lambda: lines(p, "wants a password"), timeout=10, what="the line")
        time.sleep(5)
        assert p.get("/readyz")[0] == 503
        assert len(lines(p, "NOAUTH")) == 1, lines(p, "NOAUTH")
        assert not lines(p, r"link lost|handshake refused")
    finally:
        r.config_set("requirepass", "")
    w = env.worker(p.endpoint)
    wait_for(lambda: ready(p), timeout=15, what="ready")
    wait_for(lambda: settled(p, "room", 1), what="the entry handled")
    assert w.keys() == ["y"]


def check(tmp_path, redis_lines, files=True):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("redis:\n" + "".join(f"  {ln}\n" for ln in redis_lines) +
                   "streams:\n  - stream: s\n")
    return subprocess.run([str(BIN), "check", "-c", str(cfg), *(["--files"] if files else [])],
                          capture_output=True, text=True, timeout=10)


def test_check_refuses_a_user_without_password_and_a_missing_password_file(tmp_path):
    res = check(tmp_path, ["username: app"])
    assert res.returncode == 2
    assert "redis.username: a user needs a password" in res.stderr, res.stderr

    missing = tmp_path / "nope" / "password"
    res = check(tmp_path, [f"password_file: {missing}"])
    assert res.returncode == 2
    assert f"redis.password_file {missing}: cannot read it: No such file or directory" in res.stderr

    empty = tmp_path / "empty"
    empty.write_text("\n")
    res = check(tmp_path, ["username: app", f"password_file: {empty}"])
    assert res.returncode == 2
    assert f'redis.password_file {empty} is empty: user "app" needs a password' in res.stderr

    res = check(tmp_path, ["url: redis://app@127.0.0.1:6379"])
    assert res.returncode == 2
    assert "the url has a user but no password" in res.stderr

    res = check(tmp_path, [f"password_file: {empty}"])       # no user: no AUTH, fine
    assert res.returncode == 0, res.stderr
    good = tmp_path / "good"
    good.write_text("pw\n")
    res = check(tmp_path, ["username: app", f"password_file: {good}"])
    assert res.returncode == 0, res.stderr


def test_check_reads_no_password_file_without_files(tmp_path):
    """docs/configuration.md: check is hermetic (issue 33: CI checks a rendered
    ConfigMap with no
    Secret mounted); --files reads the files as the daemon does."""
    missing = tmp_path / "nope" / "password"
    res = check(tmp_path, [f"password_file: {missing}", "username: app"], files=False)
    assert res.returncode == 0, res.stderr
    assert str(missing) not in res.stderr
    res = check(tmp_path, [f"password_file: {missing}", "username: app"])
    assert res.returncode == 2 and f"redis.password_file {missing}: cannot read it" in res.stderr


def test_every_cluster_node_link_authenticates_as_the_user(tmp_path):
    """redis.cluster with an ACL user: every master's link (command and
    reader) AUTHs as that user, with the minimal ACL plus +cluster|slots
    +asking, and every entry is delivered once."""
    from pxtest import PyWorker, RedisCluster
    d = tmp_path / "cluster"
    d.mkdir()
    c = RedisCluster(d, masters=3, replicas=0)
    try:
        rules = ["resetchannels", "~s*", "~done:*", "~lock:*", "~idemproxy:*", "-@all",
                 *doc_acl(), "+cluster|slots", "+asking"]
        for port in c.ports:
            setuser(c.node(port), "app", *rules)
        pw = tmp_path / "password"
        pw.write_text(PASSWORD + "\n")
        streams = [f"s{i}" for i in range(6)]
        r = c.client
        for s in streams:
            for i in range(3):
                r.xadd(s, {"payload": f'{{"eventId": "{s}-{i % 2}"}}'})
        p = Proxy(tmp_path, "proxy1", c.seeds, f"ipc://{tmp_path}/app.sock",
                  [{"stream": s, "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId", "layout": "split", "hash_tag": True}
                   for s in streams],
                  redis={"password_file": pw, "username": "app"}).start()
        w = PyWorker(p.endpoint)
        try:
            wait_for(lambda: ready(p), timeout=20, what="ready on the cluster")
            wait_for(lambda: all(settled(p, s, 3) for s in streams), timeout=20, what="settled")
            assert sorted(w.keys()) == sorted(f"{s}-{i}" for s in streams for i in range(2))
            for port in c.ports:
                users = {cl["user"] for cl in c.node(port).client_list()
                         if cl.get("name", "") == "" and cl["cmd"] != "client|list"}
                assert "app" in users, (port, users)
                assert c.node(port).execute_command("ACL", "LOG") == [], port
            assert not lines(p, r"NOPERM|AUTH refused|lacks permission")
        finally:
            assert p.stop() == 0
            w.close()
    finally:
        c.stop()


def test_a_user_without_xinfo_is_ready_without_lag_metrics(env, tmp_path):
    """XINFO feeds only the group lag gauges and the idle-consumer cleanup. A
    user the older minimal ACL made (no +xinfo|groups) had every lag refresh
    refused, the command link dropped each 5 s and the pod held not ready. Now
    that refusal is one warning line, the pod is ready and entries flow."""
    r = env.r
    setuser(r, "app", *minimal_rules(drop={"xinfo|groups"}))
    pw = tmp_path / "password"
    pw.write_text(PASSWORD)
    orphans(r)
    p = proxy(env, password_file=pw, username="app")
    run_scenario(env, p)
    time.sleep(6)                                    # lag refreshes (1 s, then every 5 s)
    assert ready(p) and p.get("/readyz")[0] == 200
    assert len(lines(p, "lacks permission for XINFO")) == 1, p.log_text()[-2000:]
    assert not lines(p, "link lost"), p.log_text()[-2000:]
    assert not any(k.startswith("idemproxy_group_lag") for k in p.metrics())


def test_a_key_the_user_may_not_touch_dead_letters_that_entry_only(env, tmp_path):
    """An ACL refusal of a key (NOPERM ... access one of the keys) belongs to the
    entry whose rendered lock_key it is, not to the configuration: that entry
    ends in one dead letter after its tries (docs/guarantee.md), the others are
    delivered and the pod stays ready. Handled like a refused command (drop the
    link, retry for ever, not ready), one such event stopped the stream."""
    r = env.r
    setuser(r, "app", *minimal_rules())
    pw = tmp_path / "password"
    pw.write_text(PASSWORD)
    conf = dict(SCENARIO, lock_key="seat#{event.seatId}", wait_ms=0, claim_idle_ms=3000)
    p = proxy(env, password_file=pw, username="app", streams=(conf,))
    w = env.worker(p.endpoint)
    wait_for(lambda: ready(p), timeout=10, what="ready")
    publish(r, "room", [{"eventId": "ok1", "seatId": ":1"}, {"eventId": "bad", "seatId": "X"},
                        {"eventId": "ok2", "seatId": ":2"}])
    wait_for(lambda: len(r.xrange("room:dlq")) == 1, timeout=20, what="the refused entry's dead letter")
    dl = r.xrange("room:dlq")[0][1]
    assert "NOPERM" in dl["idemproxy-reason"], dl
    wait_for(lambda: sorted(w.keys()) == ["ok1", "ok2"], timeout=10, what="the others delivered")
    assert ready(p)
    assert not lines(p, "lacks permission"), p.log_text()[-2000:]
