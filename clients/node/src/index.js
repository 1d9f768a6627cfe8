/*
 * idemproxy-worker - write idemproxy workers in Node.js.
 *
 * idemproxy binds an endpoint with a raw nanomsg REQ socket and sends one
 * idemproxy.v1.Delivery per unique event; a worker connects a REP socket,
 * handles each delivery and answers with an idemproxy.v1.Ack. Here that is
 * one function:
 *
 *   import { serve, Drop, RetryAfter } from 'idemproxy-worker';
 *
 *   const worker = serve({ endpoint: 'ipc:///tmp/idemproxy.sock', concurrency: 4 }, async (d) => {
 *     if (d.payload.length === 0) throw new Drop('empty payload');  // DROP: dead-lettered with the reason
 *     if (await rateLimited()) throw new RetryAfter(30000);        // RETRY, again in 30 s (not the backoff)
 *     await db.apply(d.key, d.payload, d.fencingToken);             // throws → RETRY, reason = its message
 *   });                                                             // resolves → ACK
 *   process.on('SIGTERM', () => worker.close().then(() => process.exit(0)));
 *
 * Up to 'concurrency' handlers run at once, like REP contexts on one NNG socket:
 * every request is answered on the connection it came from, whatever the order.
 * Every Ack echoes the delivery's stream and entry id. A handler that throws
 * (anything but Drop and NoReply) is reported as an 'error' event on the Worker,
 * a HandlerError whose cause is what was thrown. A delivery that does not
 * decode (a string that is not UTF-8, a known field with the wrong wire type)
 * is answered RETRY without calling the handler. Throwing NoReply leaves a
 * delivery unanswered, so idemproxy redelivers it after its ack timeout.
 * d.deadlineUnixMs is the delivery's ack deadline: an answer after it is
 * ignored and the entry is delivered again. idemproxy paces deliveries per
 * worker, so the ack timer measures the handler's own work, not a queue in
 * front of it; a delivery that arrives already past its deadline is answered
 * RETRY without calling the handler. The handler's second argument holds an
 * AbortSignal, { signal }, aborted (a TimeoutError) when that deadline passes.
 * The worker dials until idemproxy is there and again whenever it goes away;
 * deliveries received on a lost connection and not yet started are forgotten
 * (idemproxy redelivers them). Without a connection for 5 s (dialLogMs, or
 * IDEMPROXY_DIAL_LOG_MS) it warns that it is still dialing and where, then
 * every six times as long (30 s) until connected: a wrong endpoint shows. The library never prints: listen to 'error',
 * 'connect', 'disconnect' and 'warn' on the returned Worker to log.
 *
 * The SP wire protocol lives in sp.js; README.md says why it is not a binding.
 */
import { EventEmitter } from 'node:events';
import protobuf from 'protobufjs/minimal.js';
import { idemproxy } from '../gen/idemproxy.js';
import { RepDialer } from './sp.js';

const { Delivery: DeliveryMsg, Ack } = idemproxy.v1;
// OpenTelemetry is an optional peer dependency: with @opentelemetry/api installed, each handler
// runs in a span that continues the delivery's trace (see handlerSpan); without it, no spans.
const otel = await import('@opentelemetry/api').catch(() => null);
export const DEFAULT_ENDPOINT = 'ipc:///tmp/idemproxy.sock';
/** idemproxy's default app.max_entry_bytes: the largest Delivery it sends. */
export const DEFAULT_MAX_ENTRY_BYTES = 1 << 20;
/** Room for the SP header in front of a Delivery (8 backtrace words; idemproxy sends one). */
const SP_HEADER_BYTES = 32;
const STALE = 'deadline passed before the handler ran';
/** The first "still dialing" warning after this long without a connection; then every 6 times as long. */
export const DIAL_LOG_MS = 5000;

