/* The client against test/req_peer.js, a raw SP REQ peer like idemproxy's, over real sockets. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { serve, Drop, NoReply, RetryAfter, Delivery, Status, HandlerError } from '../src/index.js';
import protobuf from 'protobufjs/minimal.js';
import { ReqPeer, Delivery as DeliveryMsg, Ack as AckMsg } from './req_peer.js';

const dir = mkdtempSync(join(tmpdir(), 'idemproxy-node-'));
let n = 0;
const ipc = () => `ipc://${join(dir, `t${n++}.sock`)}`;

/** Runs 'fn(peer, worker)' with a bound peer and a connected worker, then closes both. */
async function withPair(handler, fn, { endpoint = ipc(), ...opts } = {}) {
  const peer = await ReqPeer.bind(endpoint);
  const worker = serve({ endpoint: peer.endpoint, ...opts }, handler);
  try {
    await peer.until(() => peer.conns.length === 1 && peer.conns[0].header);
    await fn(peer, worker);
  } finally {
    await worker.close();
    await peer.close();
  }
}

test('resolve acks, throw retries with the message, Drop drops; ids echoed, request id routed back', async () => {
  await withPair(async (d) => {
    if (d.key === 'bad') throw new Error('db down');
    if (d.key === 'poison') throw new Drop('cannot parse');
    if (d.key === 'str') throw 'plain string';      // eslint-disable-line no-throw-literal
  }, async (peer) => {
    assert.deepEqual(peer.conns[0].header, Buffer.from([0, 0x53, 0x50, 0, 0, 49, 0, 0]));
    peer.deliver(1, { key: 'good' });
    peer.deliver(2, { key: 'bad' });
    peer.deliver(3, { key: 'poison' });
    peer.deliver(4, { key: 'str' });
    assert.deepEqual(await peer.ack(1), { status: Status.ACK, reason: '', stream: 's', entryId: '1-0', raw: (await peer.ack(1)).raw });
    const bad = await peer.ack(2), poison = await peer.ack(3), str = await peer.ack(4);
    assert.equal(bad.status, Status.RETRY);
    assert.equal(bad.reason, 'db down');
    assert.equal(bad.entryId, '2-0');
    assert.equal(poison.status, Status.DROP);
    assert.equal(poison.reason, 'cannot parse');
    assert.equal(str.status, Status.RETRY);
    assert.equal(str.reason, 'plain string');
    assert.equal(peer.replies[0].id >>> 0, (1 | 0x80000000) >>> 0);   // top bit kept
  });
});

test('a delivery decodes into typed fields: ordered fields, Buffers, bigint fencing token', async () => {
  let got;
  await withPair(async (d) => { got = d; }, async (peer) => {
    peer.deliver(7, {
      stream: 'orders', entryId: '1700000000000-3', key: 'o-1', payload: Buffer.from([0xff, 0, 1]),
      fields: [{ name: 'z', value: Buffer.from('1') }, { name: 'a', value: Buffer.from('2') }, { name: 'z', value: Buffer.from('3') }],
      attempt: 4, fencingToken: '18446744073709551615', deadlineUnixMs: 4102444800000, lock: 'room:7',
    });
    await peer.ack(7);
  });
  assert.ok(got instanceof Delivery);
  assert.equal(got.stream, 'orders');
  assert.equal(got.entryId, '1700000000000-3');
  assert.equal(got.key, 'o-1');
  assert.deepEqual(got.fields.map((f) => [f.name, f.value.toString()]), [['z', '1'], ['a', '2'], ['z', '3']]);
  assert.ok(Buffer.isBuffer(got.fields[0].value) && Buffer.isBuffer(got.payload));
  assert.deepEqual(got.payload, Buffer.from([0xff, 0, 1]));
  assert.equal(got.field('z').toString(), '1');
  assert.equal(got.field('missing'), undefined);
  assert.equal(got.attempt, 4);
  assert.equal(got.fencingToken, 18446744073709551615n);
  assert.equal(got.lock, 'room:7');
  assert.equal(got.deadlineUnixMs, 4102444800000);
});

