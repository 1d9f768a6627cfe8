"""Replies lost, late or slow on the link to Redis (proxy/link.c, the reader's
replays and reclaims) against the guarantee and the fault rules
(docs/guarantee.md): a read or reclaim whose reply never came is not a delivery,
a replay brings back what it took and is not moved by a reclaim, a stop frees
what waits, and an address that never answers does not hide the next. Each
docstring says what breaks if the rule does. Real redis-server, real
idemproxy; a throttling TCP forwarder (Throttle, below) and a SYN-dropping
listener (Blackhole) stand in for a slow network and a dead address."""
import json
import os
import socket
import threading
import time

import pytest

from pxtest import Proxy, free_port, pb, pending, publish, settled, wait_for
from slowlink import SlowLink

def proxy_at(env, url, stream, **app):
    """A proxy on 'url' (a forwarder, a host name) instead of env's Redis."""
    p = Proxy(env.tmp, f"proxy{len(env.proxies) + 1}", url, env.endpoint(), [stream], **app)
    env.proxies.append(p)
    return p.start()


STREAM = {"stream": "room", "payload_field": "payload", "key": "#event.eventId",
          "layout": "single", "group": "game-server", "consumer": "c1"}


class Throttle:
    """A TCP forwarder ('at', 127.0.0.1 by default) whose server-to-client direction carries at
    most 'rate' bytes a second (None: as fast as it can). 'rate' may be changed
    while connections are open: a network brownout that ends."""

    def __init__(self, target_port, rate, at=("127.0.0.1", 0)):
        self.target = ("127.0.0.1", target_port)
        self.rate = rate
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(at)
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.conns = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
                u = socket.create_connection(self.target)
            except OSError:
                continue
            self.conns += [c, u]
            threading.Thread(target=self._pump, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, True), daemon=True).start()

    def _pump(self, src, dst, slow):
        while True:
            try:
                data = src.recv(4096 if slow else 65536)
                if not data:
                    break
                if slow and self.rate:
                    time.sleep(len(data) / self.rate)
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.lsock.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass


def test_a_slow_history_read_never_counts_as_deliveries(env):
    """If broken: entries dead-lettered as exhausted that no worker ever
    saw (docs/guarantee.md: Redis' delivery count is idemproxy's count of
    deliveries).

    A read's reply that takes longer than its deadline to arrive (a large page
    over a slow link) drops the link (link.c deadline_cb) after Redis has
    applied the read. The group reader then starts over with its history,
    XREADGROUP from 0 with the same COUNT (reader.c: page_seen only adapts after
    a reply that arrived, and a history read has no BLOCK allowance), which
    times out the same way, at every reconnect; and every history read raises
    Redis' delivery count of each entry in the page, which idemproxy takes as
    its attempt number. When the network recovers, the page's entries are
    past max_deliveries and go to the dead-letter stream without a single
    delivery.

    Here: 16 entries of ~150 KB pending for c1 (a restart), the link to Redis
    carries 300 KB/s for 8 s (a page takes 8 s, timeout_ms is 500), then full
    speed. Every entry must reach the worker, none may be dead-lettered.

    Fix proposed: a read lost to its deadline halves the stream's page_count
    (to 1 at least), as a page over PX_PAGE_BYTES does, so the reader finds a
    page that fits; and a history replay does not take Redis' count at face
    value after reads this process lost (e.g. remember the ids of a lost
    history page and set their count back with XCLAIM ... RETRYCOUNT JUSTID,
    as set_count does for a re-read tracked entry)."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    pad = "x" * 150_000
    keys = [f"big-{i}" for i in range(16)]
    publish(r, "room", [{"eventId": k, "pad": pad} for k in keys])
    r.xreadgroup("game-server", "c1", {"room": ">"}, count=16)     # c1's, before a restart
    slow = Throttle(env.redis.port, 300_000)
    try:
        p = proxy_at(env, slow.url, dict(STREAM, max_deliveries=3, dead_letter="dlq"),
                     timeout_ms=500)
        w = env.worker(p.endpoint)
        time.sleep(8)
        slow.rate = None                                           # the brownout ends
        wait_for(lambda: settled(p, "room", 16), timeout=30, what="every entry's outcome")
        assert r.xlen("dlq") == 0, [f["idemproxy-reason"] for _, f in r.xrange("dlq")][:2]
        assert sorted(w.keys()) == sorted(keys)
        assert pending(r, "room", "game-server") == 0
    finally:
        slow.close()


def test_a_read_whose_reply_was_lost_is_not_a_delivery(env):
    """The same, in its everyday form. If broken: the first delivery of an entry says
    attempt 2, and each lost read eats one of max_deliveries (docs/guarantee.md:
    Redis' delivery count is idemproxy's count of deliveries).

    The live XREADGROUP ... > is applied (the entries go to c1's pending list,
    delivery count 1) and the link drops before its reply is in: a deadline,
    a reset connection. The reader starts over with its history (XREADGROUP
    from 0), which counts a second delivery, and counts_reply_cb takes that
    count minus one as the attempts so far: the worker's first delivery of
    the entry carries attempt 2 although no worker ever saw it.

    Fix proposed: the reader remembers that a read's reply was lost (link.c
    answers it with NULL) and, when its history read brings entries it never
    handled, sets their count back by one with XCLAIM ... RETRYCOUNT JUSTID
    (set_count) before taking the count as attempts; or, simpler, takes
    count - 2 for the entries of the first history page after a lost read."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    link = SlowLink(env.redis.port, 0)
    try:
        p = proxy_at(env, link.url, STREAM)
        # the live read (its last argument ">"), not the history read from 0
        link.cut_reply_to(b"$1\r\n>\r\n",
                          lambda: pending(r, "room", "game-server") == 1)
        time.sleep(0.5)
        publish(r, "room", [{"eventId": "e1"}])
        w = env.worker(p.endpoint)
        wait_for(lambda: w.keys() == ["e1"], timeout=15, what="delivered after the lost read")
        assert link.cuts == 1
        assert w.got[0].attempt == 1, f"first delivery sent as attempt {w.got[0].attempt}"
    finally:
        link.close()