function dialLogMs(option) {
  const ms = option ?? Number.parseInt(process.env.IDEMPROXY_DIAL_LOG_MS ?? '', 10);
  return Number.isInteger(ms) && ms > 0 ? ms : DIAL_LOG_MS;
}

/** The answers a worker gives; the values are idemproxy.v1.Ack.Status. */
export const Status = Object.freeze({ ACK: 1, RETRY: 2, DROP: 3 });

/** Throw from a handler to DROP the delivery: it is dead-lettered with 'reason' and never retried. */
export class Drop extends Error {
  constructor(reason = 'dropped') {
    super(reason);
    this.name = 'Drop';
    this.reason = reason;
  }
}

/** Throw from a handler to leave the delivery unanswered (idemproxy retries it after ack_timeout_ms). */
export class NoReply extends Error {
  constructor() {
    super('no reply');
    this.name = 'NoReply';
  }
}

/** idemproxy's cap on Ack.retry_after_ms: an hour. */
export const MAX_RETRY_AFTER_MS = 3600000;

/**
 * Throw from a handler to answer RETRY and have the entry delivered again no
 * earlier than 'ms' from now (protocol 1.1; whole ms rounded up, at least 1,
 * at most an hour) instead of idemproxy's backoff: a rate limit, a
 * downstream's Retry-After. The attempt counts toward max_deliveries. Not a
 * handler failure: no 'error' event.
 */
export class RetryAfter extends Error {
  constructor(ms, reason = `retry after ${ms} ms`) {
    super(reason);
    this.name = 'RetryAfter';
    this.reason = reason;
    const n = Number(ms);
    this.ms = Number.isNaN(n) ? 1 : Math.min(Math.max(Math.ceil(n), 1), MAX_RETRY_AFTER_MS);
  }
}

/**
 * What a Worker emits as 'error' when a handler throws or rejects (Drop,
 * RetryAfter and NoReply are answers, not failures): 'cause' is what was thrown, 'delivery'
 * the Delivery it was handling. The delivery has been answered RETRY.
 */
export class HandlerError extends Error {
  constructor(delivery, cause) {
    super(`${delivery.stream} ${delivery.entryId} key=${delivery.key} attempt=${delivery.attempt}: ` +
          `handler failed, answered RETRY: ${reasonOf(cause)}`, { cause });
    this.name = 'HandlerError';
    this.delivery = delivery;
  }
}

/** setTimeout's longest delay; a deadline further away than this (24.8 days) gets no timer. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * An AbortSignal aborted with a TimeoutError once epoch ms 'deadline' has
 * passed (Date.now() > deadline, as the stale check; never for 0), and a
 * function that cancels its timer. A timer may fire a little early against
 * Date.now(): it is then set again for the rest.
 */
function deadlineSignal(deadline) {
  const ctl = new AbortController();
  let timer = null;
  const arm = () => {
    const left = deadline - Date.now();
    if (left < 0) {
      ctl.abort(new DOMException(`deadline ${deadline} passed`, 'TimeoutError'));
    } else if (left < MAX_TIMER_MS) {
      timer = setTimeout(arm, left + 1);
      timer.unref();
    }
  };
  if (deadline !== 0) arm();
  return [ctl.signal, () => clearTimeout(timer)];
}

const toBigInt = (v) => (typeof v === 'number' ? BigInt(v) : (BigInt(v.high >>> 0) << 32n) | BigInt(v.low >>> 0));

