/*
 * idemproxy-worker/postgres - the inbox and the fence of docs/database.md, in
 * the PostgreSQL transaction that holds your handler's writes.
 *
 *   import pg from 'pg';
 *   import { serve } from 'idemproxy-worker';
 *   import { withInbox } from 'idemproxy-worker/postgres';
 *
 *   const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 *   serve({ concurrency: 4 }, withInbox(pool, async (client, d) => {
 *     await client.query('UPDATE stock SET n = n - 1 WHERE sku = $1', [d.key]);
 *   }));
 *
 * 'pg' is an optional peer dependency: this module never imports it, it uses
 * the pool you pass (pool.connect(), client.query(), client.release()), and
 * the main module does not load this one. Apply SCHEMA_FILE (the package's
 * sql/001_idemproxy_inbox.sql) once per database first.
 */
import { fileURLToPath } from 'node:url';

/** The path of the package's copy of sql/postgresql/001_idemproxy_inbox.sql: the two tables. */
export const SCHEMA_FILE = fileURLToPath(new URL('../sql/001_idemproxy_inbox.sql', import.meta.url));

/** The reason a refused fencing token is answered RETRY with. */
export const STALE_REASON = 'stale fencing token';

const INBOX = 'INSERT INTO idemproxy_inbox (key, stream, entry_id, token) VALUES ($1, $2, $3, $4) ' +
              'ON CONFLICT (key) DO NOTHING';
const FENCE = 'INSERT INTO idemproxy_fence (lock, token) VALUES ($1, $2) ' +
              'ON CONFLICT (lock) DO UPDATE SET token = EXCLUDED.token WHERE idemproxy_fence.token <= EXCLUDED.token';

/**
 * Thrown by withInbox's handler when the fence refuses the delivery's token: a
 * holder with a higher token for d.lock has written, so this one lost its lease.
 * The Worker answers it RETRY with STALE_REASON (and emits it as an 'error' event's cause).
 */
export class StaleFencingToken extends Error {
  constructor(delivery) {
    super(STALE_REASON);
    this.name = 'StaleFencingToken';
    /** @type {string} the lock that has a higher token */
    this.lock = delivery.lock;
    /** @type {bigint} the refused token */
    this.fencingToken = delivery.fencingToken;
  }
}

/**
 * Steps 1 and 2 of docs/database.md on 'client', inside a transaction the caller
 * began: records d.key in the inbox and, when d.fencingToken > 0, raises the
 * fence of d.lock to it. Resolves 'run' (do the work, then COMMIT), 'done' (the
 * key's effect is already committed: roll back, answer ACK) or 'stale' (a higher
 * token has written: roll back, answer RETRY). Tokens go to pg as strings (bigint).
 */
export async function claim(client, d) {
  const token = d.fencingToken.toString();
  const inbox = await client.query(INBOX, [d.key, d.stream, d.entryId, token]);
  if (inbox.rowCount === 0) return 'done';
  if (d.fencingToken === 0n) return 'run';
  // An idemproxy older than Delivery.lock sends no lock: its tokens were per key.
  const fence = await client.query(FENCE, [d.lock || d.key, token]);
  return fence.rowCount === 0 ? 'stale' : 'run';
}

/**
 * Wraps 'handler(client, delivery, context)' into a Handler for serve(): each
 * delivery runs on a client of 'pool' (a pg.Pool) in one transaction with
 * claim(). Already done: rolled back, the handler not run, resolves (ACK).
 * Stale: rolled back, throws StaleFencingToken (RETRY). Otherwise the handler's
 * writes on 'client' commit with the inbox row (ACK); a handler that throws
 * rolls everything back and its error goes on to the Worker (RETRY; Drop,
 * RetryAfter and NoReply keep their meaning); a commit that fails or rolls
 * back throws (RETRY).
 */
export function withInbox(pool, handler) {
  if (typeof pool?.connect !== 'function') throw new TypeError('withInbox() needs a pg.Pool');
  if (typeof handler !== 'function') throw new TypeError('withInbox() needs a handler function');
  return async (d, context) => {
    const client = await pool.connect();
    let step, broken;
    try {
      await client.query('BEGIN');
      step = await claim(client, d);
      if (step === 'run') {
        await handler(client, d, context);
        // COMMIT of a transaction that had a failed statement rolls it back, without an error.
        const res = await client.query('COMMIT');
        if (res.command !== 'COMMIT') throw new Error(`commit answered ${res.command}: the transaction was rolled back`);
        return;
      }
      await client.query('ROLLBACK');
    } catch (err) {
      // Harmless after a failed COMMIT; a connection that cannot roll back is not reused.
      await client.query('ROLLBACK').catch((e) => { broken = e; });
      throw err;
    } finally {
      client.release(broken);
    }
    if (step === 'stale') throw new StaleFencingToken(d);
  };
}
