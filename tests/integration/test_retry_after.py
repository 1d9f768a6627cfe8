"""Protocol 1.1 (docs/protocol.md): a worker that knows when it can succeed answers
RETRY with Ack.retry_after_ms; idemproxy redelivers no earlier (at most an
hour), counts the attempt, and dead-letters at max_deliveries as for any
RETRY."""
import time

from pxtest import pb, publish, wait_for


def conf(**kw):
    s = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.eventId", "retry_backoff_ms": 50, "dead_letter": "dlq"}
    s.update(kw)
    return s


def test_retry_after_ms_sets_the_redelivery_time(env):
    r = env.r
    times = []

    def behave(d):
        times.append((d.attempt, time.monotonic()))
        if d.attempt == 1:
            return pb.Ack(status=pb.Ack.RETRY, reason="rate limited", retry_after_ms=1500).SerializeToString()
        return pb.Ack(status=pb.Ack.ACK).SerializeToString()

    p = env.proxy([conf()])
    env.worker(p.endpoint, behave=behave)
    publish(r, "room", [{"eventId": "k"}])
    wait_for(lambda: len(times) == 2, 10, "the redelivery")
    (a1, t1), (a2, t2) = times
    assert (a1, a2) == (1, 2)
    assert t2 - t1 >= 1.45, f"redelivered {t2 - t1:.2f} s after a retry_after_ms of 1500"
    wait_for(lambda: (r.get("idem:k") or "")[:1] == "D", 5, "k done")


def test_retry_after_ms_still_counts_toward_max_deliveries(env):
    r = env.r
    got = []

    def behave(d):
        got.append(d.attempt)
        return pb.Ack(status=pb.Ack.RETRY, reason="not yet", retry_after_ms=100).SerializeToString()

    p = env.proxy([conf(max_deliveries=3)])
    env.worker(p.endpoint, behave=behave)
    publish(r, "room", [{"eventId": "k"}])
    wait_for(lambda: r.exists("dlq") and r.xlen("dlq") == 1, 10, "dead-lettered")
    assert got == [1, 2, 3]
    (_, f), = r.xrange("dlq")
    assert "max_deliveries (3)" in f["idemproxy-reason"] and "not yet" in f["idemproxy-reason"]


def test_without_retry_after_ms_the_backoff_applies(env):
    """An old worker (protocol 1.0) sends no retry_after_ms: the backoff, 50 ms here."""
    times = []

    def behave(d):
        times.append(time.monotonic())
        return (pb.Ack.RETRY, "") if len(times) == 1 else (pb.Ack.ACK, "")

    p = env.proxy([conf()])
    env.worker(p.endpoint, behave=behave)
    publish(env.r, "room", [{"eventId": "k"}])
    wait_for(lambda: len(times) == 2, 10, "the redelivery")
    assert times[1] - times[0] < 1.0