/** One event handed over by idemproxy. All fields are read-only by convention. */
export class Delivery {
  constructor(m) {
    /** @type {string} the stream key */
    this.stream = m.stream;
    /** @type {string} the Redis entry id, "1700000000000-0" */
    this.entryId = m.entryId;
    /** @type {string} the rendered dedup key */
    this.key = m.key;
    /** @type {{name: string, value: Buffer}[]} the entry's fields in stream order, minus the payload field */
    this.fields = m.fields.map((f) => ({ name: f.name, value: Buffer.from(f.value) }));
    /** @type {Buffer} the payload field's value, or empty */
    this.payload = Buffer.from(m.payload);
    /** @type {number} 1 on the first delivery */
    this.attempt = m.attempt;
    /** @type {bigint} uint64, strictly increasing per lock; 0n when fencing is off */
    this.fencingToken = toBigInt(m.fencingToken);
    /** @type {string} the lock fencingToken is for: lock_key's rendered text, else the key; empty when fencing is off */
    this.lock = m.lock;
    /** @type {number} epoch ms after which an answer is too late (exact: well below 2^53) */
    this.deadlineUnixMs = Number(toBigInt(m.deadlineUnixMs));
    /** @type {string} W3C trace context of idemproxy's delivery span (protocol 1.1), or '' */
    this.traceparent = m.traceparent;
    /** @type {string} the W3C tracestate that goes with it, or '' */
    this.tracestate = m.tracestate;
  }

  /** The value of the first field called 'name', or undefined. */
  field(name) {
    return this.fields.find((f) => f.name === name)?.value;
  }

  /** Decodes an idemproxy.v1.Delivery; throws on malformed input. */
  static decode(bytes) {
    checkWire(bytes, SHAPES.delivery);
    return new Delivery(DeliveryMsg.decode(bytes));
  }
}

// protobufjs reads a known field whatever its wire type, and strings without
// checking UTF-8; the other clients' protobuf libraries refuse both, so we do too.
const utf8 = new TextDecoder('utf-8', { fatal: true });
const SHAPES = {   // per field number: its wire type, and what a length-delimited one holds
  delivery: { 1: [2, 'string'], 2: [2, 'string'], 3: [2, 'string'], 4: [2, 'field'], 5: [2], 6: [0], 7: [0], 8: [0],
              9: [2, 'string'], 10: [2, 'string'], 11: [2, 'string'] },
  field: { 1: [2, 'string'], 2: [2] },
};

function checkWire(bytes, shape) {
  const r = protobuf.Reader.create(bytes);
  while (r.pos < r.len) {
    const tag = r.uint32(), num = tag >>> 3, type = tag & 7;
    const [want, holds] = shape[num] ?? [type];
    if (type !== want) throw new Error(`field ${num} has wire type ${type}, not ${want}`);
    if (type !== 2 || !holds) {
      r.skipType(type);
    } else if (holds === 'string') {
      try { utf8.decode(r.bytes()); } catch { throw new Error(`field ${num} is not UTF-8`); }
    } else {
      checkWire(r.bytes(), SHAPES[holds]);
    }
  }
}

/** Encodes an idemproxy.v1.Ack. */
export function encodeAck({ status, reason = '', stream = '', entryId = '', retryAfterMs = 0 }) {
  return Buffer.from(Ack.encode({ status, reason, stream, entryId, retryAfterMs }).finish());
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * The handler's span (OpenTelemetry present): "process <stream>", a CONSUMER
 * span whose parent is the delivery's traceparent (idemproxy's delivery span;
 * a new root when it is empty or malformed), with the attributes idemproxy's
 * own spans use. Returns the context to run the handler in and finish(answer, err).
 */
function handlerSpan(d) {
  const { ROOT_CONTEXT, trace, SpanKind, SpanStatusCode } = otel;
  let parent = ROOT_CONTEXT;
  const m = TRACEPARENT.exec(d.traceparent);
  if (m) {
    const sc = { traceId: m[1], spanId: m[2], traceFlags: Number.parseInt(m[3], 16) & 1, isRemote: true };
    try { if (d.tracestate && otel.createTraceState) sc.traceState = otel.createTraceState(d.tracestate); } catch { /* ignored */ }
    if (otel.isSpanContextValid(sc)) parent = trace.setSpanContext(ROOT_CONTEXT, sc);
  }
  const span = trace.getTracer('idemproxy-worker').startSpan(`process ${d.stream}`, {
    kind: SpanKind.CONSUMER,
    attributes: {
      'messaging.system': 'redis_streams', 'messaging.operation.type': 'process',
      'messaging.operation.name': 'process', 'messaging.destination.name': d.stream,
      'messaging.message.id': d.entryId, 'idemproxy.key': d.key, 'idemproxy.attempt': d.attempt,
    },
  }, parent);
  return {
    ctx: trace.setSpan(parent, span),
    finish(answer, err) {
      span.setAttribute('idemproxy.answer', answer);
      if (err) {
        span.recordException(err instanceof Error ? err : String(err));
        span.setStatus({ code: SpanStatusCode.ERROR, message: reasonOf(err) });
      }
      span.end();
    },
  };
}

