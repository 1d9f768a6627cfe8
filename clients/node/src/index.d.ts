// Type declarations for idemproxy-worker (src/index.js), written by hand: keep them in step
// with index.js. tests/packaging/test_node.py type-checks a program against them (tsc --noEmit).
import { EventEmitter } from 'node:events';

/** Where idemproxy binds by default: ipc:///tmp/idemproxy.sock. */
export const DEFAULT_ENDPOINT: string;
/** idemproxy's default app.max_entry_bytes (1 MiB): the largest Delivery it sends. */
/** The default wait before the first "still dialing" warning (ms); the next come at 6 times it. */
export const DIAL_LOG_MS: number;
export const DEFAULT_MAX_ENTRY_BYTES: number;

/** The answers a worker gives; the values are idemproxy.v1.Ack.Status. */
export const Status: Readonly<{ ACK: 1; RETRY: 2; DROP: 3 }>;
export type Status = (typeof Status)[keyof typeof Status];

/** Throw from a handler to DROP the delivery: it is dead-lettered with 'reason' and never retried. */
export class Drop extends Error {
  constructor(reason?: string);
  readonly reason: string;
}

/** idemproxy's cap on Ack.retry_after_ms: an hour. */
export const MAX_RETRY_AFTER_MS: number;

/**
 * Throw from a handler to answer RETRY and have the entry delivered again no earlier than 'ms'
 * from now (whole ms rounded up, at least 1, at most MAX_RETRY_AFTER_MS) instead of idemproxy's
 * backoff (protocol 1.1). Not a handler failure: no 'error' event.
 */
export class RetryAfter extends Error {
  constructor(ms: number, reason?: string);
  readonly ms: number;
  readonly reason: string;
}

/** Throw from a handler to leave the delivery unanswered (idemproxy retries it after ack_timeout_ms). */
export class NoReply extends Error {
  constructor();
}

/** One field of a stream entry. */
export interface Field {
  name: string;
  value: Buffer;
}

/** One event handed over by idemproxy. */
export class Delivery {
  /** the stream key */
  readonly stream: string;
  /** the Redis entry id, "1700000000000-0" */
  readonly entryId: string;
  /** the rendered dedup key */
  readonly key: string;
  /** the entry's fields in stream order, minus the payload field */
  readonly fields: Field[];
  /** the payload field's value, or empty */
  readonly payload: Buffer;
  /** 1 on the first delivery */
  readonly attempt: number;
  /** uint64, strictly increasing per lock; 0n when fencing is off */
  readonly fencingToken: bigint;
  /** the lock fencingToken is for: lock_key's rendered text, else the key; empty when fencing is off */
  readonly lock: string;
  /** epoch ms after which an answer is too late (0: none) */
  readonly deadlineUnixMs: number;
  /** W3C trace context of idemproxy's delivery span (protocol 1.1), or '' */
  readonly traceparent: string;
  /** the W3C tracestate that goes with it, or '' */
  readonly tracestate: string;
  /** The value of the first field called 'name', or undefined. */
  field(name: string): Buffer | undefined;
  /** Decodes an idemproxy.v1.Delivery; throws on malformed input. */
  static decode(bytes: Uint8Array): Delivery;
}

/** What the handler gets besides the delivery. */
export interface HandlerContext {
  /** Aborted (reason: a DOMException named TimeoutError) when the delivery's deadline passes. */
  signal: AbortSignal;
}

/**
 * Handles one delivery. Resolving answers ACK; throwing or rejecting answers RETRY (and
 * emits 'error'); throwing Drop answers DROP; throwing RetryAfter answers RETRY after its ms;
 * throwing NoReply leaves it unanswered.
 */
export type Handler = (delivery: Delivery, context: HandlerContext) => unknown | Promise<unknown>;

export interface WorkerOptions {
  /** idemproxy's app.endpoint, ipc:// or tcp:// (default DEFAULT_ENDPOINT) */
  endpoint?: string;
  /** handlers running at once (default 1) */
  concurrency?: number;
  /** idemproxy's app.max_entry_bytes if raised (default 1 MiB; Infinity: no limit) */
  maxEntryBytes?: number;
  /** ms without a connection before the first "still dialing" warning, then 6 times as long
   *  between the next (default IDEMPROXY_DIAL_LOG_MS, else 5000) */
  dialLogMs?: number;
}

/** A handler's failure, emitted as 'error': 'cause' is what it threw, 'delivery' what it was handling. */
export class HandlerError extends Error {
  constructor(delivery: Delivery, cause: unknown);
  readonly delivery: Delivery;
  readonly cause: unknown;
}

export interface WorkerEvents {
  /** a handler threw or rejected; the delivery was answered RETRY */
  error: [err: HandlerError];
  connect: [];
  disconnect: [err?: Error];
  warn: [err: Error];
}

/** A running worker: a REP connection to idemproxy and up to 'concurrency' handlers at once. */
export class Worker extends EventEmitter {
  constructor(options: WorkerOptions | undefined, handler: Handler);
  /** Deliveries being handled right now. */
  readonly active: number;
  /** Stops taking deliveries, lets the handlers in progress finish and answer, then closes. */
  close(): Promise<void>;
  on<E extends keyof WorkerEvents>(event: E, listener: (...args: WorkerEvents[E]) => void): this;
  once<E extends keyof WorkerEvents>(event: E, listener: (...args: WorkerEvents[E]) => void): this;
  off<E extends keyof WorkerEvents>(event: E, listener: (...args: WorkerEvents[E]) => void): this;
  emit<E extends keyof WorkerEvents>(event: E, ...args: WorkerEvents[E]): boolean;
}

/** Connects to idemproxy and calls 'handler' for each delivery; call close() on the result to stop. */
export function serve(options: WorkerOptions | undefined, handler: Handler): Worker;

/** Encodes an idemproxy.v1.Ack. */
export function encodeAck(ack: { status: Status; reason?: string; stream?: string; entryId?: string; retryAfterMs?: number }): Buffer;
