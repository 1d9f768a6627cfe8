/*
 * example/worker.js - an idemproxy worker built on idemproxy-worker.
 *
 *   node example/worker.js [--endpoint URL]     (or make example ENDPOINT=URL)
 *
 * It connects to idemproxy (which may start later: the client keeps dialing),
 * answers every delivery and prints one line per delivery on stdout,
 * "<key> attempt=<n>". Everything else goes to stderr. SIGTERM or SIGINT:
 * the deliveries in hand are finished and answered, then it exits 0.
 *
 * The environment turns it into a test double, as clients/c/example_worker.c:
 *   IDEMPROXY_ENDPOINT   endpoint when --endpoint is not given
 *   WORKER_CONCURRENCY   handle up to n deliveries at once (1)
 *   WORKER_DELAY_MS      work this long before answering each delivery
 *   WORKER_RETRY_KEYS    k1,k2: answer RETRY while attempt <= WORKER_RETRY_TIMES (1)
 *   WORKER_RETRY_AFTER_MS  n > 0: those RETRYs ask to come again after n ms (RetryAfter)
 *                        instead of idemproxy's backoff
 *   WORKER_DROP_KEYS     k3: answer DROP, reason "dropped by worker"
 *   WORKER_NOACK_KEYS    k4: never answer (idemproxy's ack timeout fires)
 *   WORKER_CRASH_KEYS    k5: exit(3) on receipt, unanswered, as a crash would
 *   WORKER_MAX_BYTES     app.max_entry_bytes, if it was raised (-1: no limit)
 *   WORKER_VERBOSE=1     describe each delivery and connection on stderr
 *   WORKER_SLOW_KEYS     k6: work WORKER_SLOW_MS (1000) on these before answering
 *   WORKER_DEADLINE_KEYS k7: work WORKER_SLOW_MS on these, but stop when the handler's
 *                        AbortSignal aborts (the delivery's deadline) and answer RETRY
 *   WORKER_REPORT        a file: one JSON object per answered delivery is appended
 *                        (tests/integration/test_clients.py reads it; remaining_ms is the
 *                        time left at the start, -1 without a deadline; stopped is "signal"
 *                        when the AbortSignal ended the work)
 *
 * With WORKER_REPORT and OpenTelemetry's SDK at hand (the devDependencies), it registers a
 * tracer provider (no exporter) and a context manager, so each handler runs in a real span;
 * the report gives that span's trace id and parent span id (span_trace_id, span_parent_id).
 */
import { appendFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { serve, Drop, NoReply, RetryAfter, DEFAULT_ENDPOINT } from '../src/index.js';

const env = process.env;

/** The active span's trace id and parent span id, when the SDK is there. */
let spanIds = () => ({ span_trace_id: '', span_parent_id: '' });
if (env.WORKER_REPORT) try {
  const [{ trace, context }, { BasicTracerProvider }, { AsyncLocalStorageContextManager }] = await Promise.all([
    import('@opentelemetry/api'), import('@opentelemetry/sdk-trace-base'), import('@opentelemetry/context-async-hooks')]);
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(new BasicTracerProvider());
  spanIds = () => {
    const span = trace.getActiveSpan();
    return { span_trace_id: span?.spanContext().traceId ?? '', span_parent_id: span?.parentSpanContext?.spanId ?? '' };
  };
} catch { /* no OpenTelemetry SDK: no spans */ }
const keys = (name) => new Set((env[name] ?? '').split(',').filter(Boolean));
const int = (name, dflt) => {
  const v = Number.parseInt(env[name] ?? '', 10);
  return Number.isNaN(v) ? dflt : v;
};

let endpoint = env.IDEMPROXY_ENDPOINT || DEFAULT_ENDPOINT;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--endpoint' && i + 1 < args.length) {
    endpoint = args[++i];
  } else {
    console.error(`usage: node example/worker.js [--endpoint URL]   (default ${DEFAULT_ENDPOINT})`);
    process.exit(args[i] === '--help' ? 0 : 2);
  }
}

