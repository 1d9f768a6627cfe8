/*
 * idemproxy-worker/postgres against a real PostgreSQL (IDEMPROXY_TEST_PG, set by
 * tests/with-postgres), each test in a fresh schema holding the package's own
 * sql/001_idemproxy_inbox.sql and an 'effects' table the handlers write to.
 * Answers are read off the wire: a Worker serves test/req_peer.js.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { serve, Delivery, Drop, Status } from '../src/index.js';
import { withInbox, claim, SCHEMA_FILE, STALE_REASON, StaleFencingToken } from '../src/postgres.js';
import { ReqPeer, Delivery as DeliveryMsg } from './req_peer.js';

const PG = process.env.IDEMPROXY_TEST_PG;
const skip = PG ? false : 'IDEMPROXY_TEST_PG is unset: run under tests/with-postgres for a PostgreSQL';
const dir = mkdtempSync(join(tmpdir(), 'idemproxy-node-pg-'));
let n = 0;

/** Runs 'fn(db)' in a fresh schema: db.pool() makes pools whose search_path is it, db.q() queries it. */
async function withSchema(fn) {
  const schema = `t_${randomBytes(6).toString('hex')}`;
  const pools = [];
  const pool = () => {
    const p = new pg.Pool({ connectionString: PG, options: `-c search_path=${schema}`, max: 4 });
    pools.push(p);
    return p;
  };
  const admin = pool();
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.query(readFileSync(SCHEMA_FILE, 'utf8'));
  // Deferred, so a duplicate fails at COMMIT, not at the INSERT.
  await admin.query('CREATE TABLE effects (key text, UNIQUE (key) DEFERRABLE INITIALLY DEFERRED)');
  const q = async (sql, values) => (await admin.query(sql, values)).rows;
  try {
    await fn({ pool, q });
  } finally {
    await admin.query(`DROP SCHEMA ${schema} CASCADE`);
    await Promise.all(pools.map((p) => p.end()));
  }
}

/** A Worker running 'handler' against a bound peer; fn(send) where send(fields) resolves the Ack. */
async function withWorker(handler, fn) {
  const peer = await ReqPeer.bind(`ipc://${join(dir, `p${n++}.sock`)}`);
  const worker = serve({ endpoint: peer.endpoint }, handler);
  worker.on('error', () => {});      // a failing handler is the point of some tests
  let id = 0;
  const send = async (fields) => {
    const i = ++id;
    peer.deliver(i, { stream: 'orders', ...fields });
    await peer.until(() => peer.replies.some((r) => (r.id & 0x7fffffff) === i), 20000);
    return peer.ack(i);
  };
  try {
    await peer.until(() => peer.conns.length === 1 && peer.conns[0].header, 10000);
    await fn(send);
  } finally {
    await worker.close();
    await peer.close();
  }
}

const delivery = (fields) => Delivery.decode(DeliveryMsg.encode({ stream: 'orders', attempt: 1, ...fields }).finish());
const write = async (client, d) => { await client.query('INSERT INTO effects (key) VALUES ($1)', [d.key]); };

test('a new key: the handler runs, its write and the inbox row commit, ACK', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    await withWorker(withInbox(pool(), write), async (send) => {
      const a = await send({ key: 'o-1', entryId: '5-1', fencingToken: 1700000000000000, lock: 'o-1' });
      assert.deepEqual([a.status, a.reason], [Status.ACK, '']);
    });
    assert.deepEqual(await q('SELECT key FROM effects'), [{ key: 'o-1' }]);
    assert.deepEqual(await q('SELECT key, stream, entry_id, token FROM idemproxy_inbox'),
                     [{ key: 'o-1', stream: 'orders', entry_id: '5-1', token: '1700000000000000' }]);
    assert.deepEqual(await q('SELECT lock, token FROM idemproxy_fence'), [{ lock: 'o-1', token: '1700000000000000' }]);
  });
});

test('the same key again: the handler does not run, nothing is written, ACK', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    let runs = 0;
    await withWorker(withInbox(pool(), async (c, d) => { runs++; await write(c, d); }), async (send) => {
      assert.equal((await send({ key: 'o-1', entryId: '5-1', fencingToken: 100, lock: 'o-1' })).status, Status.ACK);
      // Redis forgot the done mark: delivered again, under a later token.
      const again = await send({ key: 'o-1', entryId: '5-1', fencingToken: 200, lock: 'o-1' });
      assert.deepEqual([again.status, again.reason], [Status.ACK, '']);
    });
    assert.equal(runs, 1);
    assert.deepEqual(await q('SELECT key FROM effects'), [{ key: 'o-1' }]);
    assert.deepEqual(await q('SELECT entry_id, token FROM idemproxy_inbox'), [{ entry_id: '5-1', token: '100' }]);
    assert.deepEqual(await q('SELECT token FROM idemproxy_fence'), [{ token: '100' }]);   // rolled back too
  });
});

