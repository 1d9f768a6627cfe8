/*
 * With @opentelemetry/api installed (an optional peer dependency), each handler runs in a
 * CONSUMER span whose parent is the delivery's traceparent. A test tracer records the spans:
 * no SDK needed, only the API. Its own file: the global provider is per process.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AsyncLocalStorage } from 'node:async_hooks';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { trace, context, ROOT_CONTEXT, SpanKind, SpanStatusCode } from '@opentelemetry/api';
import { serve, Drop, Status } from '../src/index.js';
import { ReqPeer } from './req_peer.js';

const spans = [];
class TestSpan {
  constructor(name, options, ctx) {
    this.name = name;
    this.kind = options.kind;
    this.attributes = { ...options.attributes };
    this.parent = trace.getSpanContext(ctx);
    this.ctx = { traceId: this.parent?.traceId ?? randomBytes(16).toString('hex'),
                 spanId: randomBytes(8).toString('hex'), traceFlags: 1 };
    this.ended = false;
  }
  spanContext() { return this.ctx; }
  setAttribute(k, v) { this.attributes[k] = v; return this; }
  setAttributes(a) { Object.assign(this.attributes, a); return this; }
  addEvent() { return this; }
  addLink() { return this; }
  addLinks() { return this; }
  setStatus(s) { this.status = s; return this; }
  updateName(n) { this.name = n; return this; }
  end() { this.ended = true; }
  isRecording() { return true; }
  recordException(e) { this.exception = e; }
}
const tracer = { startSpan(name, options = {}, ctx = context.active()) {
  const s = new TestSpan(name, options, ctx);
  spans.push(s);
  return s;
} };
trace.setGlobalTracerProvider({ getTracer: () => tracer });

// A context manager on AsyncLocalStorage, so the handler can see its active span.
const als = new AsyncLocalStorage();
context.setGlobalContextManager({
  active: () => als.getStore() ?? ROOT_CONTEXT,
  with: (ctx, fn, thisArg, ...args) => als.run(ctx, () => fn.call(thisArg, ...args)),
  bind: (ctx, target) => target,
  enable() { return this; },
  disable() { return this; },
});

const dir = mkdtempSync(join(tmpdir(), 'idemproxy-node-otel-'));
const TRACE = '0af7651916cd43dd8448eb211c80319c', PARENT = 'b7ad6b7169203331';

test('the handler runs in a CONSUMER span, a child of the delivery\'s traceparent', async () => {
  const peer = await ReqPeer.bind(`ipc://${join(dir, 'a.sock')}`);
  const active = {};
  const worker = serve({ endpoint: peer.endpoint }, async (d) => {
    await new Promise((resolve) => setImmediate(resolve));   // across an await
    active[d.key] = trace.getActiveSpan();
    if (d.key === 'bad') throw new Error('db down');
    if (d.key === 'poison') throw new Drop('cannot parse');
  });
  worker.on('error', () => {});
  try {
    await peer.until(() => peer.conns.length === 1 && peer.conns[0].header);
    peer.deliver(1, { stream: 'orders', entryId: '1-0', key: 'good', attempt: 2,
                      traceparent: `00-${TRACE}-${PARENT}-01`, tracestate: 'vendor=x' });
    peer.deliver(2, { key: 'bad', traceparent: `00-${TRACE}-${PARENT}-01` });
    peer.deliver(3, { key: 'poison' });
    peer.deliver(4, { key: 'malformed', traceparent: `00-${TRACE}-${PARENT}` });
    for (const id of [1, 2, 3, 4]) await peer.ack(id);
    assert.equal((await peer.ack(2)).status, Status.RETRY);
  } finally {
    await worker.close();
    await peer.close();
  }
  const by = Object.fromEntries(spans.map((s) => [s.attributes['idemproxy.key'], s]));
  const good = by.good;
  assert.equal(good.name, 'process orders');
  assert.equal(good.kind, SpanKind.CONSUMER);
  assert.deepEqual([good.parent.traceId, good.parent.spanId, good.parent.isRemote], [TRACE, PARENT, true]);
  assert.equal(good.parent.traceState?.get('vendor'), 'x');
  assert.equal(good.attributes['messaging.destination.name'], 'orders');
  assert.equal(good.attributes['messaging.message.id'], '1-0');
  assert.equal(good.attributes['idemproxy.attempt'], 2);
  assert.equal(good.attributes['idemproxy.answer'], 'ack');
  assert.equal(active.good, good, 'the handler\'s active span');
  assert.ok(spans.every((s) => s.ended));
  assert.equal(by.bad.parent.spanId, PARENT);
  assert.equal(by.bad.attributes['idemproxy.answer'], 'retry');
  assert.equal(by.bad.status.code, SpanStatusCode.ERROR);
  assert.equal(by.bad.exception.message, 'db down');
  assert.equal(by.poison.attributes['idemproxy.answer'], 'drop');
  assert.equal(by.poison.status, undefined);
  assert.equal(by.poison.parent, undefined, 'no traceparent: a new root');
  assert.equal(by.malformed.parent, undefined, 'a malformed traceparent: a new root');
});
