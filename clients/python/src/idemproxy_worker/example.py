"""python -m idemproxy_worker.example [--endpoint URL] - an idemproxy worker.

It connects to idemproxy (which may start later: NNG keeps dialing), answers
every delivery and prints one flushed line per delivery on stdout,
"<key> attempt=<n>"; everything else goes to stderr. SIGTERM or SIGINT: the
deliveries in hand are finished and answered, then it exits 0.

The environment turns it into a test double, as clients/c/example_worker.c:
  IDEMPROXY_ENDPOINT   endpoint when --endpoint is not given
  WORKER_CONCURRENCY   handle up to n deliveries at the same time (1)
  WORKER_DELAY_MS      work this long before answering each delivery
  WORKER_RETRY_KEYS    k1,k2: answer RETRY while attempt <= WORKER_RETRY_TIMES (1)
  WORKER_RETRY_AFTER_MS  n > 0: those RETRYs ask to come again after n ms
                       (Retry(after=...)) instead of idemproxy's backoff
  WORKER_DROP_KEYS     k3: answer DROP, reason "dropped by worker"
  WORKER_SLOW_KEYS     k4: work WORKER_SLOW_MS (1000) on these before answering
  WORKER_CRASH_KEYS    k5: exit(3) on receipt, unanswered, as a crash would
  WORKER_DEADLINE_KEYS k7: work WORKER_SLOW_MS on these, but no longer than the
                       delivery's deadline: a Worker handler sleeps at most
                       d.remaining() (a thread cannot be stopped), an AsyncWorker
                       one is cancelled there; either way it answers RETRY
  WORKER_ASYNC=1       serve with AsyncWorker (coroutine handlers) instead of Worker
  WORKER_CANCEL_KEYS   k8: the handler raises asyncio.CancelledError (answered RETRY)
  WORKER_EXIT_KEYS     k9: the handler calls sys.exit(3) (answered RETRY, then the
                       worker stops and exits 3)
  WORKER_MAX_BYTES     app.max_entry_bytes, if it was raised (-1: no limit)
  WORKER_VERBOSE=1     describe each delivery on stderr
  WORKER_REPORT        a file: one JSON object per answered delivery is appended
                       (key, stream, entry_id, attempt, fencing_token,
                       deadline_unix_ms, payload, fields, traceparent, tracestate,
                       span_trace_id, span_parent_id, status, start_ms, end_ms,
                       remaining_ms: d.remaining() at the start, -1 without a
                       deadline; stopped: "signal" when the client stopped the
                       handler at the deadline, "deadline" when it stopped its own
                       work there, "" when it worked in full)
With WORKER_REPORT and OpenTelemetry's SDK at hand (the dev extra), it sets a
tracer provider (no exporter), so each handler runs in a real span; the report
gives that span's trace id and parent span id (span_trace_id, span_parent_id).
WORKER_NOACK_KEYS is not supported: this library answers every delivery.
"""
import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from typing import Dict, Set

from . import DEFAULT_ENDPOINT, AsyncWorker, Delivery, Drop, Retry, Worker


def env_keys(name: str) -> Set[str]:
    return {k for k in os.environ.get(name, "").split(",") if k}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def span_ids() -> Dict[str, str]:
    """The handler's span: its trace id and its parent's span id, or ""."""
    try:
        from opentelemetry import trace
    except ImportError:
        return {"span_trace_id": "", "span_parent_id": ""}
    span = trace.get_current_span()
    ctx, parent = span.get_span_context(), getattr(span, "parent", None)
    return {"span_trace_id": format(ctx.trace_id, "032x") if ctx.is_valid else "",
            "span_parent_id": format(parent.span_id, "016x") if parent is not None else ""}