test('a handler failure is an error event (HandlerError: cause, delivery); Drop and NoReply are not', async () => {
  const boom = new Error('db down');
  await withPair(async (d) => {
    if (d.key === 'bad') throw boom;
    if (d.key === 'poison') throw new Drop('cannot parse');
    if (d.key === 'quiet') throw new NoReply();
  }, async (peer, worker) => {
    const errors = [];
    worker.on('error', (e) => errors.push(e));
    peer.deliver(1, { key: 'poison' });
    peer.deliver(2, { key: 'quiet' });
    peer.deliver(3, { key: 'bad', attempt: 2 });
    assert.equal((await peer.ack(3)).status, Status.RETRY);
    assert.equal((await peer.ack(1)).status, Status.DROP);
    await peer.until(() => errors.length > 0);
    await sleep(50);
    assert.equal(errors.length, 1);
    assert.ok(errors[0] instanceof HandlerError);
    assert.equal(errors[0].cause, boom);
    assert.equal(errors[0].delivery.key, 'bad');
    assert.match(errors[0].message, /key=bad attempt=2: handler failed, answered RETRY: db down/);
  });
});

test('without an error listener a handler failure is a process warning, not a crash', async () => {
  const warnings = [];
  const onWarning = (w) => warnings.push(w);
  process.on('warning', onWarning);
  try {
    await withPair(async () => { throw new Error('nobody listens'); }, async (peer) => {
      peer.deliver(1, { key: 'k' });
      assert.equal((await peer.ack(1)).status, Status.RETRY);
      await peer.until(() => warnings.length > 0);
    });
  } finally {
    process.off('warning', onWarning);
  }
  assert.ok(warnings[0] instanceof HandlerError);
  assert.match(warnings[0].message, /nobody listens/);
});

test('the handler\'s signal aborts with a TimeoutError when the deadline passes, not before', async () => {
  const seen = {};
  await withPair(async (d, { signal }) => {
    if (d.key === 'late') {
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      seen.late = { at: Date.now(), deadline: d.deadlineUnixMs, reason: signal.reason };
      throw signal.reason;
    }
    await sleep(100);
    seen[d.key] = signal.aborted;
  }, async (peer) => {
    peer.deliver(1, { key: 'late', deadlineUnixMs: Date.now() + 300 });
    peer.deliver(2, { key: 'none', deadlineUnixMs: 0 });
    peer.deliver(3, { key: 'far', deadlineUnixMs: 4102444800000 });   // beyond setTimeout's range
    const late = await peer.ack(1);
    assert.equal(late.status, Status.RETRY);
    assert.match(late.reason, /deadline \d+ passed/);
    assert.equal((await peer.ack(2)).status, Status.ACK);
    assert.equal((await peer.ack(3)).status, Status.ACK);
  }, { concurrency: 3 });
  assert.equal(seen.late.reason.name, 'TimeoutError');
  assert.ok(seen.late.at >= seen.late.deadline, `aborted ${seen.late.deadline - seen.late.at} ms early`);
  assert.equal(seen.none, false);
  assert.equal(seen.far, false);
});

test('an undecodable delivery is answered RETRY without calling the handler', async () => {
  let calls = 0;
  await withPair(async () => { calls++; }, async (peer, worker) => {
    const warnings = [];
    worker.on('warn', (e) => warnings.push(e.message));
    peer.send(9, Buffer.from([0x0a, 0xff, 0xff]));   // a string field longer than the message
    const a = await peer.ack(9);
    assert.equal(a.status, Status.RETRY);
    assert.match(a.reason, /undecodable/);
    assert.equal(calls, 0);
    assert.equal(warnings.length, 1);
  });
});

test('a lock that is not UTF-8 does not decode, as in the other clients', () => {
  assert.throws(() => Delivery.decode(Buffer.from([0x5a, 0x01, 0xff])), /field 11 is not UTF-8/);   // field 11, 1 byte
  assert.equal(Delivery.decode(Buffer.from([0x5a, 0x01, 0x61])).lock, 'a');
});

test('up to "concurrency" handlers run at once on one connection, answers go back in any order', async () => {
  let running = 0, most = 0;
  await withPair(async (d) => {
    running++;
    most = Math.max(most, running);
    await sleep(d.key === 'slow' ? 300 : 100);
    running--;
  }, async (peer) => {
    peer.deliver(1, { key: 'slow' });
    for (let i = 2; i <= 6; i++) peer.deliver(i, { key: `k${i}` });
    for (let i = 1; i <= 6; i++) assert.equal((await peer.ack(i)).status, Status.ACK);
    assert.equal(most, 3);
    assert.notEqual(peer.replies[0].id & 0x7fffffff, 1);   // the slow one was not first back
  }, { concurrency: 3 });
});

