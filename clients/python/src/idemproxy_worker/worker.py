"""idemproxy_worker.worker - the Python client for idemproxy workers.

idemproxy reads Redis Streams, lets each logical event through once and hands
it to the application: it binds an endpoint with a raw SP REQ socket and sends
one protobuf ``idemproxy.v1.Delivery`` per stream entry. A worker connects an
SP REP socket (pynng's ``Rep0``: NNG speaks the same SP protocols as nanomsg)
and answers every delivery with an ``Ack``:

    from idemproxy_worker import Delivery, Drop, Worker

    worker = Worker("ipc:///tmp/idemproxy.sock", concurrency=4)

    @worker.handler
    def handle(d: Delivery) -> None:
        event = d.json()
        if "roomId" not in event:
            raise Drop("no roomId")   # DROP: dead-lettered with this reason, never again
        save(event, d.fencing_token)  # any exception: RETRY later, str(exc) as the reason
                                      # returning normally: ACK, the key is marked done
    worker.run()                      # until SIGTERM/SIGINT or worker.stop()

Concurrency: one socket with ``concurrency`` NNG contexts, each an independent
REP state machine served by its own thread, so up to that many handlers run at
once (a plain REP socket holds one request at a time). Handlers must therefore
be thread-safe; threads suit I/O-bound work, the usual kind for a worker.
With asyncio, ``AsyncWorker`` does the same for coroutine handlers on pynng's
async API: one task per context, all on the event loop, no threads.

Every delivery is answered exactly once and the Ack echoes its stream and entry
id; a delivery that does not decode (a string that is not UTF-8, a known field
with the wrong wire type) is answered RETRY without calling the handler. The
socket keeps dialing in the background, so a worker may start before idemproxy
and survives its restarts (without a connection for 5 s, it logs that it is still
dialing and where, then every 30 s: IDEMPROXY_DIAL_LOG_MS sets the first wait); a peer that sends no SP header within 10 s (NNG's
handshake timeout) is hung up on. Deliveries of up to ``max_entry_bytes``
(idemproxy's app.max_entry_bytes, 1 MiB by default) are received.

``d.deadline_unix_ms`` is the delivery's ack deadline: an answer after it is
ignored and the entry is delivered again. idemproxy paces deliveries per
worker, so the ack timer measures the handler's own work, not a queue in front
of it. A delivery that arrives already past its deadline is answered RETRY
without calling the handler. ``d.fencing_token`` lets the application's
database refuse stale work. The library never prints: it logs through the
"idemproxy_worker" logger (a handler's exception at WARNING with its traceback).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, TypeVar

import pynng

from google.protobuf.unknown_fields import UnknownFieldSet

from . import idemproxy_pb2 as pb

DEFAULT_ENDPOINT = "ipc:///tmp/idemproxy.sock"
POLL_S = 0.2     # how often an idle handler thread looks whether stop() was called
LINGER_S = 0.1   # time given to the last answer to leave before the socket closes
DEFAULT_MAX_ENTRY_BYTES = 1 << 20   # idemproxy's default app.max_entry_bytes
SP_HEADER_BYTES = 32  # room for the SP header in front of a Delivery (8 backtrace words)
STALE = "deadline passed before the handler ran"

log = logging.getLogger("idemproxy_worker")

DIAL_LOG_ENV = "IDEMPROXY_DIAL_LOG_MS"  # the first "still dialing" after this long (ms)
DIAL_LOG_MS = 5000                      # ... by default; then every 6 times as long (30 s)
ENDPOINT_FORMS = "ipc:///path/to/socket or tcp://host:port (idemproxy's app.endpoint)"


def _check_endpoint(endpoint: str) -> None:
    """Refuses an endpoint without a transport NNG and idemproxy share."""
    if not endpoint.startswith(("ipc://", "tcp://")):
        raise ValueError(f"bad endpoint {endpoint!r}: expected {ENDPOINT_FORMS}")


def _dial(sock: Any, endpoint: str) -> None:
    _check_endpoint(endpoint)
    try:  # non-blocking: NNG redials in the background until idemproxy binds
        sock.dial(endpoint, block=False)
    except (pynng.AddressInvalid, pynng.NotSupported, pynng.InvalidOperation) as exc:
        raise ValueError(f"bad endpoint {endpoint!r}: {exc}; expected {ENDPOINT_FORMS}") from exc


class _DialWatch:
    """Says, while the socket has no connection, that it is still dialing and
    where: a wrong endpoint would otherwise dial in silence for ever. The first
    line comes after IDEMPROXY_DIAL_LOG_MS (5 s), then one every six times as
    long (30 s), until a connection is up; losing it starts over."""

    def __init__(self, sock: Any, endpoint: str) -> None:
        try:
            ms = int(os.environ.get(DIAL_LOG_ENV) or DIAL_LOG_MS)
        except ValueError:
            ms = DIAL_LOG_MS
        self.endpoint = endpoint
        self.first = max(ms, 1) / 1000
        self._lock = threading.Lock()
        self._pipes = 0
        self._since = time.monotonic()
        self._next = self._since + self.first
        sock.add_post_pipe_connect_cb(self._up)
        sock.add_post_pipe_remove_cb(self._down)

    def _up(self, _pipe: Any) -> None:
        with self._lock:
            self._pipes += 1

    def _down(self, _pipe: Any) -> None:
        with self._lock:
            self._pipes -= 1
            if self._pipes == 0:
                self._since = time.monotonic()
                self._next = self._since + self.first

    def tick(self) -> None:
        """Called now and then (twice a second): logs when it is time."""
        now = time.monotonic()
        with self._lock:
            if self._pipes > 0 or now < self._next:
                return
            self._next = now + 6 * self.first
            waited = now - self._since
        log.warning("still dialing %s: no connection to idemproxy for %.0f s "
                    "(is idemproxy running, and is this its app.endpoint?)", self.endpoint, waited)


class Status(IntEnum):
    """The answers a worker gives; the values are idemproxy.v1.Ack.Status."""
    ACK = pb.Ack.ACK      # done: the key is marked done and the entry acked
    RETRY = pb.Ack.RETRY  # not now: delivered again later with attempt + 1
    DROP = pb.Ack.DROP    # never: dead-lettered with the reason


class Drop(Exception):
    """Raise from a handler to refuse a delivery for good: idemproxy dead-letters
    it with ``str(exc)`` as the reason, marks the key done and acks the entry."""


class Retry(Exception):
    """Raise from a handler to have the delivery again later (attempt + 1, after
    idemproxy's backoff) with ``str(exc)`` as the reason. Any other exception
    does the same, but is also logged with its traceback, as the bug it may be."""


@dataclass(frozen=True)
class Delivery:
    """One stream entry, handed to the handler."""
    stream: str              # stream key
    entry_id: str            # Redis entry id, "1700000000000-0"
    key: str                 # the rendered dedup key (without prefix)
    fields: Dict[str, bytes]  # the entry's fields in stream order, minus the payload field
    payload: bytes           # the payload field's value, or b""
    attempt: int             # 1 on the first delivery
    fencing_token: int       # strictly increasing per lock; 0 when fencing is off
    deadline_unix_ms: int    # an answer after this (epoch ms) is too late

    @classmethod
    def decode(cls, data: bytes) -> "Delivery":
        """Parses an encoded idemproxy.v1.Delivery; raises on malformed input."""
        m = pb.Delivery.FromString(data)
        _check_wire_types(m)
        return cls(stream=m.stream, entry_id=m.entry_id, key=m.key,
                   fields={f.name: f.value for f in m.fields}, payload=m.payload,
                   attempt=m.attempt, fencing_token=m.fencing_token,
                   deadline_unix_ms=m.deadline_unix_ms)

    def json(self) -> Any:
        """The payload parsed as JSON (the usual case with ``payload_field``)."""
        return json.loads(self.payload)


def _check_wire_types(m: Any) -> None:
    """Refuses a known field that came with the wrong wire type: protobuf keeps it
    among the unknown fields instead of failing, which would hand the handler a 0."""
    for f in UnknownFieldSet(m):
        if f.field_number in m.DESCRIPTOR.fields_by_number:
            name = m.DESCRIPTOR.fields_by_number[f.field_number].name
            raise ValueError(f"field {name} has wire type {f.wire_type}")
    for fd, value in m.ListFields():
        if fd.message_type is not None:
            for sub in value if hasattr(value, "__len__") else [value]:
                _check_wire_types(sub)


Handler = Callable[[Delivery], Any]
AsyncHandler = Callable[[Delivery], Awaitable[Any]]
H = TypeVar("H", bound=Handler)
AH = TypeVar("AH", bound=AsyncHandler)


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.encode("utf-8", "replace").decode("utf-8")  # proto strings are UTF-8


def _open(data: bytes) -> Tuple[Optional[Delivery], bytes]:
    """The first half of answer(): the Delivery in 'data' and b"", or None and
    the encoded RETRY when it does not decode or its deadline has passed."""
    try:
        d = Delivery.decode(data)
    except Exception as exc:  # DecodeError, invalid UTF-8 in a string field
        log.warning("undecodable delivery (%d bytes), answered RETRY: %s", len(data), exc)
        return None, pb.Ack(status=pb.Ack.RETRY, reason=f"undecodable delivery: {exc}").SerializeToString()
    if d.deadline_unix_ms and time.time() * 1000 > d.deadline_unix_ms:
        log.info("%s %s key=%s: %s, answered RETRY", d.stream, d.entry_id, d.key, STALE)
        return None, pb.Ack(status=pb.Ack.RETRY, reason=STALE, stream=d.stream,
                            entry_id=d.entry_id).SerializeToString()
    return d, b""


def _close(d: Delivery, exc: Optional[BaseException]) -> bytes:
    """The second half: the encoded Ack for the handler's outcome on 'd', None
    when it returned, else the exception it raised (logged here)."""
    status, reason = Status.ACK, ""
    if isinstance(exc, Drop):
        status, reason = Status.DROP, _reason(exc)
        log.info("%s %s key=%s: DROP: %s", d.stream, d.entry_id, d.key, reason)
    elif isinstance(exc, Retry):
        status, reason = Status.RETRY, _reason(exc)
        log.info("%s %s key=%s: RETRY: %s", d.stream, d.entry_id, d.key, reason)
    elif exc is not None:
        status, reason = Status.RETRY, _reason(exc)
        log.warning("%s %s key=%s attempt=%d: handler failed, RETRY: %s",
                    d.stream, d.entry_id, d.key, d.attempt, reason, exc_info=exc)
    return pb.Ack(status=int(status), reason=reason, stream=d.stream,
                  entry_id=d.entry_id).SerializeToString()


def answer(handler: Handler, data: bytes) -> bytes:
    """Decodes the Delivery in 'data', runs 'handler' on it and returns the
    encoded Ack: ACK when it returns, DROP on Drop, RETRY on any other
    exception, when 'data' does not decode, or when its deadline has passed
    (then without running the handler). The transport-free core of a
    worker, for tests or for serving deliveries some other way."""
    d, early = _open(data)
    if d is None:
        return early
    try:
        handler(d)
    except Exception as exc:
        return _close(d, exc)
    return _close(d, None)


async def answer_async(handler: AsyncHandler, data: bytes) -> bytes:
    """answer() for a coroutine handler: awaits handler(delivery)."""
    d, early = _open(data)
    if d is None:
        return early
    try:
        await handler(d)
    except Exception as exc:
        return _close(d, exc)
    return _close(d, None)


class Worker:
    """Serves deliveries from 'endpoint' to one handler with up to 'concurrency'
    handlers running at once. Set the handler here or with ``@worker.handler``,
    then call run(). 'max_entry_bytes' is idemproxy's app.max_entry_bytes (raise
    both together; 0: no limit): a bigger message drops the connection."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, handler: Optional[Handler] = None,
                 *, concurrency: int = 1, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if max_entry_bytes < 0:
            raise ValueError("max_entry_bytes must be 0 (no limit) or more")
        self.endpoint = endpoint
        self.concurrency = concurrency
        self.max_entry_bytes = max_entry_bytes
        self._handler = handler
        self._stop = threading.Event()
        self._last_send = 0.0

    def handler(self, fn: H) -> H:
        """Decorator: makes 'fn' the handler and returns it unchanged."""
        self._handler = fn
        return fn

    def stop(self) -> None:
        """Makes run() return: no new delivery is taken, those in hand are
        finished and answered. Safe from any thread and from signal handlers."""
        self._stop.set()

    def run(self, *, handle_signals: bool = True) -> None:
        """Connects and serves deliveries until stop(), or SIGTERM/SIGINT when
        'handle_signals' and called from the main thread. Raises ValueError
        for an endpoint NNG cannot use, pynng.NNGException for other failures."""
        if self._handler is None:
            raise RuntimeError("no handler: pass one to Worker() or decorate it with @worker.handler")
        self._stop.clear()
        previous: Dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop())
        limit = self.max_entry_bytes + SP_HEADER_BYTES if self.max_entry_bytes else 0
        sock = pynng.Rep0(recv_timeout=int(POLL_S * 1000), recv_max_size=limit)
        threads: List[threading.Thread] = []
        try:
            watch = _DialWatch(sock, self.endpoint)
            _dial(sock, self.endpoint)
            for i in range(self.concurrency):
                t = threading.Thread(target=self._serve, args=(sock.new_context(),),
                                     name=f"idemproxy-worker-{i}", daemon=True)
                t.start()
                threads.append(t)
            for t in threads:
                while t.is_alive():
                    t.join(0.5)  # a timed join lets the main thread run signal handlers
                    watch.tick()
        finally:
            self._stop.set()
            for t in threads:
                t.join()
            time.sleep(max(0.0, self._last_send + LINGER_S - time.monotonic()))
            sock.close()
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _serve(self, ctx: pynng.Context) -> None:
        """One handler thread: receive, handle, answer on its own context."""
        assert self._handler is not None
        try:
            while not self._stop.is_set():
                try:
                    data = ctx.recv()
                except pynng.Timeout:
                    continue
                reply = answer(self._handler, data)
                try:
                    ctx.send(reply)
                    self._last_send = time.monotonic()
                except pynng.NNGException as exc:  # idemproxy's ack timeout covers it
                    log.warning("answer not sent: %s", exc)
        except pynng.Closed:
            pass
        except BaseException:  # SystemExit, or a bug here: stop the others too
            self._stop.set()
            raise
        finally:
            ctx.close()