class Blackhole:
    """A listener on 'addr' whose accept queue is full: a connect to it is
    never answered (the SYN is dropped), as with a dead host or a firewall
    that drops. Linux only."""

    def __init__(self, addr, port):
        self.l = socket.socket()
        self.l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.l.bind((addr, port))
        self.l.listen(0)
        self.fill = []
        for _ in range(2):                  # take the one slot of the queue
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((addr, port))
            self.fill.append(s)
        time.sleep(0.2)

    def close(self):
        for s in self.fill + [self.l]:
            s.close()


HOSTS = "/etc/hosts"
MARK = "# idemproxy test_lost_replies"


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(HOSTS, os.W_OK),
                    reason="rewrites /etc/hosts: needs root (CI runs as root)")
def test_an_address_that_never_answers_does_not_hide_the_next(env, tmp_path):
    """If broken: not ready for ever while Redis is reachable (docs/operations.md, /readyz).

    link.c tries the next address of a lookup only when a connect fails
    (connect_done, an error in SO_ERROR). A connect that is never answered
    (a dead host, a dropping firewall, a stale DNS record) runs into the
    handshake's deadline instead, which drops the link as a whole
    (deadline_cb, ST_CONNECTING): the next address is never tried, and the
    reconnect resolves the same answer in the same order and waits on the same
    address again, for ever.

    Here the name resolves to 127.0.0.1 (SYNs dropped) and 127.0.0.2 (Redis,
    through a forwarder), in that order (RFC 6724 puts 127.0.0.1 first). The
    proxy must connect and deliver.

    Fix proposed: give each address its own connect timeout (a share of
    timeout_ms, or timeout_ms / addresses left), and on it close that socket
    and try_next_addr, as on a refused connect; or race them (Happy Eyeballs,
    RFC 8305). Dropping the link only when the last address has failed."""
    port = free_port()
    name = "redis-silent.test"
    hole = Blackhole("127.0.0.1", port)
    fwd = Throttle(env.redis.port, None, at=("127.0.0.2", port))
    with open(HOSTS) as f:
        before = f.read()
    try:
        with open(HOSTS, "r+") as f:      # in place: /etc/hosts may be a bind mount
            f.seek(0)
            f.write(before + f"127.0.0.1 {name} {MARK}\n127.0.0.2 {name} {MARK}\n")
            f.truncate()
        assert [a[4][0] for a in socket.getaddrinfo(name, port, socket.AF_INET,
                                                     socket.SOCK_STREAM)] == ["127.0.0.1",
                                                                              "127.0.0.2"]
        p = proxy_at(env, f"redis://{name}:{port}", STREAM, timeout_ms=500)
        w = env.worker(p.endpoint)
        publish(env.r, "room", [{"eventId": "e1"}])
        wait_for(lambda: w.keys() == ["e1"], timeout=15, what="delivered over the second address")
    finally:
        with open(HOSTS, "r+") as f:
            f.seek(0)
            f.write(before)
            f.truncate()
        hole.close()
        fwd.close()