const reasonOf = (err) => (err instanceof Error ? err.message || err.name : String(err));

/**
 * A running worker: a REP connection to idemproxy and up to 'concurrency'
 * handlers at once. Events: 'error' (HandlerError), 'connect' (),
 * 'disconnect' (err?), 'warn' (err). Without an 'error' listener a handler's
 * failure goes to process.emitWarning() rather than crashing the process.
 */
export class Worker extends EventEmitter {
  #handler; #concurrency; #dialer; #queue = []; #active = 0; #closing = null; #closed;
  #endpoint; #dialLog; #dialTimer = null; #since;

  constructor({ endpoint = DEFAULT_ENDPOINT, concurrency = 1, maxEntryBytes = DEFAULT_MAX_ENTRY_BYTES,
                dialLogMs: dialLog } = {}, handler) {
    super();
    if (typeof handler !== 'function') throw new TypeError('serve() needs a handler function');
    if (!(Number.isInteger(concurrency) && concurrency >= 1)) throw new RangeError('concurrency must be an integer >= 1');
    this.#handler = handler;
    this.#concurrency = concurrency;
    this.#endpoint = endpoint;
    this.#dialLog = dialLogMs(dialLog);
    this.#dialer = new RepDialer(endpoint, { maxMessageBytes: maxEntryBytes + SP_HEADER_BYTES });
    this.#dialer.on('connect', () => {
      clearTimeout(this.#dialTimer);
      this.emit('connect');
    });
    this.#dialer.on('warn', (err) => this.emit('warn', err));
    this.#dialer.on('disconnect', (err) => {
      this.#queue = this.#queue.filter((req) => req.live);
      this.#pump();
      this.#watchDialing();
      this.emit('disconnect', err);
    });
    this.#dialer.on('request', (req) => {
      if (this.#closing) return;
      this.#queue.push(req);
      if (this.#queue.length >= this.#concurrency) this.#dialer.pause();
      this.#pump();
    });
    this.#watchDialing();
    this.#dialer.start();
  }

  /** Warns while there is no connection: after dialLogMs, then every 6 times as long. */
  #watchDialing() {
    clearTimeout(this.#dialTimer);
    if (this.#closing) return;
    this.#since = Date.now();
    const tick = (wait) => {
      this.#dialTimer = setTimeout(() => {
        const secs = Math.round((Date.now() - this.#since) / 1000);
        this.#warn(new Error(`still dialing ${this.#endpoint}: no connection to idemproxy for ${secs} s ` +
                             '(is idemproxy running, and is this its app.endpoint?)'));
        tick(6 * this.#dialLog);
      }, wait);
      this.#dialTimer.unref();
    };
    tick(this.#dialLog);
  }

  /** A 'warn' event, or a process warning when nobody listens (so it is seen). */
  #warn(err) {
    if (this.listenerCount('warn') > 0) this.emit('warn', err);
    else process.emitWarning(err.message, 'IdemproxyWarning');
  }

  /** Deliveries being handled right now. */
  get active() { return this.#active; }

  /**
   * Stops taking deliveries, lets the handlers in progress finish and send
   * their answers, then closes the connection. Resolves when all that is done.
   */
  close() {
    if (!this.#closing) {
      clearTimeout(this.#dialTimer);
      this.#dialer.pause();
      this.#queue = [];
      this.#closing = new Promise((resolve) => { this.#closed = resolve; });
      this.#pump();
    }
    return this.#closing;
  }

  #pump() {
    while (this.#active < this.#concurrency && this.#queue.length > 0) {
      const req = this.#queue.shift();
      if (!req.live) continue;
      this.#active++;
      this.#handle(req).catch((err) => this.emit('warn', err)).finally(() => {
        this.#active--;
        this.#pump();
      });
    }
    if (this.#closing && this.#active === 0 && this.#closed) {
      const done = this.#closed;
      this.#closed = null;
      this.#dialer.close().then(done);
    } else if (!this.#closing && this.#queue.length < this.#concurrency) {
      this.#dialer.resume();
    }
  }

  async #handle(req) {
    let d;
    try {
      d = Delivery.decode(req.body);
    } catch (err) {
      this.emit('warn', new Error(`undecodable delivery answered RETRY: ${err.message}`));
      req.reply(encodeAck({ status: Status.RETRY, reason: `undecodable delivery: ${err.message}` }));
      return;
    }
    if (d.deadlineUnixMs !== 0 && Date.now() > d.deadlineUnixMs) {
      this.emit('warn', new Error(`${d.stream} ${d.entryId} key=${d.key}: ${STALE}, answered RETRY`));
      req.reply(encodeAck({ status: Status.RETRY, reason: STALE, stream: d.stream, entryId: d.entryId }));
      return;
    }
    let status = Status.ACK, reason = '', failure = null, retryAfterMs = 0;
    const [signal, done] = deadlineSignal(d.deadlineUnixMs);
    const span = otel ? handlerSpan(d) : null;
    try {
      const run = () => this.#handler(d, { signal });
      await (span ? otel.context.with(span.ctx, run) : run());
    } catch (err) {
      if (err instanceof NoReply) {
        span?.finish('none');
        return;
      }
      status = err instanceof Drop ? Status.DROP : Status.RETRY;
      reason = err instanceof Drop || err instanceof RetryAfter ? String(err.reason) : reasonOf(err);
      if (err instanceof RetryAfter) retryAfterMs = err.ms;
      else if (!(err instanceof Drop)) failure = new HandlerError(d, err);
    } finally {
      done();
    }
    span?.finish(['', 'ack', 'retry', 'drop'][status], failure?.cause);
    const sent = req.reply(encodeAck({ status, reason, stream: d.stream, entryId: d.entryId, retryAfterMs }));
    if (failure) this.#fail(failure);
    if (!sent) {
      this.emit('warn', new Error(`connection lost before answering ${d.stream} ${d.entryId}; idemproxy will redeliver it`));
    }
  }

  /** Reports a handler's failure: the 'error' event, or a process warning when nobody listens. */
  #fail(err) {
    if (this.listenerCount('error') > 0) this.emit('error', err);
    else process.emitWarning(err);
  }
}

/**
 * Connects to idemproxy at 'endpoint' (default ipc:///tmp/idemproxy.sock) and
 * calls 'handler(delivery, { signal })' for each delivery, up to 'concurrency'
 * (default 1) at once; 'signal' is aborted when the delivery's deadline passes.
 * The handler resolving answers ACK; throwing or rejecting answers RETRY with
 * the error's message as reason (and an 'error' event); throwing Drop answers
 * DROP; throwing RetryAfter(ms) answers RETRY, to come again after ms.
 * 'maxEntryBytes' (default 1 MiB) is idemproxy's app.max_entry_bytes, to be
 * raised together with it (Infinity: no limit); a bigger message closes the
 * connection. A peer that sends no SP header within 10 s is hung up on.
 * Returns the Worker; call worker.close() to stop.
 */
export function serve(options, handler) {
  return new Worker(options, handler);
}
