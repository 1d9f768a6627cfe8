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
ignored and the entry is delivered again; ``d.remaining()`` is the seconds left.
idemproxy paces deliveries per worker, so the ack timer measures the handler's
own work, not a queue in front of it. A delivery that arrives already past its
deadline is answered RETRY without calling the handler. An AsyncWorker handler
is cancelled at the deadline (RETRY); a Worker handler cannot be stopped (a
thread), so one that ends past its deadline is logged at WARNING.
``d.fencing_token`` lets the application's database refuse stale work
(``d.lock`` names the lock it is for); idemproxy_worker.postgres, the
``postgres`` extra, does that and the inbox in the handler's transaction.
``raise Retry(reason, after=timedelta(seconds=30))`` asks for the next attempt
no earlier than that (protocol 1.1's Ack.retry_after_ms). With opentelemetry-api
installed (the ``otel`` extra) the handler runs in a span that is a child of
``d.traceparent``. A handler's SystemExit is answered RETRY, then the worker
stops (finishing and answering what the others have) and run() raises it. The
library never prints: it logs through the "idemproxy_worker" logger (a
handler's exception at WARNING with its traceback).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from math import ceil, inf
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar, Union

import pynng
from pynng import ffi, lib

try:  # optional: pip install idemproxy-worker[otel]
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    _tracer: Any = _otel_trace.get_tracer("idemproxy_worker")
    _propagator: Any = TraceContextTextMapPropagator()
except ImportError:  # as in tests/packaging/test_python.py's venv
    _otel_trace = None

from google.protobuf.unknown_fields import UnknownFieldSet

from . import idemproxy_pb2 as pb

DEFAULT_ENDPOINT = "ipc:///tmp/idemproxy.sock"
LINGER_S = 0.1   # time given to the last answer to leave before the socket closes
DEFAULT_MAX_ENTRY_BYTES = 1 << 20   # idemproxy's default app.max_entry_bytes
SP_HEADER_BYTES = 32  # room for the SP header in front of a Delivery (8 backtrace words)
STALE = "deadline passed before the handler ran"
LATE = "deadline passed while the handler ran"
MAX_RETRY_AFTER_MS = 3_600_000  # an hour: idemproxy caps it there, as the other clients do

log = logging.getLogger("idemproxy_worker")

DIAL_LOG_ENV = "IDEMPROXY_DIAL_LOG_MS"  # the first "still dialing" after this long (ms)
DIAL_LOG_MS = 5000                      # ... by default; then every 6 times as long (30 s)
ENDPOINT_FORMS = "ipc:///path/to/socket or tcp://host:port (idemproxy's app.endpoint)"


def _check_endpoint(endpoint: str) -> None:
    """Refuses an endpoint without a transport NNG and idemproxy share."""
    if not endpoint.startswith(("ipc://", "tcp://")):
        raise ValueError(f"bad endpoint {endpoint!r}: expected {ENDPOINT_FORMS}")


# NNG's REP hangs up on a request whose backtrace runs out before a word with the top
# bit (no request id) but drops one with more hops than ttl-max. idemproxy sends exactly
# one word, so one hop drops every request without an id in its first word, as the other
# clients skip it (a body under 4 bytes still costs the connection: NNG's own limit).
_TTL_MAX = 1


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
    does the same, but is also logged with its traceback, as the bug it may be.

    ``Retry(reason, after=timedelta(seconds=30))`` (or seconds as a number) asks
    for the next attempt no earlier than that, instead of the backoff: sent as
    Ack.retry_after_ms, at most an hour (protocol 1.1; idemproxy caps it there
    too, and it still counts toward max_deliveries)."""

    def __init__(self, *args: Any, after: Union[timedelta, float, None] = None) -> None:
        super().__init__(*args)
        seconds = after.total_seconds() if isinstance(after, timedelta) else (after or 0)
        if seconds < 0:
            raise ValueError("Retry(after=...) must not be negative")
        self.after_ms = min(ceil(seconds * 1000), MAX_RETRY_AFTER_MS)


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
    deadline_unix_ms: int    # an answer after this (epoch ms) is too late; 0: none
    traceparent: str = ""    # W3C trace context of idemproxy's delivery span, or ""
    tracestate: str = ""     # the W3C tracestate that goes with it, or ""
    lock: str = ""           # the lock fencing_token is for: lock_key's rendered text, else
                             # the key; empty when fencing is off

    @classmethod
    def decode(cls, data: bytes) -> "Delivery":
        """Parses an encoded idemproxy.v1.Delivery; raises on malformed input."""
        m = pb.Delivery.FromString(data)
        _check_wire_types(m)
        return cls(stream=m.stream, entry_id=m.entry_id, key=m.key,
                   fields={f.name: f.value for f in m.fields}, payload=m.payload,
                   attempt=m.attempt, fencing_token=m.fencing_token,
                   deadline_unix_ms=m.deadline_unix_ms, traceparent=m.traceparent,
                   tracestate=m.tracestate, lock=m.lock)

    def remaining(self) -> float:
        """Seconds left until the deadline (0.0 once it has passed; infinity
        without one): a timeout for the handler's own calls."""
        if not self.deadline_unix_ms:
            return inf
        return max(0.0, self.deadline_unix_ms / 1000 - time.time())

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
    status, reason, after_ms = Status.ACK, "", 0
    if d.deadline_unix_ms and time.time() * 1000 > d.deadline_unix_ms:
        log.warning("%s %s key=%s attempt=%d: handler ran past its deadline, its answer comes too late",
                    d.stream, d.entry_id, d.key, d.attempt)
    if isinstance(exc, Drop):
        status, reason = Status.DROP, _reason(exc)
        log.info("%s %s key=%s: DROP: %s", d.stream, d.entry_id, d.key, reason)
    elif isinstance(exc, Retry):
        status, reason, after_ms = Status.RETRY, _reason(exc), exc.after_ms
        log.info("%s %s key=%s: RETRY%s: %s", d.stream, d.entry_id, d.key,
                 f" after {after_ms} ms" if after_ms else "", reason)
    elif exc is not None and not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt
        text = _reason(exc) if str(exc) else ""
        status, reason = Status.RETRY, f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        log.error("%s %s key=%s attempt=%d: handler raised %s, RETRY; the worker stops",
                  d.stream, d.entry_id, d.key, d.attempt, type(exc).__name__, exc_info=exc)
    elif exc is not None:
        status, reason = Status.RETRY, _reason(exc)
        log.warning("%s %s key=%s attempt=%d: handler failed, RETRY: %s",
                    d.stream, d.entry_id, d.key, d.attempt, reason, exc_info=exc)
    return pb.Ack(status=int(status), reason=reason, stream=d.stream, entry_id=d.entry_id,
                  retry_after_ms=after_ms).SerializeToString()


@contextlib.contextmanager
def _span(d: Delivery) -> Iterator[None]:
    """The handler's span, a child of the delivery's traceparent, when
    opentelemetry-api is installed (a no-op until an SDK is configured)."""
    if _otel_trace is None:
        yield
        return
    carrier = {"traceparent": d.traceparent, "tracestate": d.tracestate} if d.traceparent else {}
    with _tracer.start_as_current_span(
            f"{d.stream} process", context=_propagator.extract(carrier),
            kind=_otel_trace.SpanKind.CONSUMER, record_exception=False, set_status_on_exception=False,
            attributes={"messaging.system": "idemproxy", "messaging.destination.name": d.stream,
                        "messaging.message.id": d.entry_id, "messaging.operation.type": "process",
                        "idemproxy.key": d.key, "idemproxy.attempt": d.attempt}):
        yield


def _answer(handler: Handler, data: bytes) -> Tuple[bytes, Optional[BaseException]]:
    """answer()'s work: the encoded Ack, and the BaseException (SystemExit,
    KeyboardInterrupt) the handler raised, if it raised one, for the caller to
    act on after the answer is sent."""
    d, early = _open(data)
    if d is None:
        return early, None
    with _span(d):
        try:
            handler(d)
        except Exception as exc:
            return _close(d, exc), None
        except BaseException as exc:
            return _close(d, exc), exc
    return _close(d, None), None


def answer(handler: Handler, data: bytes) -> bytes:
    """Decodes the Delivery in 'data', runs 'handler' on it and returns the
    encoded Ack: ACK when it returns, DROP on Drop, RETRY on any other
    exception, when 'data' does not decode, or when its deadline has passed
    (then without running the handler). A SystemExit or KeyboardInterrupt
    from the handler is logged and raised, not answered (Worker answers it
    RETRY, then stops). The transport-free core of a worker, for tests or
    for serving deliveries some other way."""
    reply, fatal = _answer(handler, data)
    if fatal is not None:  # a handler's SystemExit or KeyboardInterrupt goes on up
        raise fatal
    return reply


async def answer_async(handler: AsyncHandler, data: bytes) -> bytes:
    """answer() for a coroutine handler: awaits handler(delivery) in a task of
    its own, cancelled at the delivery's deadline (answered RETRY). A handler
    that raises asyncio.CancelledError is answered RETRY too; only when the
    task awaiting answer_async() is cancelled does the cancellation go on up."""
    d, early = _open(data)
    if d is None:
        return early
    with _span(d):
        try:
            task = asyncio.ensure_future(handler(d))
        except Exception as exc:  # a plain function: it returned a non-awaitable, or raised
            return _close(d, exc)
        timeout = None if not d.deadline_unix_ms else d.remaining()
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:  # the worker itself is being stopped
            task.cancel()
            raise
        if not done:
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                return _close(d, task.exception())
            return _close(d, Retry(LATE))
        if task.cancelled():
            return _close(d, Retry("handler cancelled"))
        return _close(d, task.exception())


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
        self._slots: List["_Slot"] = []  # run()'s, under _slots_lock; stop() cancels their receives
        self._slots_lock = threading.RLock()  # stop() may run in a signal handler in run()'s thread
        self._fatal: Optional[BaseException] = None  # a handler's SystemExit: run() raises it
        self._last_send = 0.0

    def handler(self, fn: H) -> H:
        """Decorator: makes 'fn' the handler and returns it unchanged."""
        self._handler = fn
        return fn

    def stop(self) -> None:
        """Makes run() return: no new delivery is taken, those in hand are
        finished and answered. Safe from any thread and from signal handlers."""
        self._stop.set()
        with self._slots_lock:
            for slot in self._slots:
                slot.cancel()

    def run(self, *, handle_signals: bool = True) -> None:
        """Connects and serves deliveries until stop(), or SIGTERM/SIGINT when
        'handle_signals' and called from the main thread. Raises ValueError
        for an endpoint NNG cannot use, pynng.NNGException for other failures."""
        if self._handler is None:
            raise RuntimeError("no handler: pass one to Worker() or decorate it with @worker.handler")
        self._stop.clear()
        self._fatal = None
        previous: Dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop())
        limit = self.max_entry_bytes + SP_HEADER_BYTES if self.max_entry_bytes else 0
        sock = pynng.Rep0(recv_max_size=limit)
        sock.ttl_max = _TTL_MAX
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
            self.stop()
            for t in threads:
                t.join()
            time.sleep(max(0.0, self._last_send + LINGER_S - time.monotonic()))
            with self._slots_lock:
                slots, self._slots = self._slots, []
            for slot in slots:
                slot.close()
            sock.close()
            for sig, old in previous.items():
                signal.signal(sig, old)
        if self._fatal is not None:  # a handler's sys.exit(): the program ends as it asked
            raise self._fatal

    def _serve(self, ctx: pynng.Context) -> None:
        """One handler thread: receive, handle, answer on its own context."""
        assert self._handler is not None
        slot = _Slot(ctx)
        with self._slots_lock:  # run() closes it once every thread has ended
            self._slots.append(slot)
        try:
            while not self._stop.is_set():
                data = slot.recv(self._stop)
                if data is None:  # stop()
                    break
                reply, fatal = _answer(self._handler, data)
                try:
                    slot.ctx.send(reply)
                    self._last_send = time.monotonic()
                except pynng.NNGException as exc:  # idemproxy's ack timeout covers it
                    log.warning("answer not sent: %s", exc)
                if fatal is not None:  # answered; now stop, finishing what the others have
                    self._fatal = self._fatal or fatal
                    self.stop()
        except pynng.Closed:
            pass
        except BaseException:  # a bug here: stop the others too
            self.stop()
            raise


class _Slot:
    """One NNG context and the aio its receive waits on: a thread blocks in
    NNG (no polling, so an idle worker costs no CPU), and cancel() ends a
    receive still waiting without losing one that has completed."""

    def __init__(self, ctx: pynng.Context) -> None:
        self.ctx = ctx  # owned; closed by close()
        aio = ffi.new("nng_aio **")
        pynng.check_err(lib.nng_aio_alloc(aio, ffi.NULL, ffi.NULL))
        self._aio = aio[0]  # owned; freed by close()

    def recv(self, stop: threading.Event) -> Optional[bytes]:
        """The next request's body, or None once cancelled."""
        lib.nng_ctx_recv(self.ctx.context, self._aio)
        if stop.is_set():  # stop() may have run before the receive began
            lib.nng_aio_cancel(self._aio)
        lib.nng_aio_wait(self._aio)  # cffi releases the GIL
        err = lib.nng_aio_result(self._aio)
        if err == lib.NNG_ECANCELED:
            return None
        pynng.check_err(err)
        msg = lib.nng_aio_get_msg(self._aio)
        try:
            return bytes(ffi.buffer(lib.nng_msg_body(msg), lib.nng_msg_len(msg)))
        finally:
            lib.nng_msg_free(msg)

    def cancel(self) -> None:
        lib.nng_aio_cancel(self._aio)

    def close(self) -> None:
        """After the thread using it has ended."""
        if self._aio is not None:
            lib.nng_aio_free(self._aio)
            self._aio = None
        with contextlib.suppress(pynng.NNGException):
            self.ctx.close()


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
        sock.ttl_max = _TTL_MAX
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
            with contextlib.suppress(pynng.NNGException):
                ctx.close()
