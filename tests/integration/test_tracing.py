"""docs/configuration.md `tracing`, docs/operations.md: idemproxy's spans,
exported over OTLP/HTTP (OTLP JSON)
to a real receiver in the test, and the trace context it hands the worker in
Delivery.traceparent. A collector that is down or failing costs counted drops,
never an entry."""
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from pxtest import BIN, free_port, pb, pending, publish, settled, wait_for

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"


class Collector:
    """An OTLP/HTTP receiver: POST /v1/traces, OTLP JSON. Each body is checked
    against opentelemetry-proto's ExportTraceServiceRequest (an unknown or
    misspelt field name fails the parse); the spans are kept as JSON, whose ids
    are hex as the OTLP JSON encoding says. status=500 answers every POST so."""

    def __init__(self, status=200, delay=0.0):
        self.status, self.delay = status, delay
        self.bodies, self.errors, self.posts = [], [], 0
        self.lock = threading.Lock()
        col = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with col.lock:
                    col.posts += 1
                    try:
                        assert self.path == "/v1/traces", self.path
                        assert self.headers.get("Content-Type") == "application/json"
                        json_format.Parse(body, trace_service_pb2.ExportTraceServiceRequest())
                        if col.status == 200:
                            col.bodies.append(json.loads(body))
                    except Exception as e:  # noqa: BLE001 (reported by the test)
                        col.errors.append(repr(e))
                time.sleep(col.delay)          # a slow collector: idemproxy gives up first
                self.send_response(col.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def spans(self):
        """Every span received: (resource attributes, span), resource as a dict."""
        out = []
        with self.lock:
            assert not self.errors, self.errors
            for b in self.bodies:
                for rs in b["resourceSpans"]:
                    res = attrs(rs["resource"])
                    for ss in rs["scopeSpans"]:
                        out += [(res, s) for s in ss["spans"]]
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def attrs(o):
    return {a["key"]: next(iter(a["value"].values())) for a in o.get("attributes", [])}


def conf(**kw):
    s = {"stream": "orders", "group": "g", "consumer": "c1", "payload_field": "payload",
         "key": "#event.id"}
    s.update(kw)
    return s


def test_a_producer_trace_reaches_the_worker_through_idemproxys_spans(env):
    col = Collector()
    try:
        ep = env.endpoint()
        w = env.worker(ep)
        p = env.proxy([conf()], endpoint=ep, tracing={"otlp_endpoint": col.url, "service_name": "px-test"})
        env.r.xadd("orders", {"payload": json.dumps({"id": "o-1"}), "traceparent": TRACEPARENT,
                              "tracestate": "vendor=abc"})
        wait_for(lambda: len(w.got) == 1 and settled(p, "orders", 1), 20, "delivered and acked")
        d = w.got[0]
        wait_for(lambda: len(col.spans()) >= 2, 15, "the entry and delivery spans exported")
        spans = col.spans()
        entry = [s for _, s in spans if s["kind"] == 5]
        sends = [s for _, s in spans if s["kind"] == 4]
        assert len(entry) == 1 and len(sends) == 1, spans
        entry, send = entry[0], sends[0]
        # The chain: producer span -> entry span (process) -> delivery span (send) -> worker.
        assert entry["traceId"] == PRODUCER_TRACE and entry["parentSpanId"] == PRODUCER_SPAN
        assert send["traceId"] == PRODUCER_TRACE and send["parentSpanId"] == entry["spanId"]
        assert d.traceparent == f"00-{PRODUCER_TRACE}-{send['spanId']}-01"
        assert d.tracestate == "vendor=abc"
        assert entry["spanId"] != send["spanId"] != PRODUCER_SPAN
        assert entry["name"] == "process orders" and send["name"] == "send orders"
        ea = attrs(entry)
        assert ea["messaging.system"] == "redis_streams"
        assert ea["messaging.operation.type"] == "process"
        assert ea["messaging.destination.name"] == "orders"
        assert ea["messaging.message.id"] == d.entry_id
        assert ea["messaging.consumer.group.name"] == "g"
        assert ea["idemproxy.outcome"] == "acked" and ea["idemproxy.key"] == "o-1"
        sa = attrs(send)
        assert sa["idemproxy.attempt"] == "1" and sa["idemproxy.answer"] == "ack"
        assert int(entry["startTimeUnixNano"]) <= int(send["startTimeUnixNano"]) \
            <= int(send["endTimeUnixNano"]) <= int(entry["endTimeUnixNano"])
        res = spans[0][0]
        assert res["service.name"] == "px-test" and res["service.instance.id"] == "c1"
        assert res["service.version"]
        # Counted once idemproxy has read the collector's answer (after the test saw the body).
        wait_for(lambda: p.metrics()["idemproxy_spans_exported_total"] >= 2, 10, "spans counted")
        assert p.metrics()["idemproxy_spans_dropped_total"] == 0
    finally:
        col.close()


def test_roots_retries_and_a_duplicate_linked_to_the_delivery_that_did_the_work(env):
    col = Collector()
    try:
        ep = env.endpoint()
        tries = {}

        def behave(d):   # the first delivery of each key is retried
            tries[d.key] = tries.get(d.key, 0) + 1
            return (pb.Ack.RETRY, "later") if tries[d.key] == 1 else (pb.Ack.ACK, "")

        w = env.worker(ep, behave=behave)
        p = env.proxy([conf(retry_backoff_ms=10)], endpoint=ep, tracing={"otlp_endpoint": col.url})
        env.r.xadd("orders", {"payload": json.dumps({"id": "a"}), "traceparent": "00-zz-bad"})
        wait_for(lambda: settled(p, "orders", 1), 20, "first acked")
        env.r.xadd("orders", {"payload": json.dumps({"id": "a"})})     # a copy, after the work
        wait_for(lambda: settled(p, "orders", 2), 20, "copy skipped")
        wait_for(lambda: len(col.spans()) >= 4, 15, "spans exported")
        spans = [s for _, s in col.spans()]
        entries = [s for s in spans if s["kind"] == 5]
        sends = sorted((s for s in spans if s["kind"] == 4), key=lambda s: s["startTimeUnixNano"])
        assert len(entries) == 2 and len(sends) == 2, spans
        first = next(s for s in entries if attrs(s)["idemproxy.outcome"] == "acked")
        dup = next(s for s in entries if attrs(s)["idemproxy.outcome"] == "duplicate")
        # A malformed traceparent: a new root, counted.
        assert "parentSpanId" not in first and first["traceId"] != PRODUCER_TRACE
        assert p.metrics()["idemproxy_traceparents_invalid_total"] == 1
        assert [attrs(s)["idemproxy.attempt"] for s in sends] == ["1", "2"]
        assert [attrs(s)["idemproxy.answer"] for s in sends] == ["retry", "ack"]
        assert all(s["parentSpanId"] == first["spanId"] for s in sends)
        assert [d.traceparent.split("-")[2] for d in w.got] == [s["spanId"] for s in sends]
        # The copy: its own trace, a link to the delivery that did the work.
        assert "parentSpanId" not in dup and dup["traceId"] != first["traceId"]
        assert dup["links"] == [{"traceId": first["traceId"], "spanId": sends[1]["spanId"]}]
    finally:
        col.close()


def test_an_unsampled_trace_is_not_exported_but_still_propagated(env):
    col = Collector()
    try:
        ep = env.endpoint()
        w = env.worker(ep)
        p = env.proxy([conf()], endpoint=ep, tracing={"otlp_endpoint": col.url, "sample_ratio": 0})
        unsampled = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-00"
        env.r.xadd("orders", {"payload": json.dumps({"id": "u1"}), "traceparent": unsampled})
        env.r.xadd("orders", {"payload": json.dumps({"id": "u2"})})      # a root, ratio 0
        env.r.xadd("orders", {"payload": json.dumps({"id": "s3"}), "traceparent": TRACEPARENT})
        wait_for(lambda: settled(p, "orders", 3), 20, "acked")
        wait_for(lambda: len(col.spans()) >= 2, 15, "the sampled trace exported")
        by_key = {d.key: d for d in w.got}
        tp = by_key["u1"].traceparent.split("-")
        assert tp[1] == PRODUCER_TRACE and tp[3] == "00" and tp[2] != PRODUCER_SPAN
        assert by_key["u2"].traceparent.endswith("-00")
        assert by_key["s3"].traceparent.startswith(f"00-{PRODUCER_TRACE}-")
        assert by_key["s3"].traceparent.endswith("-01")
        # Only the sampled parent's trace is exported, whatever sample_ratio says.
        assert {s["traceId"] for _, s in col.spans()} == {PRODUCER_TRACE}
        assert len(col.spans()) == 2
    finally:
        col.close()


def test_tracing_off_passes_the_entrys_own_traceparent(env):
    ep = env.endpoint()
    w = env.worker(ep)
    env.proxy([conf()], endpoint=ep)
    env.r.xadd("orders", {"payload": json.dumps({"id": "x"}), "traceparent": TRACEPARENT,
                          "tracestate": "k=v"})
    env.r.xadd("orders", {"payload": json.dumps({"id": "y"}), "traceparent": "not-a-traceparent",
                          "tracestate": "k=v"})
    wait_for(lambda: len(w.got) == 2, 20, "delivered")
    by_key = {d.key: d for d in w.got}
    assert (by_key["x"].traceparent, by_key["x"].tracestate) == (TRACEPARENT, "k=v")
    assert (by_key["y"].traceparent, by_key["y"].tracestate) == ("", "")


def _run_against(env, col_url, n):
    ep = env.endpoint()
    w = env.worker(ep)
    p = env.proxy([conf()], endpoint=ep, tracing={"otlp_endpoint": col_url})
    publish(env.r, "orders", [{"id": f"e{i}"} for i in range(n)])
    wait_for(lambda: settled(p, "orders", n), 60, "every entry acked")
    assert sorted(w.keys()) == sorted(f"e{i}" for i in range(n))
    assert pending(env.r, "orders", "g") == 0
    assert p.metrics()['idemproxy_outcomes_total{stream="orders",group="g",outcome="acked"}'] == n
    return p


def test_a_collector_that_is_down_costs_only_counted_drops(env):
    n = 3000
    p = _run_against(env, f"http://127.0.0.1:{free_port()}", n)
    # 2 spans an entry; each is dropped (the POST refused, or the queue full), none exported.
    wait_for(lambda: p.metrics()["idemproxy_spans_dropped_total"] >= 2 * n - 4096, 15, "drops counted")
    m = p.metrics()
    assert m["idemproxy_spans_exported_total"] == 0
    assert m["idemproxy_spans_dropped_total"] <= 2 * n


def test_a_collector_answering_500_costs_only_counted_drops(env):
    col = Collector(status=500)
    try:
        n = 2000
        p = _run_against(env, col.url, n)
        wait_for(lambda: col.posts >= 1 and p.metrics()["idemproxy_spans_dropped_total"] >= 2 * n - 4096,
                 15, "drops counted")
        assert p.metrics()["idemproxy_spans_exported_total"] == 0
        assert not col.errors, col.errors
    finally:
        col.close()


def test_a_collector_that_never_answers_costs_only_counted_drops(env):
    col = Collector(delay=60)
    try:
        n = 3000
        t0 = time.time()
        p = _run_against(env, col.url, n)
        # Acked while the first POST still hangs: nothing waited for the collector.
        assert time.time() - t0 < 30
        # 4,096 spans at most wait; the rest are dropped at once, then each hung POST
        # after its 5 s.
        m = p.metrics()
        assert m["idemproxy_spans_dropped_total"] >= 2 * n - 4096
        assert m["idemproxy_spans_exported_total"] == 0
        wait_for(lambda: p.metrics()["idemproxy_spans_dropped_total"] >= 2 * n - 4096 + 512, 20,
                 "the hung POST dropped after its timeout")
        # the next batch is POSTed after the first one is given up: it arrives a moment later
        wait_for(lambda: col.posts >= 2, 10, "a second POST after the first timed out")
    finally:
        col.close()


def test_an_entry_released_at_shutdown_ends_its_span_without_a_delivery(env):
    col = Collector()
    try:
        p = env.proxy([conf()], tracing={"otlp_endpoint": col.url})    # no worker: never sent
        env.r.xadd("orders", {"payload": json.dumps({"id": "r1"}), "traceparent": TRACEPARENT})
        wait_for(lambda: p.metrics().get('idemproxy_entries_read_total{stream="orders",group="g"}') == 1,
                 20, "read")
        assert p.stop() == 0
        spans = [s for _, s in col.spans()]      # sent at shutdown
        assert len(spans) == 1 and spans[0]["kind"] == 5, spans
        assert attrs(spans[0])["idemproxy.outcome"] == "released"
        assert spans[0]["parentSpanId"] == PRODUCER_SPAN
        assert pending(env.r, "orders", "g") == 1    # left for another replica, as before
    finally:
        col.close()


def test_memory_stays_flat_while_the_collector_is_down(env):
    """Every span dropped: the queue stays bounded, so 90,000 more entries after the
    first 10,000 (the queue full long before) add no memory: 100,000 in all, as
    issue 32 asks."""
    ep = env.endpoint()
    env.worker(ep)
    proc_env = {}
    # memcheck runs a wrapper script around build-asan/idemproxy: ldd sees no libasan there
    asan = "asan" in str(BIN) or "libasan" in subprocess.run(["ldd", str(BIN)], capture_output=True,
                                                             text=True).stdout
    if asan:
        # ASan's quarantine keeps freed memory for a while: RSS would grow with any allocation.
        proc_env["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                                    ":quarantine_size_mb=0:thread_local_quarantine_size_kb=0").lstrip(":")
    p = env.proxy([conf()], endpoint=ep, tracing={"otlp_endpoint": f"http://127.0.0.1:{free_port()}"},
                  log_level="info", proc_env=proc_env)

    def rss_after(total, batch):
        publish(env.r, "orders", [{"id": f"m{total - batch + i}"} for i in range(batch)])
        wait_for(lambda: settled(p, "orders", total), 120, f"{total} entries acked")
        return p.metrics()["process_resident_memory_bytes"]

    first = rss_after(10000, 10000)
    last = rss_after(100000, 90000)
    assert p.metrics()["idemproxy_spans_dropped_total"] >= 2 * 100000 - 4096
    if asan:   # ASan's allocator caches what it frees: its RSS says nothing of the queue (memcheck)
        return
    assert last - first < 2 * 1024 * 1024, (first, last)


def test_a_key_of_any_characters_is_exported_as_valid_json(env):
    col = Collector()
    try:
        ep = env.endpoint()
        env.worker(ep)
        p = env.proxy([conf()], endpoint=ep, tracing={"otlp_endpoint": col.url})
        keys = ['q"uote', 'back\\slash', 'tab\tbed', '\u00e9\u4e2d\U0001F600', '\u0001ctl', "plain"]
        for k in keys:      # one character class each: no key escapes for another
            env.r.xadd("orders", {"payload": json.dumps({"id": k})})
        wait_for(lambda: settled(p, "orders", len(keys)), 20, "acked")
        wait_for(lambda: len(col.spans()) >= 2 * len(keys), 15, "spans exported")   # each body parsed
        assert {attrs(s)["idemproxy.key"] for _, s in col.spans()} == set(keys)
    finally:
        col.close()


def test_spans_that_trickle_in_share_a_post(env):
    """A partial batch waits up to a second for more spans: entries 100 ms apart
    share their POSTs (each span in a POST of its own cost 20x the CPU at
    sample_ratio 0.01 in make bench)."""
    col = Collector()
    try:
        ep = env.endpoint()
        env.worker(ep)
        p = env.proxy([conf()], endpoint=ep, tracing={"otlp_endpoint": col.url})
        n = 25
        for i in range(n):
            env.r.xadd("orders", {"payload": json.dumps({"id": f"t{i}"})})
            time.sleep(0.1)
        wait_for(lambda: settled(p, "orders", n), 20, "acked")
        wait_for(lambda: len(col.spans()) == 2 * n, 15, "spans exported")
        assert col.posts <= 5, col.posts      # about one a second
    finally:
        col.close()