test('a stale token is refused: rolled back, RETRY "stale fencing token"; the same token again is accepted', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    const ran = [];
    await withWorker(withInbox(pool(), async (c, d) => { ran.push(d.key); await write(c, d); }), async (send) => {
      // Two keys on one resource (lock_key): the holder of 'b' took the lock over with a higher token.
      assert.equal((await send({ key: 'b', entryId: '2-0', fencingToken: 200, lock: 'room:1' })).status, Status.ACK);
      const stale = await send({ key: 'a', entryId: '1-0', fencingToken: 100, lock: 'room:1' });
      assert.deepEqual([stale.status, stale.reason], [Status.RETRY, STALE_REASON]);
      assert.equal(STALE_REASON, 'stale fencing token');
      // The holder of token 200 writes again for the lock: accepted.
      assert.equal((await send({ key: 'c', entryId: '3-0', fencingToken: 200, lock: 'room:1' })).status, Status.ACK);
      // 'a' redelivered under a new claim: written.
      assert.equal((await send({ key: 'a', entryId: '1-0', fencingToken: 300, lock: 'room:1' })).status, Status.ACK);
    });
    assert.deepEqual(ran, ['b', 'c', 'a']);
    assert.deepEqual(await q('SELECT key FROM effects ORDER BY key'), [{ key: 'a' }, { key: 'b' }, { key: 'c' }]);
    assert.deepEqual(await q('SELECT key, token FROM idemproxy_inbox ORDER BY key'),
                     [{ key: 'a', token: '300' }, { key: 'b', token: '200' }, { key: 'c', token: '200' }]);
    assert.deepEqual(await q('SELECT lock, token FROM idemproxy_fence'), [{ lock: 'room:1', token: '300' }]);
  });
});

test('a stale token: the rows the handler would write and the inbox row are absent', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    const p = pool();
    const h = withInbox(p, write);
    await h(delivery({ key: 'b', entryId: '2-0', fencingToken: 200, lock: 'room:1' }), {});
    await assert.rejects(h(delivery({ key: 'a', entryId: '1-0', fencingToken: 199, lock: 'room:1' }), {}),
                         (err) => err instanceof StaleFencingToken && err.lock === 'room:1' && err.fencingToken === 199n);
    assert.deepEqual(await q("SELECT key FROM effects WHERE key = 'a'"), []);
    assert.deepEqual(await q("SELECT key FROM idemproxy_inbox WHERE key = 'a'"), []);
    assert.deepEqual(await q('SELECT token FROM idemproxy_fence'), [{ token: '200' }]);
    assert.equal(p.idleCount, p.totalCount);   // the connection went back
  });
});

test('a handler error rolls everything back: RETRY with its message, or DROP when it throws Drop', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    await withWorker(withInbox(pool(), async (c, d) => {
      await write(c, d);
      if (d.key === 'poison') throw new Drop('cannot parse');
      throw new Error('downstream said no');
    }), async (send) => {
      const a = await send({ key: 'o-1', entryId: '5-1', fencingToken: 100, lock: 'o-1' });
      assert.deepEqual([a.status, a.reason], [Status.RETRY, 'downstream said no']);
      const b = await send({ key: 'poison', entryId: '6-1', fencingToken: 101, lock: 'poison' });
      assert.deepEqual([b.status, b.reason], [Status.DROP, 'cannot parse']);
    });
    assert.deepEqual(await q('SELECT key FROM effects'), []);
    assert.deepEqual(await q('SELECT key FROM idemproxy_inbox'), []);
    assert.deepEqual(await q('SELECT lock FROM idemproxy_fence'), []);
  });
});

test('a commit that fails or rolls back answers RETRY and leaves nothing', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    await withWorker(withInbox(pool(), async (c, d) => {
      await write(c, d);
      if (d.key === 'dup') await write(c, d);                                   // fails at COMMIT (deferred)
      if (d.key === 'swallowed') await c.query('SELECT 1/0').catch(() => {});   // COMMIT answers ROLLBACK
    }), async (send) => {
      const dup = await send({ key: 'dup', entryId: '1-0' });
      assert.equal(dup.status, Status.RETRY);
      assert.match(dup.reason, /duplicate key/);
      const sw = await send({ key: 'swallowed', entryId: '2-0' });
      assert.deepEqual([sw.status, sw.reason], [Status.RETRY, 'commit answered ROLLBACK: the transaction was rolled back']);
      assert.equal((await send({ key: 'fine', entryId: '3-0' })).status, Status.ACK);   // the connection is usable
    });
    assert.deepEqual(await q('SELECT key FROM effects'), [{ key: 'fine' }]);
    assert.deepEqual(await q('SELECT key FROM idemproxy_inbox'), [{ key: 'fine' }]);
  });
});