def run(endpoint: str, handler: Handler, concurrency: int = 1) -> None:
    """Serves deliveries from 'endpoint' with 'handler' until SIGTERM or SIGINT."""
    Worker(endpoint, handler, concurrency=concurrency).run()


class AsyncWorker:
    """Worker for asyncio: handlers are coroutines, run on the event loop, up to
    'concurrency' at once (one NNG context each, on pynng's async API). Same
    answers, limits and logging as Worker:

        worker = AsyncWorker("ipc:///tmp/idemproxy.sock", concurrency=8)

        @worker.handler
        async def handle(d: Delivery) -> None:
            await db.save(d.json(), fencing_token=d.fencing_token)

        asyncio.run(worker.run())   # until SIGTERM/SIGINT or worker.stop()
    """

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, handler: Optional[AsyncHandler] = None,
                 *, concurrency: int = 1, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if max_entry_bytes < 0:
            raise ValueError("max_entry_bytes must be 0 (no limit) or more")
        self.endpoint = endpoint
        self.concurrency = concurrency
        self.max_entry_bytes = max_entry_bytes
        self._handler = handler
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Future] = None
        self._stop_early = False
        self._last_send = 0.0

    def handler(self, fn: AH) -> AH:
        """Decorator: makes the coroutine function 'fn' the handler and returns it unchanged."""
        self._handler = fn
        return fn

    def stop(self) -> None:
        """Makes run() return: no new delivery is taken, those in hand are
        finished and answered. Safe from any thread."""
        loop, fut = self._loop, self._stopping
        if loop is None or fut is None:
            self._stop_early = True
            return

        def set_stop() -> None:
            if not fut.done():
                fut.set_result(None)
        try:
            if asyncio.get_running_loop() is loop:
                set_stop()
                return
        except RuntimeError:
            pass
        loop.call_soon_threadsafe(set_stop)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Connects and serves deliveries until stop(), or SIGTERM/SIGINT when
        'handle_signals' and running in the main thread. Raises ValueError for
        an endpoint NNG cannot use, pynng.NNGException for other failures."""
        if self._handler is None:
            raise RuntimeError("no handler: pass one to AsyncWorker() or decorate it with @worker.handler")
        loop = asyncio.get_running_loop()
        self._loop, self._stopping = loop, loop.create_future()
        if self._stop_early:
            self._stop_early = False
            self._stopping.set_result(None)
        signals: List[int] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
                signals.append(sig)
        limit = self.max_entry_bytes + SP_HEADER_BYTES if self.max_entry_bytes else 0
        sock = pynng.Rep0(recv_max_size=limit)
        watcher = None
        try:
            watch = _DialWatch(sock, self.endpoint)
            _dial(sock, self.endpoint)
            watcher = asyncio.ensure_future(self._watch(watch))
            await asyncio.gather(*(self._serve(sock.new_context()) for _ in range(self.concurrency)))
        finally:
            if watcher is not None:
                watcher.cancel()
            for sig in signals:
                loop.remove_signal_handler(sig)
            await asyncio.sleep(max(0.0, self._last_send + LINGER_S - time.monotonic()))
            sock.close()
            self._loop = self._stopping = None

    async def _watch(self, watch: _DialWatch) -> None:
        while True:
            await asyncio.sleep(0.5)
            watch.tick()

    async def _serve(self, ctx: pynng.Context) -> None:
        """One slot: receive, await the handler, answer on its own context."""
        assert self._handler is not None and self._stopping is not None
        try:
            while not self._stopping.done():
                recv = asyncio.ensure_future(ctx.arecv())
                await asyncio.wait({recv, self._stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not recv.done():  # stopping: take nothing more
                    recv.cancel()
                    try:
                        await recv
                    except (asyncio.CancelledError, pynng.NNGException):
                        pass
                    break
                reply = await answer_async(self._handler, recv.result())
                try:
                    await ctx.asend(reply)
                    self._last_send = time.monotonic()
                except pynng.NNGException as exc:  # idemproxy's ack timeout covers it
                    log.warning("answer not sent: %s", exc)
        except pynng.Closed:
            pass
        finally:
            ctx.close()
