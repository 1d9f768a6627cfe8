"""The client over a real socket pair: a pynng REQ socket stands in for idemproxy."""
import shutil
import tempfile
import threading
import time

import pynng
import pytest

from idemproxy_worker import Delivery, Drop, Retry, Worker, idemproxy_pb2 as pb


@pytest.fixture
def url():
    d = tempfile.mkdtemp(prefix="pxw", dir="/tmp")  # ipc paths must stay short
    yield f"ipc://{d}/px.sock"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def serve(url):
    """serve(handler, concurrency) starts a worker on 'url' in a thread."""
    started = []

    def start(handler, concurrency=1):
        w = Worker(url, handler, concurrency=concurrency)
        t = threading.Thread(target=w.run, kwargs={"handle_signals": False}, daemon=True)
        t.start()
        started.append((w, t))
        return w, t

    yield start
    for w, t in started:
        w.stop()
        t.join(5)


def delivery(key="k1", **kw):
    m = pb.Delivery(stream="room", entry_id="1700000000000-0", key=key, attempt=1, **kw)
    return m.SerializeToString()


def ask(req, data):
    req.send(data)
    return pb.Ack.FromString(req.recv())


def test_ack_echoes_ids_and_delivery_is_typed(url, serve):
    got = []
    serve(got.append)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, delivery(
            "k1", payload=b'{"eventId": "k1"}', fencing_token=2**64 - 1, deadline_unix_ms=4102444800000,
            fields=[pb.Field(name="z", value=b"1"), pb.Field(name="a", value=b"\xff")]))
    assert (ack.status, ack.reason, ack.stream, ack.entry_id) == \
        (pb.Ack.ACK, "", "room", "1700000000000-0")
    assert got == [Delivery(stream="room", entry_id="1700000000000-0", key="k1",
                            fields={"z": b"1", "a": b"\xff"}, payload=b'{"eventId": "k1"}',
                            attempt=1, fencing_token=2**64 - 1, deadline_unix_ms=4102444800000)]
    assert list(got[0].fields) == ["z", "a"]          # stream order
    assert got[0].json() == {"eventId": "k1"}


class Oops(Exception):
    pass


@pytest.mark.parametrize("exc, status, reason", [
    (ValueError("db down"), pb.Ack.RETRY, "db down"),
    (Oops(), pb.Ack.RETRY, "Oops"),                    # no text: the exception's name
    (Retry("later"), pb.Ack.RETRY, "later"),
    (Drop("bad event"), pb.Ack.DROP, "bad event"),
])
def test_exceptions_map_to_answers(url, serve, exc, status, reason):
    def handler(d):
        raise exc
    serve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, delivery())
    assert (ack.status, ack.reason, ack.stream, ack.entry_id) == \
        (status, reason, "room", "1700000000000-0")


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x01\xff"],  # truncated; bad UTF-8
                         ids=["truncated", "bad-utf8"])
def test_undecodable_delivery_is_retried_without_the_handler(url, serve, data):
    got = []
    serve(got.append)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, data)
        assert ack.status == pb.Ack.RETRY and ack.reason.startswith("undecodable delivery")
        assert ask(req, delivery("next")).status == pb.Ack.ACK   # the worker goes on
    assert [d.key for d in got] == ["next"]


def test_concurrent_handlers_overlap(url, serve):
    spans = {}

    def handler(d):
        start = time.monotonic()
        time.sleep(0.5)
        spans[d.key] = (start, time.monotonic())
    serve(handler, concurrency=2)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        acks = []

        def one(key):
            with req.new_context() as ctx:
                ctx.send(delivery(key))
                acks.append(pb.Ack.FromString(ctx.recv()))
        ts = [threading.Thread(target=one, args=(k,)) for k in ("slow-1", "slow-2")]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert [a.status for a in acks] == [pb.Ack.ACK, pb.Ack.ACK]
    (a0, a1), (b0, b1) = spans["slow-1"], spans["slow-2"]
    assert a0 < b1 and b0 < a1, spans


def test_dials_before_idemproxy_binds_and_stops_promptly(url, serve):
    w, t = serve(lambda d: None)
    time.sleep(0.5)                                    # nobody listening yet
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        assert ask(req, delivery()).status == pb.Ack.ACK
    begin = time.monotonic()
    w.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - begin < 1


def test_bad_endpoint_and_missing_handler():
    with pytest.raises(ValueError):
        Worker("nope://x", lambda d: None).run(handle_signals=False)
    with pytest.raises(RuntimeError):
        Worker("ipc:///tmp/x.sock").run(handle_signals=False)


# --- AsyncWorker: coroutine handlers on pynng's async API ---------------------

@pytest.fixture
def aserve(url):
    """aserve(handler, concurrency) runs an AsyncWorker on 'url' in its own event loop thread."""
    import asyncio
    from idemproxy_worker import AsyncWorker
    started = []

    def start(handler, concurrency=1):
        w = AsyncWorker(url, handler, concurrency=concurrency)
        t = threading.Thread(target=lambda: asyncio.run(w.run(handle_signals=False)), daemon=True)
        t.start()
        started.append((w, t))
        return w, t

    yield start
    for w, t in started:
        w.stop()
        t.join(5)