test('concurrency 1 handles deliveries one after another', async () => {
  const spans = [];
  await withPair(async () => {
    const start = Date.now();
    await sleep(50);
    spans.push([start, Date.now()]);
  }, async (peer) => {
    peer.deliver(1, { key: 'a' });
    peer.deliver(2, { key: 'b' });
    await peer.ack(2);
    assert.ok(spans[1][0] >= spans[0][1]);
  });
});

test('NoReply leaves a delivery unanswered and frees its slot', async () => {
  await withPair(async (d) => { if (d.key === 'quiet') throw new NoReply(); }, async (peer) => {
    peer.deliver(1, { key: 'quiet' });
    peer.deliver(2, { key: 'next' });
    await peer.ack(2);
    await sleep(50);
    assert.deepEqual(peer.replies.map((r) => r.id & 0x7fffffff), [2]);
  });
});

test('a backtrace of several hops is echoed whole; a request without a request id is ignored', async () => {
  await withPair(async () => {}, async (peer, worker) => {
    const warnings = [];
    worker.on('warn', (e) => warnings.push(e.message));
    peer.sendRaw(Buffer.from([0, 0, 0, 5, 0, 0, 0, 6]));                 // no top bit anywhere
    const body = Buffer.from(DeliveryMsg.encode({ stream: 's', entryId: '3-0', key: 'k' }).finish());
    peer.sendRaw(Buffer.concat([Buffer.from([0, 0, 0, 7, 0x80, 0, 0, 3]), body]));
    await peer.until(() => peer.replies.length === 1);
    const raw = peer.replies[0];
    assert.equal(raw.id, 7);                                              // first hop as sent
    assert.deepEqual(raw.body.subarray(0, 4), Buffer.from([0x80, 0, 0, 3]));
    assert.equal(warnings.length, 1);
  });
});

test('the worker dials until the peer binds, and again after the peer restarts', async () => {
  const endpoint = ipc();
  const worker = serve({ endpoint }, async () => {});
  const events = [];
  worker.on('connect', () => events.push('connect'));
  worker.on('disconnect', () => events.push('disconnect'));
  await sleep(300);                                   // nobody there: ENOENT, then redials
  let peer = await ReqPeer.bind(endpoint);
  await peer.until(() => peer.conns.length === 1 && peer.conns[0].header, 3000);
  peer.deliver(1, { key: 'a' });
  assert.equal((await peer.ack(1)).status, Status.ACK);
  await peer.close();
  peer = await ReqPeer.bind(endpoint);
  await peer.until(() => peer.conns.length === 1 && peer.conns[0].header, 3000);
  peer.deliver(2, { key: 'b' });
  assert.equal((await peer.ack(2)).status, Status.ACK);
  await worker.close();
  await peer.close();
  assert.deepEqual(events, ['connect', 'disconnect', 'connect', 'disconnect']);
});

test('tcp:// uses frames without the type byte', async () => {
  await withPair(async () => {}, async (peer) => {
    peer.deliver(1, { key: 'over-tcp' });
    assert.equal((await peer.ack(1)).entryId, '1-0');
  }, { endpoint: 'tcp://127.0.0.1:0' });
});

test('a peer that is not REQ, or a message over maxEntryBytes (+ the SP header), closes the connection', async () => {
  const other = await ReqPeer.bind(ipc(), { proto: 0x10 });   // PAIR
  const w1 = serve({ endpoint: other.endpoint }, async () => {});
  const warned = new Promise((resolve) => w1.once('warn', resolve));
  assert.match((await warned).message, /protocol 16, not REQ/);
  await w1.close();
  await other.close();

  await withPair(async () => {}, async (peer, worker) => {
    const warned2 = new Promise((resolve) => worker.once('warn', resolve));
    peer.deliver(1, { key: 'big', payload: Buffer.alloc(2000) });
    assert.match((await warned2).message, /over maxMessageBytes 1032/);
    await peer.until(() => peer.conns[0].closed);
    await peer.until(() => peer.conns.length === 2 && peer.conns[1].header);   // and it dials again
    peer.deliver(2, { key: 'small' });
    assert.equal((await peer.ack(2)).status, Status.ACK);
  }, { maxEntryBytes: 1000 });
});

test('close() lets handlers in progress finish and answer', async () => {
  const peer = await ReqPeer.bind(ipc());
  const worker = serve({ endpoint: peer.endpoint, concurrency: 2 }, async () => { await sleep(200); });
  await peer.until(() => peer.conns.length === 1 && peer.conns[0].header);
  peer.deliver(1, { key: 'a' });
  await sleep(50);
  await worker.close();
  assert.equal((await peer.ack(1)).status, Status.ACK);
  await peer.until(() => peer.conns[0].closed);
  await peer.close();
});

