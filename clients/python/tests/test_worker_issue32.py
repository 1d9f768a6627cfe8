"""Issue 32: protocol 1.1 (trace context, retry-after), deadlines, what a
handler may raise, and an idle worker's cost; the same real socket pair as
test_worker.py."""
import threading
import time
from datetime import timedelta

import pynng
import pytest

from idemproxy_worker import Retry, Worker, idemproxy_pb2 as pb
from test_worker import aserve, ask, delivery, serve, url  # noqa: F401 (fixtures)


def test_delivery_carries_trace_context_and_remaining(url, serve):
    got = []
    serve(got.append)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        deadline = int(time.time() * 1000) + 10000
        assert ask(req, delivery("traced", traceparent=tp, tracestate="congo=t61",
                                 deadline_unix_ms=deadline)).status == pb.Ack.ACK
        assert ask(req, delivery("plain")).status == pb.Ack.ACK
    traced, plain = got
    assert (traced.traceparent, traced.tracestate) == (tp, "congo=t61")
    assert (plain.traceparent, plain.tracestate) == ("", "")
    assert 8 < traced.remaining() <= 10
    assert plain.remaining() == float("inf")          # deadline 0: none


@pytest.mark.parametrize("after, ms", [(timedelta(seconds=30), 30000), (1.5, 1500),
                                       (timedelta(microseconds=1), 1), (None, 0),
                                       (timedelta(hours=1), 3600000),
                                       (timedelta(days=1), 3600000)])   # capped, as the others do
def test_retry_after_is_sent_as_retry_after_ms(url, serve, after, ms):
    def handler(d):
        raise Retry("rate limited", after=after)
    serve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        req.send(delivery())
        raw = req.recv()
    ack = pb.Ack.FromString(raw)
    assert (ack.status, ack.reason, ack.retry_after_ms) == (pb.Ack.RETRY, "rate limited", ms)
    assert (b"\x28" in raw) == (ms > 0)               # field 5, varint: on the wire only when set


def test_system_exit_in_a_handler_is_answered_then_stops_the_worker(url, caplog):
    """sys.exit() in a handler means what it means anywhere in Python: the
    program ends, with that code. The delivery is answered RETRY, the others in
    hand are finished and answered, and run() raises the SystemExit."""
    started = threading.Event()

    def handler(d):
        if d.key == "exit":
            assert started.wait(5)
            raise SystemExit(3)
        started.set()
        time.sleep(0.5)
    caplog.set_level("INFO", logger="idemproxy_worker")
    w = Worker(url, handler, concurrency=2)
    raised = []

    def run():
        try:
            w.run(handle_signals=False)
        except BaseException as exc:
            raised.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        acks = {}

        def one(key):
            with req.new_context() as ctx:
                ctx.send(delivery(key))
                acks[key] = pb.Ack.FromString(ctx.recv())
        ts = [threading.Thread(target=one, args=(k,)) for k in ("slow", "exit")]
        for th in ts:
            th.start()
        for th in ts:
            th.join(10)
        t.join(5)
    assert (acks["exit"].status, acks["slow"].status) == (pb.Ack.RETRY, pb.Ack.ACK), acks
    assert "SystemExit" in acks["exit"].reason
    assert not t.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], SystemExit) and raised[0].code == 3
    assert any(r.levelname == "ERROR" and "key=exit" in r.getMessage() for r in caplog.records)


def test_idle_worker_costs_no_cpu(url):
    """256 idle handler threads block on NNG, they do not poll: a few seconds
    of no traffic cost next to no CPU time (polling cost 16-33 % of a core)."""
    w = Worker(url, lambda d: None, concurrency=256)
    t = threading.Thread(target=w.run, kwargs={"handle_signals": False}, daemon=True)
    t.start()
    try:
        with pynng.Req0(listen=url, recv_timeout=5000) as req:
            assert ask(req, delivery()).status == pb.Ack.ACK   # all up and connected
            time.sleep(0.5)
            cpu0, wall0 = time.process_time(), time.monotonic()
            time.sleep(3)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            assert cpu < 0.05 * wall, f"{cpu:.2f} s of CPU in {wall:.1f} s idle"
            assert ask(req, delivery("after")).status == pb.Ack.ACK
    finally:
        begin = time.monotonic()
        w.stop()
        t.join(5)
    assert not t.is_alive() and time.monotonic() - begin < 1


