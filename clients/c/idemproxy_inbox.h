/*
 * idemproxy_inbox.h - the inbox and the fence in your PostgreSQL transaction
 * (docs/database.md): a delivery's effect lands once, and a holder whose
 * lease was lost cannot write after the one that took over.
 *
 * A separate library, libidemproxy_inbox (on libpq), so that a worker that
 * does not use it links no libpq: build with
 * `pkg-config --cflags --libs idemproxy-inbox libpq`. Apply
 * 001_idemproxy_inbox.sql (installed in $PREFIX/share/idemproxy/) to the
 * database once. Both functions run only the statements of docs/database.md,
 * with PQexecParams, on the connection given; one PGconn belongs to one thread.
 *
 *     static idemproxy_status handle(PGconn *db, const idemproxy_delivery *d, void *arg,
 *                                    char *reason, size_t reasonlen)
 *     {
 *         ...PQexecParams(db, "INSERT INTO orders ...", ...): the writes of d's effect...
 *         return IDEMPROXY_STATUS_ACK;     (or RETRY/DROP with a reason: rolled back)
 *     }
 *     ...
 *     char reason[256];
 *     idemproxy_status st = idemproxy_inbox_run(db, d, handle, NULL, reason, sizeof(reason));
 *     idemproxy_client_reply(c, d, st, reason[0] ? reason : NULL);
 */
#ifndef IDEMPROXY_INBOX_H
#define IDEMPROXY_INBOX_H

#include <stddef.h>

#include <libpq-fe.h>

#include "idemproxy_client.h"

/* What idemproxy_inbox_enter() found. */
#define IDEMPROXY_INBOX_ERR   -1  /* a statement failed (err says why): roll back, answer RETRY */
#define IDEMPROXY_INBOX_RUN    0  /* inbox row written, fence passed: run the handler, then COMMIT */
#define IDEMPROXY_INBOX_DONE   1  /* the key is in the inbox: roll back, answer ACK, run nothing */
#define IDEMPROXY_INBOX_STALE  2  /* a higher token for the lock has written: roll back, answer
                                     RETRY with IDEMPROXY_INBOX_STALE_REASON */

#define IDEMPROXY_INBOX_STALE_REASON "stale fencing token"

/* The step for a caller with its own transaction handling: in the transaction
 * the caller began on 'conn' (BEGIN; an error without one), records d->key in
 * idemproxy_inbox and, when d->fencing_token > 0, raises d->lock's row in
 * idemproxy_fence to it (d->key when an older idemproxy sent no lock).
 * Returns IDEMPROXY_INBOX_RUN, _DONE, _STALE or _ERR (with 'err', 'errlen'
 * bytes, filled). Only after RUN may the caller's writes follow and commit;
 * after anything else the caller rolls back. */
int idemproxy_inbox_enter(PGconn *conn, const idemproxy_delivery *d, char *err, size_t errlen);

/* The handler idemproxy_inbox_run() calls inside its transaction: its writes go
 * on 'conn'. IDEMPROXY_STATUS_ACK commits them; RETRY or DROP rolls back and
 * is the answer, with the reason the handler wrote in 'reason' ('reasonlen'
 * bytes, "" on entry). */
typedef idemproxy_status (*idemproxy_inbox_handler)(PGconn *conn, const idemproxy_delivery *d,
                                                    void *arg, char *reason, size_t reasonlen);

/* BEGIN on 'conn' (which must be outside a transaction), idemproxy_inbox_enter(),
 * then 'handler' (given 'arg') and COMMIT; anything but a commit rolls back.
 * Returns the answer for d, with its reason in 'reason' ("" for none):
 *   - the key already done: ACK, the handler not run;
 *   - a stale fencing token: RETRY, "stale fencing token";
 *   - the handler's RETRY or DROP, with its reason;
 *   - a database error, the commit's included: RETRY, "inbox: <what PostgreSQL said>";
 *   - committed: ACK. */
idemproxy_status idemproxy_inbox_run(PGconn *conn, const idemproxy_delivery *d,
                                     idemproxy_inbox_handler handler, void *arg,
                                     char *reason, size_t reasonlen);

#endif