test('token 0 (fencing off): the inbox alone, the fence table untouched', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    let runs = 0;
    await withWorker(withInbox(pool(), async (c, d) => { runs++; await write(c, d); }), async (send) => {
      assert.equal((await send({ key: 'o-1', entryId: '5-1' })).status, Status.ACK);
      assert.equal((await send({ key: 'o-1', entryId: '5-1' })).status, Status.ACK);
      assert.equal((await send({ key: 'o-2', entryId: '5-2' })).status, Status.ACK);
    });
    assert.equal(runs, 2);
    assert.deepEqual(await q('SELECT key, token FROM idemproxy_inbox ORDER BY key'),
                     [{ key: 'o-1', token: '0' }, { key: 'o-2', token: '0' }]);
    assert.deepEqual(await q('SELECT * FROM idemproxy_fence'), []);
  });
});

test('two holders of one key on two connections: exactly one runs the handler', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    let runs = 0, open;
    const gate = new Promise((resolve) => { open = resolve; });
    const handler = async (c, d) => {
      runs++;
      await write(c, d);
      await gate;                  // holds its transaction open while the other one arrives
    };
    // The first holder's lease ran out while it worked; the second claimed the key with a higher token.
    const first = withInbox(pool(), handler)(delivery({ key: 'k', entryId: '1-0', fencingToken: 100, lock: 'k' }), {});
    await until(() => runs === 1);
    const second = withInbox(pool(), handler)(delivery({ key: 'k', entryId: '1-0', fencingToken: 200, lock: 'k' }), {});
    // The second waits on the first's inbox row (or, without an inbox, runs the handler too).
    await until(async () => runs > 1 || (await q(
      "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO idemproxy_inbox%'")).length > 0);
    open();
    await Promise.all([first, second]);     // both resolve: ACK
    assert.equal(runs, 1);
    assert.deepEqual(await q('SELECT key FROM effects'), [{ key: 'k' }]);
    assert.deepEqual(await q('SELECT token FROM idemproxy_inbox'), [{ token: '100' }]);
  });
});

test('claim() on a transaction the caller owns: run, done, stale', { skip }, async () => {
  await withSchema(async ({ pool, q }) => {
    const client = await pool().connect();
    const step = async (fields) => {
      await client.query('BEGIN');
      const got = await claim(client, delivery(fields));
      await client.query(got === 'run' ? 'COMMIT' : 'ROLLBACK');
      return got;
    };
    try {
      assert.equal(await step({ key: 'x', entryId: '1-0', fencingToken: 50, lock: 'L' }), 'run');
      assert.equal(await step({ key: 'x', entryId: '1-0', fencingToken: 60, lock: 'L' }), 'done');
      assert.equal(await step({ key: 'y', entryId: '2-0', fencingToken: 40, lock: 'L' }), 'stale');
      assert.equal(await step({ key: 'y', entryId: '2-0', fencingToken: 50, lock: 'L' }), 'run');
      assert.equal(await step({ key: 'z', entryId: '3-0' }), 'run');
    } finally {
      client.release();
    }
    assert.deepEqual(await q('SELECT key FROM idemproxy_inbox ORDER BY key'), [{ key: 'x' }, { key: 'y' }, { key: 'z' }]);
    assert.deepEqual(await q('SELECT lock, token FROM idemproxy_fence'), [{ lock: 'L', token: '50' }]);
  });
});

test('the package ships a byte-identical copy of sql/postgresql/001_idemproxy_inbox.sql', () => {
  const repo = new URL('../../../sql/postgresql/001_idemproxy_inbox.sql', import.meta.url);
  if (!existsSync(repo)) return;    // outside the repository (an unpacked tarball): nothing to compare
  assert.ok(readFileSync(SCHEMA_FILE).equals(readFileSync(repo)), 'sql/001_idemproxy_inbox.sql differs from the repository\'s');
});

/** Resolves once 'pred()' (maybe async) is true; rejects after 20 s. */
async function until(pred) {
  const end = Date.now() + 20000;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