def test_a_sync_handler_past_its_deadline_is_logged(url, serve, caplog):
    caplog.set_level("INFO", logger="idemproxy_worker")
    serve(lambda d: time.sleep(1.3))
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, delivery("late", deadline_unix_ms=int(time.time() * 1000) + 1000))
    assert ack.status == pb.Ack.ACK                   # sent; idemproxy ignores it, it is late
    assert any(r.levelname == "WARNING" and "past its deadline" in r.getMessage() and "key=late"
               in r.getMessage() for r in caplog.records)


def test_async_cancelled_handler_is_retried_and_the_others_go_on(url, aserve):
    import asyncio

    async def handler(d):
        if d.key == "cancel":
            raise asyncio.CancelledError()
        await asyncio.sleep(0.5)
    w, t = aserve(handler, concurrency=2)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        acks = {}

        def one(key):
            with req.new_context() as ctx:
                ctx.send(delivery(key))
                acks[key] = pb.Ack.FromString(ctx.recv())
        ts = [threading.Thread(target=one, args=(k,)) for k in ("slow", "cancel")]
        for th in ts:
            th.start()
            time.sleep(0.1)
        for th in ts:
            th.join(10)
        assert (acks["cancel"].status, acks["slow"].status) == (pb.Ack.RETRY, pb.Ack.ACK), acks
        assert ask(req, delivery("next")).status == pb.Ack.ACK      # the worker goes on
        assert t.is_alive()


def test_async_handler_is_cancelled_at_its_deadline(url, aserve):
    import asyncio
    seen = []

    async def handler(d):
        if d.key == "warm":
            return
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append(d.remaining())
            raise
    aserve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        # The worker dials from its own thread: once this is answered it is connected,
        # so the deadline below runs out while the handler runs, not before it starts.
        assert ask(req, delivery("warm")).status == pb.Ack.ACK
        t0 = time.monotonic()
        ack = ask(req, delivery("late", deadline_unix_ms=int(time.time() * 1000) + 1000))
        took = time.monotonic() - t0
    assert ack.status == pb.Ack.RETRY and ack.reason == "deadline passed while the handler ran", ack
    # asyncio's timer may fire a clock tick before the wall-clock deadline
    assert took < 3 and len(seen) == 1 and seen[0] < 0.05, seen


def test_async_retry_after_and_trace_context(url, aserve):
    got = []

    async def handler(d):
        got.append(d.traceparent)
        raise Retry("later", after=timedelta(seconds=2))
    aserve(handler)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, delivery(traceparent=tp))
    assert (ack.status, ack.retry_after_ms) == (pb.Ack.RETRY, 2000) and got == [tp]


@pytest.fixture(scope="module")
def spans():
    """An in-memory OpenTelemetry SDK as the global tracer provider."""
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_handler_runs_in_a_child_span_of_the_delivery(url, serve, aserve, spans, kind):
    from opentelemetry import trace
    seen = []

    def look(d):
        seen.append(trace.get_current_span().get_span_context())

    async def alook(d):
        look(d)
    spans.clear()
    (serve(look) if kind == "sync" else aserve(alook))
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, delivery("traced", traceparent=f"00-{trace_id}-{parent_id}-01",
                                tracestate="congo=t61"))
    assert ack.status == pb.Ack.ACK
    (span,) = [s for s in spans.get_finished_spans() if s.attributes.get("idemproxy.key") == "traced"]
    assert format(span.context.trace_id, "032x") == trace_id
    assert format(span.parent.span_id, "016x") == parent_id and span.parent.is_remote
    assert span.kind == trace.SpanKind.CONSUMER
    assert span.attributes["messaging.destination.name"] == "room"
    assert span.attributes["messaging.message.id"] == "1700000000000-0"
    assert seen[0].span_id == span.context.span_id   # the handler ran inside it
    assert span.context.trace_state.get("congo") == "t61"


def test_async_handler_that_is_not_a_coroutine_is_retried(url, aserve):
    """A plain function given to AsyncWorker, whether it returns or raises, is
    a failing handler like any other: RETRY, and the worker goes on."""
    def handler(d):
        if d.key == "raises":
            raise ValueError("no")
    aserve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        for key in ("returns-none", "raises"):
            ack = ask(req, delivery(key))
            assert ack.status == pb.Ack.RETRY and ack.reason, (key, ack)
