"""A daemon that waits for Redis sleeps: queued work does not spin or tick the
loop while Redis is down (issue 30, "the XACK ride re-arms every loop turn
while Redis is down with XACKs queued"). The loop thread's wake-ups are read
from /proc (voluntary_ctxt_switches: each epoll_wait that sleeps is one)."""
import time

from pxtest import Proxy, publish, wait_for
from slowlink import SlowLink

MEASURE_S = 3.0


def wakeups(pid, seconds=MEASURE_S):
    """The main thread's voluntary context switches over 'seconds'."""
    def count():
        with open(f"/proc/{pid}/task/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    before = count()
    time.sleep(seconds)
    return count() - before


def test_xacks_queued_while_redis_is_down_do_not_wake_the_loop(env):
    """Each XACK is refused on its way to Redis (its link dropped, as a
    network that fails just then), and Redis is then stopped: the XACK stays
    queued until Redis is back. The loop must wake about as often as with
    nothing queued; then, Redis back, the XACK is written.

    Before (096ffd5): 37 wake-ups idle, 73 with the XACK queued, every run:
    not ~100 a second, but each wake-up armed the 10 ms XACK ride again,
    which woke the loop once more for nothing (Redis down: nothing sent)."""
    srv = env.redis
    aof = ["--appendonly", "yes", "--appendfsync", "always"]      # a restart keeps the stream
    srv.stop()
    srv.start(aof)
    r = srv.client
    conf = {"stream": "room", "payload_field": "payload", "key": "#event.eventId",
            "group": "g", "consumer": "c1"}
    slow = SlowLink(srv.port, 0)
    try:
        p = Proxy(env.tmp, "proxy1", slow.url, env.endpoint(), [conf])
        env.proxies.append(p)
        p.start()
        w = env.worker(p.endpoint)
        wait_for(lambda: p.get("/readyz")[0] == 200, what="ready")

        # Nothing queued: Redis down, the links reconnecting with backoff.
        srv.stop()
        p.wait_log("link lost")
        time.sleep(1.0)
        idle = wakeups(p.proc.pid)
        srv.start(aof)
        r = srv.client
        wait_for(lambda: p.get("/readyz")[0] == 200, timeout=15, what="ready again")

        # One XACK queued: refused until Redis is stopped.
        slow.refuse([b"XACK"], 600)
        publish(r, "room", [{"eventId": "k1"}])
        wait_for(lambda: (r.get("idem:k1") or "")[:1] == "D", what="k1 done")
        wait_for(lambda: slow.refusing >= 1, what="its XACK refused")
        srv.stop()
        time.sleep(1.0)
        queued = wakeups(p.proc.pid)
        print(f"wake-ups in {MEASURE_S} s with Redis down: {idle} idle, {queued} with an XACK queued")
        assert queued <= 1.4 * idle + 5, (idle, queued)

        slow.refuse([], 0)
        srv.start(aof)
        r = srv.client
        wait_for(lambda: r.xpending("room", "g")["pending"] == 0, timeout=15,
                 what="the XACK written once Redis is back")
        assert w.keys() == ["k1"]
    finally:
        slow.close()
