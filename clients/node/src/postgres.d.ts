// Type declarations for idemproxy-worker/postgres (src/postgres.js), written by hand: keep them in
// step with postgres.js. Structural types, so they need neither 'pg' nor '@types/pg': a pg.Pool
// and its PoolClient fit them.
import type { Delivery, Handler, HandlerContext } from './index.js';

/**
 * What the helper needs of a pg client (pg.Client, pg.PoolClient). A handler that wants the
 * rest of pg's client types its parameter: withInbox(pool, async (client: pg.PoolClient, d) => ...).
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null; command: string }>;
}

/** What the helper needs of a pg.Pool. */
export interface PoolLike<C extends Queryable = Queryable> {
  connect(): Promise<C & { release(err?: Error | boolean): void }>;
}

/** The path of the package's copy of sql/postgresql/001_idemproxy_inbox.sql: the two tables. */
export const SCHEMA_FILE: string;

/** The reason a refused fencing token is answered RETRY with: 'stale fencing token'. */
export const STALE_REASON: string;

/** Thrown when the fence refuses the delivery's token; the Worker answers RETRY with STALE_REASON. */
export class StaleFencingToken extends Error {
  constructor(delivery: Delivery);
  /** the lock that has a higher token */
  readonly lock: string;
  /** the refused token */
  readonly fencingToken: bigint;
}

/** What claim() found: do the work, the key's effect is already committed, or the token is stale. */
export type ClaimResult = 'run' | 'done' | 'stale';

/**
 * Records d.key in the inbox and, when d.fencingToken > 0, raises the fence of d.lock, on a
 * client inside a transaction the caller began. 'run': do the work, then COMMIT; 'done' and
 * 'stale': roll back (answer ACK and RETRY).
 */
export function claim(client: Queryable, delivery: Delivery): Promise<ClaimResult>;

/** A handler whose writes on 'client' commit with the delivery's inbox row. */
export type InboxHandler<C extends Queryable = Queryable> =
  (client: C, delivery: Delivery, context: HandlerContext) => unknown | Promise<unknown>;

/**
 * A Handler for serve() that runs 'handler' in a transaction on a client of 'pool' with claim():
 * already done → ACK without running it; stale token → rolled back, RETRY; the handler throws →
 * rolled back, answered as its error says; commit fails → RETRY; commit ok → ACK.
 */
export function withInbox<C extends Queryable>(pool: PoolLike<C>, handler: InboxHandler<C>): Handler;