def test_async_answers_and_a_failure_goes_to_the_logger(url, aserve, caplog):
    import asyncio
    got = []

    async def handler(d):
        await asyncio.sleep(0.01)
        got.append(d.key)
        if d.key == "bad":
            raise ValueError("db down")
        if d.key == "poison":
            raise Drop("cannot parse")
    caplog.set_level("INFO", logger="idemproxy_worker")
    aserve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        acks = {k: ask(req, delivery(k)) for k in ("good", "bad", "poison")}
    assert [(acks[k].status, acks[k].reason, acks[k].entry_id) for k in ("good", "bad", "poison")] == \
        [(pb.Ack.ACK, "", "1700000000000-0"), (pb.Ack.RETRY, "db down", "1700000000000-0"),
         (pb.Ack.DROP, "cannot parse", "1700000000000-0")]
    assert got == ["good", "bad", "poison"]
    failed = [r for r in caplog.records if r.name == "idemproxy_worker" and r.levelname == "WARNING"]
    assert len(failed) == 1 and "key=bad" in failed[0].getMessage() and "db down" in failed[0].getMessage()
    assert failed[0].exc_info and failed[0].exc_info[0] is ValueError   # with its traceback


def test_async_concurrent_handlers_overlap_and_stop_promptly(url, aserve):
    import asyncio
    spans = {}

    async def handler(d):
        start = time.monotonic()
        await asyncio.sleep(0.5)
        spans[d.key] = (start, time.monotonic())
    w, t = aserve(handler, concurrency=2)
    time.sleep(0.3)                                    # dials before anyone listens
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        acks = []

        def one(key):
            with req.new_context() as ctx:
                ctx.send(delivery(key))
                acks.append(pb.Ack.FromString(ctx.recv()))
        ts = [threading.Thread(target=one, args=(k,)) for k in ("slow-1", "slow-2")]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        assert [a.status for a in acks] == [pb.Ack.ACK, pb.Ack.ACK]
        (a0, a1), (b0, b1) = spans["slow-1"], spans["slow-2"]
        assert a0 < b1 and b0 < a1, spans
        begin = time.monotonic()
        w.stop()
        t.join(5)
        assert not t.is_alive() and time.monotonic() - begin < 1


def test_async_undecodable_delivery_is_retried_without_the_handler(url, aserve):
    got = []

    async def handler(d):
        got.append(d.key)
    aserve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        ack = ask(req, b"\x0a\x01\xff")
        assert ack.status == pb.Ack.RETRY and ack.reason.startswith("undecodable delivery")
        assert ask(req, delivery("next")).status == pb.Ack.ACK
    assert got == ["next"]


def test_async_stop_finishes_and_answers_the_delivery_in_hand(url, aserve):
    import asyncio
    started = threading.Event()

    async def handler(d):
        started.set()
        await asyncio.sleep(0.5)
    w, t = aserve(handler)
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        req.send(delivery("in-hand"))
        assert started.wait(5)
        w.stop()                                       # while the handler runs
        ack = pb.Ack.FromString(req.recv())
        assert (ack.status, ack.entry_id) == (pb.Ack.ACK, "1700000000000-0")
        t.join(5)
        assert not t.is_alive()


def test_a_worker_without_a_connection_says_it_is_still_dialing(url, serve, monkeypatch, caplog):
    """Issue 33: a typo in the socket path made a worker dial in silence for ever."""
    monkeypatch.setenv("IDEMPROXY_DIAL_LOG_MS", "300")
    caplog.set_level("WARNING", logger="idemproxy_worker")
    serve(lambda d: None)
    dialing = lambda: [r.getMessage() for r in caplog.records if "still dialing" in r.getMessage()]
    deadline = time.time() + 10
    while len(dialing()) < 2 and time.time() < deadline:   # the first, and one 6 x 300 ms later
        time.sleep(0.05)
    assert len(dialing()) >= 2, dialing()
    assert dialing()[0].startswith(f"still dialing {url}: no connection to idemproxy for "), dialing()
    with pynng.Req0(listen=url, recv_timeout=5000) as req:
        assert ask(req, delivery()).status == pb.Ack.ACK     # connected: quiet from now on
        n = len(dialing())
        time.sleep(2.5)
        assert len(dialing()) == n


@pytest.mark.parametrize("endpoint", ["/tmp/px.sock", "px.sock", "unix:///tmp/px.sock"])
def test_an_endpoint_without_a_transport_says_what_one_looks_like(endpoint):
    w = Worker(endpoint, lambda d: None)
    with pytest.raises(ValueError, match=r"expected ipc:///path/to/socket or tcp://host:port"):
        w.run(handle_signals=False)


def test_delivery_names_the_lock_its_fencing_token_is_for():
    m = pb.Delivery(stream="room", entry_id="1-0", key="k1", fencing_token=7, lock="room-1")
    d = Delivery.decode(m.SerializeToString())
    assert (d.fencing_token, d.lock) == (7, "room-1")
    assert Delivery.decode(pb.Delivery(key="k1").SerializeToString()).lock == ""   # fencing off
