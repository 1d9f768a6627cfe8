/*
 * idemproxy_inbox.c - the inbox and the fence of docs/database.md on libpq.
 * The SQL is the product: two parameterized statements, run in the caller's
 * transaction, whose row counts say done, stale or go.
 */
#include "idemproxy_inbox.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char INBOX_SQL[] =
    "INSERT INTO idemproxy_inbox (key, stream, entry_id, token) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (key) DO NOTHING";
static const char FENCE_SQL[] =
    "INSERT INTO idemproxy_fence (lock, token) VALUES ($1, $2) ON CONFLICT (lock) "
    "DO UPDATE SET token = EXCLUDED.token WHERE idemproxy_fence.token <= EXCLUDED.token";

/* Writes "inbox: <what>: <PostgreSQL's message>" into err, without the
 * message's trailing newline; returns IDEMPROXY_INBOX_ERR. */
static int db_error(char *err, size_t errlen, const char *what, const char *msg)
{
    size_t n = strlen(msg);

    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        n--;
    if (errlen > 0)
        snprintf(err, errlen, "inbox: %s: %.*s", what, (int) n, msg);
    return IDEMPROXY_INBOX_ERR;
}

/* Runs one statement; returns the rows it inserted or updated, or -1 with err
 * filled. */
static long exec_count(PGconn *conn, const char *sql, int nparams, const char *const *params,
                       const char *what, char *err, size_t errlen)
{
    PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
    long n = -1;

    if (res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK)
        n = strtol(PQcmdTuples(res), NULL, 10);
    else
        db_error(err, errlen, what, res != NULL ? PQresultErrorMessage(res) : PQerrorMessage(conn));
    PQclear(res);
    return n;
}

int idemproxy_inbox_enter(PGconn *conn, const idemproxy_delivery *d, char *err, size_t errlen)
{
    char token[24];
    const char *inbox[4], *fence[2];
    long n;

    if (errlen > 0)
        err[0] = '\0';
    switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
        break;
    case PQTRANS_IDLE:
        return db_error(err, errlen, "not in a transaction", "BEGIN one first");
    default:
        return db_error(err, errlen, "no open transaction",
                        PQstatus(conn) == CONNECTION_BAD ? PQerrorMessage(conn)
                                                         : "a statement of it failed, or a query is running");
    }
    snprintf(token, sizeof(token), "%llu", (unsigned long long) d->fencing_token);
    inbox[0] = d->key;
    inbox[1] = d->stream;
    inbox[2] = d->entry_id;
    inbox[3] = token;
    n = exec_count(conn, INBOX_SQL, 4, inbox, "idemproxy_inbox", err, errlen);
    if (n != 1)
        return n < 0 ? IDEMPROXY_INBOX_ERR : IDEMPROXY_INBOX_DONE;
    if (d->fencing_token == 0)
        return IDEMPROXY_INBOX_RUN;
    /* An idemproxy older than Delivery.lock sends none: fence the key (its
     * tokens came from one counter, so they rise for each key too). */
    fence[0] = d->lock != NULL && d->lock[0] != '\0' ? d->lock : d->key;
    fence[1] = token;
    n = exec_count(conn, FENCE_SQL, 2, fence, "idemproxy_fence", err, errlen);
    if (n != 1)
        return n < 0 ? IDEMPROXY_INBOX_ERR : IDEMPROXY_INBOX_STALE;
    return IDEMPROXY_INBOX_RUN;
}

/* Runs BEGIN, COMMIT or ROLLBACK; returns 1 when the server answered with the
 * command's own tag (a COMMIT of a failed transaction answers ROLLBACK). */
static int exec_tx(PGconn *conn, const char *cmd, char *err, size_t errlen)
{
    PGresult *res = PQexecParams(conn, cmd, 0, NULL, NULL, NULL, NULL, 0);
    int ok = res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK &&
             strcmp(PQcmdStatus(res), cmd) == 0;

    if (!ok && res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK)
        db_error(err, errlen, cmd, "the transaction had failed and was rolled back");
    else if (!ok)
        db_error(err, errlen, cmd, res != NULL ? PQresultErrorMessage(res) : PQerrorMessage(conn));
    PQclear(res);
    return ok;
}

static void say(char *reason, size_t reasonlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *reason, size_t reasonlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(reason, reasonlen, fmt, ap);
    va_end(ap);
}

idemproxy_status idemproxy_inbox_run(PGconn *conn, const idemproxy_delivery *d,
                                     idemproxy_inbox_handler handler, void *arg,
                                     char *reason, size_t reasonlen)
{
    char none[256];
    idemproxy_status st;

    if (reason == NULL || reasonlen == 0) {
        reason = none;
        reasonlen = sizeof(none);
    }
    reason[0] = '\0';
    if (PQtransactionStatus(conn) != PQTRANS_IDLE) {
        db_error(reason, reasonlen, "BEGIN",
                 PQstatus(conn) == CONNECTION_BAD ? PQerrorMessage(conn)
                                                  : "the connection is already in a transaction");
        return IDEMPROXY_STATUS_RETRY;
    }
    if (!exec_tx(conn, "BEGIN", reason, reasonlen))
        return IDEMPROXY_STATUS_RETRY;
    switch (idemproxy_inbox_enter(conn, d, reason, reasonlen)) {
    case IDEMPROXY_INBOX_RUN:
        break;
    case IDEMPROXY_INBOX_DONE:
        exec_tx(conn, "ROLLBACK", none, sizeof(none));
        return IDEMPROXY_STATUS_ACK;
    case IDEMPROXY_INBOX_STALE:
        exec_tx(conn, "ROLLBACK", none, sizeof(none));
        say(reason, reasonlen, "%s", IDEMPROXY_INBOX_STALE_REASON);
        return IDEMPROXY_STATUS_RETRY;
    default:
        exec_tx(conn, "ROLLBACK", none, sizeof(none));
        return IDEMPROXY_STATUS_RETRY;
    }
    st = handler(conn, d, arg, reason, reasonlen);
    if (st != IDEMPROXY_STATUS_ACK) {
        exec_tx(conn, "ROLLBACK", none, sizeof(none));
        if (st != IDEMPROXY_STATUS_RETRY && st != IDEMPROXY_STATUS_DROP) {
            say(reason, reasonlen, "inbox: the handler returned %d, not a status", (int) st);
            st = IDEMPROXY_STATUS_RETRY;
        }
        return st;
    }
    if (!exec_tx(conn, "COMMIT", reason, reasonlen))
        return IDEMPROXY_STATUS_RETRY;
    reason[0] = '\0';
    return IDEMPROXY_STATUS_ACK;
}