test('without a connection the worker warns that it is still dialing, and where, until connected', async () => {
  const endpoint = ipc();
  const warnings = [];
  const worker = serve({ endpoint, dialLogMs: 300 }, async () => {});
  worker.on('warn', (err) => warnings.push(err.message));
  const dialing = () => warnings.filter((m) => m.startsWith(`still dialing ${endpoint}: no connection to idemproxy for `));
  try {
    for (let i = 0; i < 200 && dialing().length < 2; i++) await sleep(50);   // the first, one 6 x 300 ms later
    assert.ok(dialing().length >= 2, JSON.stringify(warnings));
    const peer = await ReqPeer.bind(endpoint);
    try {
      await peer.until(() => peer.conns.length === 1 && peer.conns[0].header);
      const before = dialing().length;
      await sleep(2500);                                                      // connected: quiet
      assert.equal(dialing().length, before);
    } finally {
      await worker.close();
      await peer.close();
    }
  } finally {
    await worker.close();
  }
});

test('IDEMPROXY_DIAL_LOG_MS sets the wait; without a warn listener it is a process warning', async () => {
  const endpoint = ipc();
  process.env.IDEMPROXY_DIAL_LOG_MS = '200';
  const seen = [];
  const onWarning = (w) => seen.push(w.message);
  process.on('warning', onWarning);
  const worker = serve({ endpoint }, async () => {});
  try {
    for (let i = 0; i < 100 && seen.length === 0; i++) await sleep(50);
    assert.ok(seen.some((m) => m.startsWith(`still dialing ${endpoint}`)), JSON.stringify(seen));
  } finally {
    delete process.env.IDEMPROXY_DIAL_LOG_MS;
    process.off('warning', onWarning);
    await worker.close();
  }
});

/** The varint in field 5 of the protobuf 'bytes', read off the wire, or undefined. */
function field5(bytes) {
  const r = protobuf.Reader.create(bytes);
  let v;
  while (r.pos < r.len) {
    const tag = r.uint32();
    if (tag === (5 << 3)) v = r.uint32();
    else r.skipType(tag & 7);
  }
  return v;
}

test('RetryAfter answers RETRY with retry_after_ms (field 5): rounded up, at least 1, at most an hour; no error event', async () => {
  const errors = [];
  await withPair(async (d) => {
    if (d.key === 'later') throw new RetryAfter(1500);
    if (d.key === 'frac') throw new RetryAfter(2.5, 'rate limited');
    if (d.key === 'now') throw new RetryAfter(0);
    if (d.key === 'tomorrow') throw new RetryAfter(86400000);
    throw new Error('plain');
  }, async (peer, worker) => {
    worker.on('error', (e) => errors.push(e));
    const want = { later: [1500, 'retry after 1500 ms'], frac: [3, 'rate limited'], now: [1, 'retry after 0 ms'],
                   tomorrow: [3600000, 'retry after 86400000 ms'], plain: [0, 'plain'] };
    let id = 0;
    for (const [key, [ms, reason]] of Object.entries(want)) {
      peer.deliver(++id, { key });
      const a = await peer.ack(id);
      assert.equal(a.status, Status.RETRY, key);
      assert.equal(a.reason, reason, key);
      assert.equal(AckMsg.decode(a.raw.body).retryAfterMs, ms, key);
      assert.equal(field5(a.raw.body), ms === 0 ? undefined : ms, key);   // on the wire only when set
    }
    assert.deepEqual(errors.map((e) => e.delivery.key), ['plain']);
  });
});

test('the delivery carries its W3C trace context (protocol 1.1)', async () => {
  let got;
  const tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  await withPair(async (d) => { got = d; }, async (peer) => {
    peer.deliver(1, { key: 'k', traceparent: tp, tracestate: 'x=1' });
    await peer.ack(1);
    peer.deliver(2, { key: 'none' });
    await peer.ack(2);
  });
  assert.equal(got.key, 'none');
  assert.equal(got.traceparent, '');
  assert.equal(got.tracestate, '');
  const d = Delivery.decode(DeliveryMsg.encode({ key: 'k', traceparent: tp, tracestate: 'x=1' }).finish());
  assert.equal(d.traceparent, tp);
  assert.equal(d.tracestate, 'x=1');
});