def use_otel_sdk() -> None:
    """Real spans (never exported) when opentelemetry-sdk is installed."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return
    trace.set_tracer_provider(TracerProvider())


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m idemproxy_worker.example",
                                 description="An idemproxy worker that acks every delivery.")
    ap.add_argument("--endpoint", default=os.environ.get("IDEMPROXY_ENDPOINT") or DEFAULT_ENDPOINT,
                    help=f"where idemproxy binds (default {DEFAULT_ENDPOINT})")
    args = ap.parse_args()

    verbose = env_int("WORKER_VERBOSE", 0) != 0
    delay_ms, slow_ms = env_int("WORKER_DELAY_MS", 0), env_int("WORKER_SLOW_MS", 1000)
    retry_times = env_int("WORKER_RETRY_TIMES", 1)
    retry_keys, drop_keys = env_keys("WORKER_RETRY_KEYS"), env_keys("WORKER_DROP_KEYS")
    retry_after_ms = env_int("WORKER_RETRY_AFTER_MS", 0)
    slow_keys, crash_keys = env_keys("WORKER_SLOW_KEYS"), env_keys("WORKER_CRASH_KEYS")
    deadline_keys = env_keys("WORKER_DEADLINE_KEYS")
    cancel_keys, exit_keys = env_keys("WORKER_CANCEL_KEYS"), env_keys("WORKER_EXIT_KEYS")
    report_path = os.environ.get("WORKER_REPORT", "")
    out_lock = threading.Lock()  # one line at a time, from concurrent handlers
    logging.basicConfig(stream=sys.stderr, level=logging.INFO if verbose else logging.WARNING,
                        format="example_worker: %(message)s")

    if report_path:
        use_otel_sdk()

    def report(d: Delivery, status: str, start: int, end: int, remaining: float, stopped: str) -> None:
        if not report_path:
            return
        line = json.dumps({
            "key": d.key, "stream": d.stream, "entry_id": d.entry_id, "attempt": d.attempt,
            "fencing_token": d.fencing_token, "deadline_unix_ms": d.deadline_unix_ms,
            "payload": d.payload.decode("utf-8", "replace"),
            "fields": {k: v.decode("utf-8", "replace") for k, v in d.fields.items()},
            "traceparent": d.traceparent, "tracestate": d.tracestate, **span_ids(),
            "status": status, "start_ms": start, "end_ms": end,
            "remaining_ms": -1 if remaining == float("inf") else int(remaining * 1000),
            "stopped": stopped}) + "\n"
        with out_lock, open(report_path, "a", encoding="utf-8") as f:
            f.write(line)

    max_bytes = env_int("WORKER_MAX_BYTES", 0)
    worker_class = AsyncWorker if env_int("WORKER_ASYNC", 0) else Worker
    worker = worker_class(args.endpoint, concurrency=env_int("WORKER_CONCURRENCY", 1),
                          **({"max_entry_bytes": max(max_bytes, 0)} if max_bytes else {}))

    def receive(d: Delivery) -> None:
        if verbose:
            print(f"delivery {d.stream} {d.entry_id} key={d.key} attempt={d.attempt} "
                  f"fencing={d.fencing_token} deadline={d.deadline_unix_ms}\n"
                  f"  fields = {d.fields}\n  payload = {d.payload!r}", file=sys.stderr, flush=True)
        if d.key in crash_keys:
            print(f"example_worker: crashing on {d.key} as asked", file=sys.stderr, flush=True)
            os._exit(3)

    def decide(d: Delivery) -> None:
        """After the work: what the environment asks the answer to be."""
        if d.key in cancel_keys:
            raise asyncio.CancelledError()
        if d.key in exit_keys:
            sys.exit(3)
        if d.key in drop_keys:
            raise Drop("dropped by worker")
        if d.key in retry_keys and d.attempt <= retry_times:
            raise Retry("retry requested by worker",
                        after=retry_after_ms / 1000 if retry_after_ms > 0 else None)

    def done(d: Delivery, exc: BaseException | None, start: int, remaining: float, stopped: str) -> None:
        status = ("ack" if exc is None else "drop" if isinstance(exc, Drop) else "retry")
        report(d, status, start, now_ms(), remaining, stopped)
        with out_lock:
            sys.stdout.write(f"{d.key} attempt={d.attempt}\n")
            sys.stdout.flush()

    def handle(d: Delivery) -> None:
        receive(d)
        start, remaining, stopped = now_ms(), d.remaining(), ""
        try:
            time.sleep(delay_ms / 1000)
            if d.key in slow_keys:
                time.sleep(slow_ms / 1000)
            if d.key in deadline_keys:  # a thread cannot be stopped: its work stops itself
                if slow_ms / 1000 >= d.remaining():
                    time.sleep(d.remaining())
                    stopped = "deadline"
                    raise Retry("stopped at the deadline")
                time.sleep(slow_ms / 1000)
            decide(d)
        except BaseException as exc:  # the answer goes out as soon as this returns
            done(d, exc, start, remaining, stopped)
            raise
        done(d, None, start, remaining, stopped)

    async def ahandle(d: Delivery) -> None:
        receive(d)
        start, remaining, stopped = now_ms(), d.remaining(), ""
        try:
            try:
                await asyncio.sleep(delay_ms / 1000)
                if d.key in slow_keys or d.key in deadline_keys:
                    await asyncio.sleep(slow_ms / 1000)
            except asyncio.CancelledError:  # AsyncWorker cancels a handler at the deadline
                stopped = "signal"
                raise
            decide(d)
        except BaseException as exc:
            done(d, exc, start, remaining, stopped)
            raise
        done(d, None, start, remaining, stopped)

    worker.handler(ahandle if worker_class is AsyncWorker else handle)

    print(f"example_worker: waiting for deliveries on {args.endpoint} "
          f"({worker.concurrency} at a time)", file=sys.stderr, flush=True)
    try:
        if isinstance(worker, AsyncWorker):
            asyncio.run(worker.run())
        else:
            worker.run()
    except ValueError as exc:
        sys.exit(f"example_worker: {exc}")


if __name__ == "__main__":
    main()