const retryKeys = keys('WORKER_RETRY_KEYS'), dropKeys = keys('WORKER_DROP_KEYS');
const noackKeys = keys('WORKER_NOACK_KEYS'), crashKeys = keys('WORKER_CRASH_KEYS');
const slowKeys = keys('WORKER_SLOW_KEYS'), deadlineKeys = keys('WORKER_DEADLINE_KEYS');
const retryTimes = int('WORKER_RETRY_TIMES', 1), delayMs = int('WORKER_DELAY_MS', 0);
const slowMs = int('WORKER_SLOW_MS', 1000), maxBytes = int('WORKER_MAX_BYTES', 0);
const retryAfterMs = int('WORKER_RETRY_AFTER_MS', 0);
const verbose = int('WORKER_VERBOSE', 0) !== 0;

/** Appends one JSON line about 'd' to WORKER_REPORT (one write: lines never interleave). */
function report(d, status, start, end, remaining = -1, stopped = '') {
  if (!env.WORKER_REPORT) return;
  const text = (buf) => buf.toString('utf8');
  const fields = Object.fromEntries(d.fields.map((f) => [f.name, text(f.value)]));
  const head = JSON.stringify({ key: d.key, stream: d.stream, entry_id: d.entryId, attempt: d.attempt });
  const tail = JSON.stringify({ deadline_unix_ms: d.deadlineUnixMs, payload: text(d.payload), fields,
                                status, start_ms: start, end_ms: end,
                                traceparent: d.traceparent, tracestate: d.tracestate, ...spanIds(),
                                remaining_ms: remaining, stopped });
  // The fencing token is a uint64 bigint, which JSON.stringify refuses: written as a plain number.
  appendFileSync(env.WORKER_REPORT, `${head.slice(0, -1)},"fencing_token":${d.fencingToken},${tail.slice(1)}\n`);
}

const worker = serve({ endpoint, concurrency: Math.max(1, int('WORKER_CONCURRENCY', 1)),
                       ...(maxBytes !== 0 && { maxEntryBytes: maxBytes < 0 ? Infinity : maxBytes }) }, async (d, { signal }) => {
  if (verbose) {
    console.error(`delivery ${d.stream} ${d.entryId} key=${d.key} attempt=${d.attempt} ` +
                  `fencing=${d.fencingToken} deadline=${d.deadlineUnixMs}`);
    for (const f of d.fields) console.error(`  ${f.name} = ${f.value}`);
    console.error(`  payload = ${d.payload}`);
  }
  if (crashKeys.has(d.key)) {
    console.error(`example_worker: crashing on ${d.key} as asked`);
    process.exit(3);
  }
  if (noackKeys.has(d.key)) {
    process.stdout.write(`${d.key} attempt=${d.attempt}\n`);
    throw new NoReply();
  }
  const start = Date.now();
  const remaining = d.deadlineUnixMs === 0 ? -1 : d.deadlineUnixMs - start;
  let status = 'ack', stopped = '';
  try {
    // No await when there is nothing to wait for: even sleep(0) is a timer, about 1 ms a delivery.
    if (delayMs > 0) await sleep(delayMs);
    if (slowKeys.has(d.key) && slowMs > 0) await sleep(slowMs);
    if (deadlineKeys.has(d.key)) {
      try {
        await sleep(slowMs, undefined, { signal });
      } catch (err) {
        if (!signal.aborted) throw err;
        status = 'retry';
        stopped = 'signal';    // the delivery's deadline
        throw signal.reason;
      }
    }
    if (dropKeys.has(d.key)) {
      status = 'drop';
      throw new Drop('dropped by worker');
    }
    if (retryKeys.has(d.key) && d.attempt <= retryTimes) {
      status = 'retry';
      if (retryAfterMs > 0) throw new RetryAfter(retryAfterMs, 'retry requested by worker');
      throw new Error('retry requested by worker');
    }
  } finally {
    report(d, status, start, Date.now(), remaining, stopped);
    process.stdout.write(`${d.key} attempt=${d.attempt}\n`);
  }
});

worker.on('error', (err) => console.error(`example_worker: ${err.message}`));   // a handler threw
worker.on('warn', (err) => console.error(`example_worker: ${err.message}`));
if (verbose) {
  worker.on('connect', () => console.error(`example_worker: connected to ${endpoint}`));
  worker.on('disconnect', (err) => console.error(`example_worker: disconnected${err ? `: ${err.message}` : ''}`));
}
console.error(`example_worker: waiting for deliveries on ${endpoint}`);

const stop = () => worker.close().then(() => process.exit(0));
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
