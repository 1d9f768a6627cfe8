"""A worker's answer to a delivery that timed out is ignored, even when it
comes after the redelivery took the same request-id slot (docs/protocol.md; issue
30): the request id's generation tells the two deliveries apart. Before this
test only chaos cluster seed 12c told a daemon that matched answers by slot
alone from a correct one."""
from pxtest import free_port, pb, publish, wait_for
from sppeer import RawRep


def test_answer_to_a_timed_out_delivery_is_not_taken_for_its_redelivery(env):
    """max_inflight 1, so every delivery uses slot 0. Delivery 1 is not
    answered and times out; delivery 2 of the same entry takes the slot with
    the next request id. An ACK to delivery 1's id then arrives: it is
    ignored, the entry stays pending and not done. Only the ACK to delivery
    2 finishes it."""
    r = env.r
    port = free_port()
    stream = {"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
              "key": "#event.eventId", "retry_backoff_ms": 50}
    p = env.proxy([stream], endpoint=f"tcp://127.0.0.1:{port}", max_inflight=1, ack_timeout_ms=1000)
    peer = RawRep(port)
    try:
        publish(r, "room", [{"eventId": "e1"}])
        rid1, body = peer.recv()
        assert pb.Delivery.FromString(body).attempt == 1
        rid2, body = peer.recv()                        # after the ack timeout and the backoff
        assert pb.Delivery.FromString(body).attempt == 2
        assert rid2 != rid1
        peer.send(rid1)                                 # ACK (08 01) to the first delivery
        ignored = "reply to no delivery in flight (late or unknown)"
        wait_for(lambda: ignored in p.log_text() or (r.get("idem:e1") or "")[:1] == "D", 10, "the late ACK read")
        assert (r.get("idem:e1") or "")[:1] != "D", "the entry done by the answer to its timed-out delivery"
        assert r.xpending("room", "g")["pending"] == 1
        peer.send(rid2)
        wait_for(lambda: (r.get("idem:e1") or "")[:1] == "D" and r.xpending("room", "g")["pending"] == 0, 10,
                 "done and acked by the answer to delivery 2")
    finally:
        peer.close()
