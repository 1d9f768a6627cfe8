"""Leases that may have run out (issue 30, findings 1 and 5; SPEC 5.4, 6): an
entry is sent only while its lease is known to be held, and
idemproxy_lease_lost_total counts only leases that were held. Real
redis-server, two real proxies, one of them behind slowlink.py's forwarder,
which can refuse its link to Redis."""
import time

import pytest

from pxtest import Proxy, pb, publish, wait_for
from slowlink import SlowLink


def stream_conf(mode, **kw):
    s = {"stream": "room", "payload_field": "payload", "key": "#event.eventId", "layout": "single"}
    if mode == "group":
        s.update(group="g", claim_idle_ms=1000)
    s.update(kw)
    return s


def one(m, family, **labels):
    """The value of the one series of 'family' whose labels include 'labels'."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = [v for k, v in m.items() if k.startswith(family + "{") and all(w in k for w in want)]
    assert len(found) == 1, (family, labels, found)
    return found[0]


@pytest.mark.parametrize("mode", ["group", "groupless"])
def test_a_failed_claim_is_no_lease_lost(env, tmp_path, mode):
    """Finding 5: a claim whose SET never reached Redis (its link dropped as
    it carried it) left the lock "maybe held"; the extension that follows
    answered 0 and was counted in idemproxy_lease_lost_total with a "lease
    lost" line, a lease that was never held, and the flag stayed: the next
    good claim was bounced through a second claim ("lease lost before
    delivery"). Now a lease is counted lost only once a reply confirmed it
    held; the entry is delivered once, and nothing is counted."""
    r = env.r
    link = SlowLink(env.redis.port, 0)
    try:
        ep = env.endpoint()
        p = Proxy(tmp_path, "cut", link.url, ep, [stream_conf(mode, consumer="a", lease_ms=900)],
                  timeout_ms=300)
        env.proxies.append(p)
        p.start()
        w = env.worker(ep)
        wait_for(lambda: p.get("/readyz")[0] == 200, 10, "ready")
        # For a second, the link drops whenever it carries the claim's SET:
        # the claim fails (not applied), the extensions meanwhile answer 0.
        link.refuse([b"$3\r\nSET\r\n$6\r\nidem:k\r\n"], 1.0)
        publish(r, "room", [{"eventId": "k"}])
        wait_for(lambda: r.get("idem:k") == "D", 20, "k delivered and done")
        wait_for(lambda: one(p.metrics(), "idemproxy_entries_pending") == 0, 10, "k left")
        assert link.refusing >= 1, "no claim was refused"
        m = p.metrics()
        assert one(m, "idemproxy_lease_lost_total") == 0
        assert one(m, "idemproxy_outcomes_total", outcome="acked") == 1
        assert [(d.key, d.attempt) for d in w.got] == [("k", 1)]
        log = p.log_text()
        assert "lease lost" not in log, [l for l in log.splitlines() if "lease lost" in l]
    finally:
        link.close()