def test_a_stop_while_an_xpending_ask_waits_frees_it(env):
    """A history page's XPENDING (the delivery counts) waiting on its timer when
    SIGTERM comes: the drain ends the loop before the timer fires, and the ask
    must be answered and freed by the stop, not leaked (LeakSanitizer exits 23
    under `tests/run memcheck`). The entries it held back
    were never delivered and stay pending for the next process."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    publish(r, "room", [{"eventId": f"w{i}"} for i in range(3)])
    r.xreadgroup("game-server", "c1", {"room": ">"}, count=3)      # c1's, before a restart
    p = env.proxy([STREAM], proc_env={"IDEMPROXY_DEBUG_COUNTS_DELAY_MS": 5000})
    w = env.worker(p.endpoint)
    wait_for(lambda: p.get("/readyz")[0] == 200, what="ready")
    time.sleep(1.0)                      # the history page is read; its XPENDING waits
    assert w.keys() == []
    assert p.stop() == 0
    assert pending(r, "room", "game-server") == 3


def test_a_reclaim_whose_reply_was_lost_is_not_a_delivery(env):
    """On the reclaim path. If broken: entries dead-lettered as exhausted
    that a worker saw once (docs/guarantee.md: Redis' delivery count is
    idemproxy's count of deliveries).

    XAUTOCLAIM takes entries another consumer left pending, and Redis counts a
    delivery of each as it applies the command. When the reply is lost (a
    deadline, a reset), the entries are ours in Redis with their count raised
    and the reclaim cursor did not move: the next XAUTOCLAIM, claim_idle_ms
    later, took them again and counted once more, and each lost reply ate one
    of max_deliveries. Here 3 entries delivered once to c0 (count 1), idle past
    claim_idle_ms, and the first reclaim's reply lost: with max_deliveries 2
    each must reach the worker as attempt 2 (c0's delivery, then this one),
    not be dead-lettered as a third."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    keys = ["re-1", "re-2", "re-3"]
    publish(r, "room", [{"eventId": k} for k in keys])
    r.xreadgroup("game-server", "c0", {"room": ">"}, count=3)       # c0 took them and died
    time.sleep(1.0)                                                 # idle past claim_idle_ms
    link = SlowLink(env.redis.port, 0, cut_on=b"XAUTOCLAIM", cuts=1)
    try:
        p = proxy_at(env, link.url, dict(STREAM, claim_idle_ms=900, max_deliveries=2, dead_letter="dlq"),
                     timeout_ms=300)
        w = env.worker(p.endpoint)
        wait_for(lambda: len(w.keys()) + r.xlen("dlq") >= 3, timeout=20,
                 what="the reclaimed entries delivered or dead-lettered")
        assert link.cut == 1
        assert r.xlen("dlq") == 0, [f["idemproxy-reason"] for _, f in r.xrange("dlq")]
        assert sorted(w.keys()) == keys
        assert [g.attempt for g in w.got] == [2, 2, 2], [g.attempt for g in w.got]
        wait_for(lambda: pending(r, "room", "game-server") == 0, what="everything acked")
    finally:
        link.close()


def test_a_lost_reclaim_leaves_the_count_of_held_entries_alone(env):
    """The replay a lost reclaim triggers re-reads the entries we still hold
    (their count goes up by one in Redis) and sets each back (set_count, on the
    command link). Started while the command link was still down from the
    loss, the set-backs were refused and each held entry kept a delivery too
    many in Redis, for a restart or another replica to charge. Here a worker
    holds every delivery while entries keep coming (the reader's blocking read
    returns at once, so the replay could start inside the command link's
    reconnect backoff); after the lost reclaim and its replay, no pending entry
    may show more than one delivery."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    link = SlowLink(env.redis.port, 0, cut_on=b"XAUTOCLAIM", cuts=1)
    try:
        p = proxy_at(env, link.url, dict(STREAM, claim_idle_ms=900), timeout_ms=300)
        w = env.worker(p.endpoint, manual=True)
        publish(r, "room", [{"eventId": "held-0"}])
        wait_for(lambda: len(w.inbox) == 1, what="the first delivery held")
        n = 1
        deadline = time.time() + 1.5
        while time.time() < deadline:                      # entries keep coming meanwhile
            publish(r, "room", [{"eventId": f"held-{n}"}])
            n += 1
            time.sleep(0.01)
        wait_for(lambda: link.cut == 1, what="the reclaim's reply lost")
        wait_for(lambda: pending(r, "room", "game-server") == n, timeout=15, what="every entry read")
        time.sleep(2.5)                                    # the replay and its set-backs
        counts = {e["message_id"]: e["times_delivered"]
                  for e in r.xpending_range("room", "game-server", "-", "+", 10000)}
        assert len(counts) == n
        # 1 for each entry read or delivered once; 0 for one whose claim failed
        # with the cut and that waits undelivered (its read is not charged)
        assert set(counts.values()) <= {0, 1}, sorted(c for c in counts.values() if c > 1)[:5]
    finally:
        link.close()


def reader_connection(r):
    """The id of the reader's connection: blocked in XREADGROUP."""
    for c in r.client_list():
        if c.get("cmd") == "xreadgroup" and "b" in c.get("flags", ""):
            return c["id"]
    return None


def test_a_reclaim_answered_during_a_replay_does_not_move_the_replay(env):
    """If broken: entries of ours a lost read took are skipped by the replay
    meant to bring them back, then reclaimed claim_idle_ms later with a
    delivery counted that no worker saw: attempt 2 on their first delivery, a
    dead letter with max_deliveries 1 (docs/guarantee.md).

    The history replay reads our pending entries page by page from the last
    id it read. An XAUTOCLAIM reply that arrived while the replay waited for
    room moved that id to the reclaimed entries' last id: when those are newer
    than what the replay had left to read, the replay jumped past it. Here
    our pending list holds four entries of a lost read (count 1, never
    delivered), c0 left two newer ones idle, the reclaim of those is answered
    late, and the reader's connection is reset just after it went out: the
    replay reads two of ours (max_inflight 2), the reclaim's answer comes, and
    the replay must still bring the other two, each as a first delivery."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    ours = ["ours-1", "ours-2", "ours-3", "ours-4"]
    dead = ["dead-1", "dead-2"]
    ids = publish(r, "room", [{"eventId": k} for k in ours + dead])
    r.xreadgroup("game-server", "c0", {"room": ">"}, count=6)      # c0 took them all
    link = SlowLink(env.redis.port, 0)
    try:
        # a reclaim's answer is held 2 s: timeout_ms 4000, so claim_idle_ms 12000 (docs/configuration.md)
        p = proxy_at(env, link.url, dict(STREAM, claim_idle_ms=12000, lease_ms=10000), max_inflight=2,
                     timeout_ms=4000)
        w = env.worker(p.endpoint, manual=True)
        # Until the reader is live, keep them fresh so no reclaim takes them yet.
        deadline = time.time() + 15
        while reader_connection(r) is None and time.time() < deadline:
            r.xclaim("room", "game-server", "c0", 0, ids, idle=0, justid=True)
            time.sleep(0.05)
        assert reader_connection(r) is not None, "the reader never went live"
        link.hold_replies_after(b"XAUTOCLAIM", 2.0)
        with r.pipeline(transaction=True) as tx:
            # ours: what a lost read of c1 took (counted once, never delivered)
            tx.xclaim("room", "game-server", "c1", 0, ids[:4], idle=0, retrycount=1, justid=True)
            # c0's: idle long since, for the next reclaim
            tx.xclaim("room", "game-server", "c0", 0, ids[4:], idle=60000, justid=True)
            tx.execute()
        wait_for(lambda: link.held == 1, timeout=15, what="a reclaim sent, its answer held")
        r.client_kill_filter(_id=reader_connection(r))             # the replay starts now
        deadline = time.time() + 20
        while len(w.got) < 6 and time.time() < deadline:
            while w.inbox:
                w.answer(pb.Ack.ACK)
            time.sleep(0.01)
        while w.inbox:
            w.answer(pb.Ack.ACK)
        attempts = {g.key: g.attempt for g in w.got}
        assert sorted(attempts) == sorted(ours + dead), attempts
        assert attempts == {**{k: 1 for k in ours}, **{k: 2 for k in dead}}, attempts
        assert len(w.got) == 6, [g.key for g in w.got]
        wait_for(lambda: pending(r, "room", "game-server") == 0, what="everything acked")
    finally:
        link.close()


DEAD_KEYS = ["dead-1", "dead-2"]


def reclaim_with_late_counts(env, link, counts_delay_ms):
    """c0 read DEAD_KEYS and died; a proxy (c1) on 'link' whose XPENDING asks
    go out counts_delay_ms late (a test hook) reclaims them (count 2). Returns
    its worker once the reclaim is applied in Redis and its reply is in."""
    r = env.r
    r.xgroup_create("room", "game-server", id="0", mkstream=True)
    ids = publish(r, "room", [{"eventId": k} for k in DEAD_KEYS])
    r.xreadgroup("game-server", "c0", {"room": ">"}, count=2)      # c0 took them and died
    p = Proxy(env.tmp, "proxy1", link.url, env.endpoint(),
              [dict(STREAM, claim_idle_ms=900, max_deliveries=2, dead_letter="dlq")], timeout_ms=300)
    env.proxies.append(p)
    p.start(IDEMPROXY_DEBUG_COUNTS_DELAY_MS=counts_delay_ms)
    w = env.worker(p.endpoint)
    deadline = time.time() + 15
    while reader_connection(r) is None and time.time() < deadline:
        r.xclaim("room", "game-server", "c0", 0, ids, idle=0, justid=True)
        time.sleep(0.05)
    r.xclaim("room", "game-server", "c0", 0, ids, idle=60000, justid=True)

    def ours():
        return {e["consumer"] for e in r.xpending_range("room", "game-server", "-", "+", 10)} in ({b"c1"}, {"c1"})
    wait_for(ours, timeout=5, what="the reclaim applied")
    time.sleep(0.1)                                                  # ... and its reply in
    return w


def assert_each_delivered(r, w):
    """No dead letter; each of DEAD_KEYS delivered as attempt 1 or 2; nothing pending."""
    assert r.xlen("dlq") == 0, [f["idemproxy-reason"] for _, f in r.xrange("dlq")]
    assert sorted(w.keys()) == DEAD_KEYS
    assert all(1 <= g.attempt <= 2 for g in w.got), [g.attempt for g in w.got]
    wait_for(lambda: pending(r, "room", "game-server") == 0, what="everything acked")


def test_an_entry_read_again_before_its_count_is_known_is_not_charged_for_it(env):
    """If broken: a reclaimed entry
    dead-lettered as exhausted that no worker of ours saw (docs/guarantee.md).

    A replay that reads again an entry we hold (Redis counts one more) sets
    its count back with XCLAIM RETRYCOUNT. For an entry whose count was not
    known yet (its batch's XPENDING still out) that guessed the count; and
    when the command link was down the set-back never went out, so the
    XPENDING, answered later, took the replay's read as a delivery. Here c0
    read two entries and died; we reclaim them (count 2), their XPENDING goes
    out 1.5 s later (a test hook), the reader's connection is reset so the
    replay reads them again (count 3) while the command link drops each time
    it sends a set-back or an XPENDING. With max_deliveries 2 they were
    dead-lettered undelivered; each must reach the worker."""
    r = env.r
    link = SlowLink(env.redis.port, 0)
    try:
        w = reclaim_with_late_counts(env, link, 1500)
        # the command link drops when used (a count set back is a script: EVALSHA)
        link.refuse([b"XCLAIM", b"XPENDING", b"EVAL"], 1.0)
        r.client_kill_filter(_id=reader_connection(r))              # the replay reads them again
        wait_for(lambda: len(w.keys()) + r.xlen("dlq") >= 2, timeout=20,
                 what="the reclaimed entries delivered or dead-lettered")
        assert link.refusing >= 1
        assert_each_delivered(r, w)
    finally:
        link.close()


def test_a_replay_read_lost_before_a_reclaims_count_comes_is_not_charged(env):
    """If broken: a reclaimed entry
    dead-lettered as exhausted that no worker of ours saw (docs/guarantee.md).

    We reclaim c0's entries (count 2); their XPENDING goes out late (a test
    hook). Meanwhile the reader's connection is reset and the replay's first
    read, which Redis applies (count 3), loses its reply. The XPENDING then
    saw 3 with no loss on record for it (a reclaim's ask counted none) and
    charged the replay's read: attempt 3 past max_deliveries 2, dead-lettered
    undelivered. A history read lost, or still out, after an ask was made may
    have counted a delivery of its entries too: each must reach the worker."""
    r = env.r
    link = SlowLink(env.redis.port, 0, cut_wait=1.5)
    try:
        w = reclaim_with_late_counts(env, link, 800)
        # the replay's first read (from 0): applied, its reply lost
        link.cut_reply_to(b"STREAMS\r\n$4\r\nroom\r\n$1\r\n0\r\n", None)
        r.client_kill_filter(_id=reader_connection(r))
        wait_for(lambda: len(w.keys()) + r.xlen("dlq") >= 2, timeout=20,
                 what="the reclaimed entries delivered or dead-lettered")
        wait_for(lambda: link.cut == 1, timeout=5, what="the replay's read lost")
        assert_each_delivered(r, w)
    finally:
        link.close()
