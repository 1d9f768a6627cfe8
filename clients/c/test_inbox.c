/*
 * test_inbox.c - the inbox and the fence (idemproxy_inbox.h) against a real
 * PostgreSQL: the URL in IDEMPROXY_TEST_PG (tests/with-postgres sets it);
 * without it every test is skipped, and says so. Each test works in a fresh
 * schema of its own, set up by the shipped sql/001_idemproxy_inbox.sql, with
 * an "effects" table the handler writes to.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "idemproxy_inbox.h"
#include "test.h"

#define SQL_FILE "sql/001_idemproxy_inbox.sql"

static const char *pg_url;
static char schema[64];   /* the current test's schema */
static char *migration;   /* SQL_FILE's text */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = calloc(1, (size_t) n + 1)) != NULL && fread(buf, 1, (size_t) n, f) != (size_t) n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Test fixture SQL (simple protocol, several statements at once); a failure is a failed test. */
static int exec_ok(PGconn *db, const char *sql)
{
    PGresult *res = PQexec(db, sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;

    if (!ok)
        fprintf(stderr, "SQL failed: %s: %s", sql, PQerrorMessage(db));
    PQclear(res);
    return ok;
}

/* The first column of the first row of 'sql' with one parameter, as a number (-1 on error). */
static long long query_num(PGconn *db, const char *sql, const char *param)
{
    PGresult *res = PQexecParams(db, sql, param ? 1 : 0, NULL, param ? &param : NULL, NULL, NULL, 0);
    long long n = -1;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        n = atoll(PQgetvalue(res, 0, 0));
    else if (PQresultStatus(res) != PGRES_TUPLES_OK)
        fprintf(stderr, "query failed: %s: %s", sql, PQerrorMessage(db));
    PQclear(res);
    return n;
}

#define INBOX_ROWS(db, key) query_num(db, "SELECT count(*) FROM idemproxy_inbox WHERE key = $1", key)
#define EFFECT_ROWS(db, key) query_num(db, "SELECT count(*) FROM effects WHERE key = $1", key)
#define FENCE_TOKEN(db, lock) query_num(db, "SELECT token FROM idemproxy_fence WHERE lock = $1", lock)

/* A connection whose search_path is the current test's schema. */
static PGconn *db_open(void)
{
    PGconn *db = PQconnectdb(pg_url);
    char sql[128];

    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to %s: %s", pg_url, PQerrorMessage(db));
        PQfinish(db);
        return NULL;
    }
    snprintf(sql, sizeof(sql), "SET client_min_messages = warning; SET search_path = %s", schema);
    exec_ok(db, sql);
    return db;
}

/* A fresh schema for test 'name', set up by the shipped migration. */
static PGconn *fresh(const char *name)
{
    PGconn *db;
    char sql[256];

    snprintf(schema, sizeof(schema), "idemproxy_c_%d_%s", (int) getpid(), name);
    if ((db = db_open()) == NULL)
        return NULL;
    snprintf(sql, sizeof(sql), "DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", schema, schema);
    if (!exec_ok(db, sql) || !exec_ok(db, migration) ||
        !exec_ok(db, "CREATE TABLE effects (key text NOT NULL, token bigint NOT NULL)")) {
        PQfinish(db);
        return NULL;
    }
    return db;
}

static void done(PGconn *db)
{
    char sql[128];

    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    exec_ok(db, sql);
    PQfinish(db);
}

static idemproxy_delivery delivery(const char *key, const char *entry_id, uint64_t token, const char *lock)
{
    idemproxy_delivery d;

    memset(&d, 0, sizeof(d));
    d.stream = "orders";
    d.entry_id = entry_id;
    d.key = key;
    d.attempt = 1;
    d.fencing_token = token;
    d.lock = lock;
    d.traceparent = d.tracestate = "";
    return d;
}

/* What the test handler does: writes (key, token) to effects, then optionally
 * runs 'then' (a statement that fails) and answers 'answer'. */
typedef struct handler_arg {
    pthread_mutex_t  mu;
    int              calls;
    idemproxy_status answer;
    const char      *reason;
    const char      *then;
    int              wait_for_waiter; /* 1: hold the transaction until another holder waits on it */
    int              saw_waiter;
    PGconn          *monitor;
} handler_arg;

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

static idemproxy_status handler(PGconn *db, const idemproxy_delivery *d, void *arg, char *reason,
                                size_t reasonlen)
{
    handler_arg *h = arg;
    char token[24];
    const char *params[2] = { d->key, token };
    PGresult *res;
    int i;

    pthread_mutex_lock(&h->mu);
    h->calls++;
    pthread_mutex_unlock(&h->mu);
    snprintf(token, sizeof(token), "%llu", (unsigned long long) d->fencing_token);
    res = PQexecParams(db, "INSERT INTO effects (key, token) VALUES ($1, $2)", 2, NULL, params, NULL, NULL, 0);
    PQclear(res);
    if (h->then != NULL)
        PQclear(PQexec(db, h->then));
    /* Keep the inbox row uncommitted until the other holder blocks on it
     * (10 s at most: a helper without the inbox never makes it wait). */
    for (i = 0; h->wait_for_waiter && i < 1000; i++) {
        if (query_num(h->monitor, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND query LIKE 'INSERT INTO idemproxy_inbox%'", NULL) > 0) {
            h->saw_waiter = 1;
            break;
        }
        sleep_ms(10);
    }
    if (h->reason != NULL)
        snprintf(reason, reasonlen, "%s", h->reason);
    return h->answer;
}

static void handler_init(handler_arg *h)
{
    memset(h, 0, sizeof(*h));
    pthread_mutex_init(&h->mu, NULL);
    h->answer = IDEMPROXY_STATUS_ACK;
}

/* A new key: the handler runs, its write and the inbox row are committed, ACK. */
static void test_new_key(void)
{
    PGconn *db = fresh("new"), *other;
    idemproxy_delivery d = delivery("k1", "1700000000000-1", 5, "k1");
    handler_arg h;
    char reason[256];

    test_cond("new key: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    test_cond("new key: ACK", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_streq("new key: no reason", reason, "");
    test_cond("new key: the handler ran once", h.calls == 1);
    test_cond("new key: out of the transaction", PQtransactionStatus(db) == PQTRANS_IDLE);
    other = db_open(); /* committed: another connection sees it */
    test_cond("new key: effect committed", other && EFFECT_ROWS(other, "k1") == 1);
    test_cond("new key: inbox row committed",
              other && query_num(other, "SELECT count(*) FROM idemproxy_inbox WHERE key = 'k1' AND "
                                 "stream = 'orders' AND entry_id = '1700000000000-1' AND token = 5", NULL) == 1);
    test_cond("new key: fence raised", other && FENCE_TOKEN(other, "k1") == 5);
    PQfinish(other);
    done(db);
}

/* The same key again (a copy, or Redis forgot the done mark): ACK, nothing run or written. */
static void test_done_key(void)
{
    PGconn *db = fresh("done");
    idemproxy_delivery d1 = delivery("k1", "1700000000000-1", 5, "k1");
    idemproxy_delivery d2 = delivery("k1", "1700000000000-2", 9, "k1");
    handler_arg h;
    char reason[256];

    test_cond("done key: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    test_cond("done key: first ACK", idemproxy_inbox_run(db, &d1, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_cond("done key: again ACK", idemproxy_inbox_run(db, &d2, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_streq("done key: no reason", reason, "");
    test_cond("done key: the handler not run again", h.calls == 1);
    test_cond("done key: one effect", EFFECT_ROWS(db, "k1") == 1);
    test_cond("done key: the inbox row is the first's",
              query_num(db, "SELECT count(*) FROM idemproxy_inbox WHERE entry_id = '1700000000000-1' "
                        "AND token = 5", NULL) == 1);
    test_cond("done key: the fence not raised by it", FENCE_TOKEN(db, "k1") == 5);
    test_cond("done key: rolled back", PQtransactionStatus(db) == PQTRANS_IDLE);
    done(db);
}

/* A higher token for the lock wrote first (another key, same lock_key): the
 * lower one is refused and rolled back; the same token is the same holder. */
static void test_stale_token(void)
{
    PGconn *db = fresh("stale");
    idemproxy_delivery a = delivery("a", "1700000000000-1", 200, "room:1");
    idemproxy_delivery b = delivery("b", "1700000000000-2", 100, "room:1");
    idemproxy_delivery c = delivery("c", "1700000000000-3", 200, "room:1");
    idemproxy_delivery b2 = delivery("b", "1700000000000-2", 300, "room:1");
    idemproxy_delivery d = delivery("d", "1700000000000-4", 299, "room:1");
    handler_arg h;
    char reason[256];

    test_cond("stale: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    test_cond("stale: the higher token ACK", idemproxy_inbox_run(db, &a, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_cond("stale: the lower token RETRY", idemproxy_inbox_run(db, &b, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_RETRY);
    test_streq("stale: the reason", reason, "stale fencing token");
    test_cond("stale: its handler did not run", h.calls == 1);
    test_cond("stale: its effect absent", EFFECT_ROWS(db, "b") == 0);
    test_cond("stale: its inbox row absent", INBOX_ROWS(db, "b") == 0);
    test_cond("stale: the fence keeps the higher token", FENCE_TOKEN(db, "room:1") == 200);
    test_cond("stale: rolled back", PQtransactionStatus(db) == PQTRANS_IDLE);
    test_cond("stale: the same token again ACK", idemproxy_inbox_run(db, &c, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_cond("stale: the same token's effect", h.calls == 2 && EFFECT_ROWS(db, "c") == 1);
    /* The refused key's redelivery under a newer token does the work. */
    test_cond("stale: redelivered with a higher token ACK",
              idemproxy_inbox_run(db, &b2, handler, &h, reason, sizeof(reason)) == IDEMPROXY_STATUS_ACK);
    test_cond("stale: now written once", h.calls == 3 && EFFECT_ROWS(db, "b") == 1 && INBOX_ROWS(db, "b") == 1 &&
              FENCE_TOKEN(db, "room:1") == 300);

    /* The step alone, in the caller's transaction: a done key is DONE whatever its token. */
    exec_ok(db, "BEGIN");
    test_cond("stale: enter says STALE", idemproxy_inbox_enter(db, &d, reason, sizeof(reason)) ==
              IDEMPROXY_INBOX_STALE);
    exec_ok(db, "ROLLBACK");
    exec_ok(db, "BEGIN");
    test_cond("stale: a done key's stale token is DONE", idemproxy_inbox_enter(db, &b, reason, sizeof(reason)) ==
              IDEMPROXY_INBOX_DONE);
    exec_ok(db, "ROLLBACK");
    done(db);
}

/* The handler fails: everything rolled back, answered as it asked. */
static void test_handler_error(void)
{
    PGconn *db = fresh("handler");
    idemproxy_delivery d = delivery("k1", "1700000000000-1", 7, "k1");
    handler_arg h;
    char reason[256];

    test_cond("handler error: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    h.answer = IDEMPROXY_STATUS_RETRY;
    h.reason = "payment service down";
    test_cond("handler error: RETRY", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_RETRY);
    test_streq("handler error: its reason", reason, "payment service down");
    test_cond("handler error: effect rolled back", EFFECT_ROWS(db, "k1") == 0);
    test_cond("handler error: inbox row absent", INBOX_ROWS(db, "k1") == 0);
    test_cond("handler error: fence rolled back", FENCE_TOKEN(db, "k1") == -1);
    h.answer = IDEMPROXY_STATUS_DROP;
    h.reason = "invalid order";
    test_cond("handler DROP: DROP", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_DROP);
    test_streq("handler DROP: its reason", reason, "invalid order");
    test_cond("handler DROP: rolled back", EFFECT_ROWS(db, "k1") == 0 && INBOX_ROWS(db, "k1") == 0);
    /* A statement of the handler failed, yet it answered ACK: COMMIT rolls back. */
    h.answer = IDEMPROXY_STATUS_ACK;
    h.reason = NULL;
    h.then = "SELECT 1/0";
    test_cond("commit failure: RETRY", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_RETRY);
    test_cond("commit failure: says so", strncmp(reason, "inbox: COMMIT: ", 15) == 0);
    test_cond("commit failure: rolled back", EFFECT_ROWS(db, "k1") == 0 && INBOX_ROWS(db, "k1") == 0);
    h.then = NULL;
    test_cond("handler error: the next attempt ACK",
              idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) == IDEMPROXY_STATUS_ACK &&
              EFFECT_ROWS(db, "k1") == 1 && INBOX_ROWS(db, "k1") == 1 && h.calls == 4);
    done(db);
}

/* Without fencing (token 0) the fence table is not touched; the inbox works. */
static void test_token_zero(void)
{
    PGconn *db = fresh("zero");
    idemproxy_delivery d = delivery("k1", "1700000000000-1", 0, "");
    handler_arg h;
    char reason[256];

    test_cond("token 0: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    test_cond("token 0: ACK", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_cond("token 0: effect and inbox row", EFFECT_ROWS(db, "k1") == 1 &&
              query_num(db, "SELECT count(*) FROM idemproxy_inbox WHERE key = 'k1' AND token = 0", NULL) == 1);
    test_cond("token 0: the fence untouched", query_num(db, "SELECT count(*) FROM idemproxy_fence", NULL) == 0);
    test_cond("token 0: again ACK, not run", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK && h.calls == 1 && EFFECT_ROWS(db, "k1") == 1);
    /* A token without a lock (an idemproxy older than Delivery.lock): the key is the lock. */
    d = delivery("k2", "1700000000000-2", 8, "");
    test_cond("no lock: ACK", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_ACK);
    test_cond("no lock: the key's fence row", FENCE_TOKEN(db, "k2") == 8 &&
              query_num(db, "SELECT count(*) FROM idemproxy_fence", NULL) == 1);
    done(db);
}

/* Misuse is an error, never an autocommitted inbox row. */
static void test_misuse(void)
{
    PGconn *db = fresh("misuse");
    idemproxy_delivery d = delivery("k1", "1700000000000-1", 3, "k1");
    handler_arg h;
    char reason[256];

    test_cond("misuse: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    test_cond("enter outside a transaction: ERR", idemproxy_inbox_enter(db, &d, reason, sizeof(reason)) ==
              IDEMPROXY_INBOX_ERR && strstr(reason, "not in a transaction") != NULL);
    test_cond("enter outside a transaction: nothing written", INBOX_ROWS(db, "k1") == 0);
    exec_ok(db, "BEGIN");
    test_cond("run inside a transaction: RETRY", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_RETRY && strstr(reason, "already in a transaction") != NULL && h.calls == 0);
    exec_ok(db, "ROLLBACK");
    exec_ok(db, "DROP TABLE idemproxy_fence");
    test_cond("no fence table: RETRY", idemproxy_inbox_run(db, &d, handler, &h, reason, sizeof(reason)) ==
              IDEMPROXY_STATUS_RETRY && strstr(reason, "inbox: idemproxy_fence: ERROR:") == reason &&
              h.calls == 0 && INBOX_ROWS(db, "k1") == 0);
    done(db);
}

typedef struct holder {
    PGconn            *db;
    idemproxy_delivery d;
    handler_arg       *h;
    pthread_barrier_t *start;
    idemproxy_status   status;
    char               reason[256];
} holder;

static void *hold(void *arg)
{
    holder *o = arg;

    pthread_barrier_wait(o->start);
    o->status = idemproxy_inbox_run(o->db, &o->d, handler, o->h, o->reason, sizeof(o->reason));
    return NULL;
}

/* Two holders of one key at once, on two connections: exactly one runs the handler. */
static void test_concurrent(void)
{
    PGconn *db = fresh("concurrent");
    handler_arg h;
    holder o[2];
    pthread_t t[2];
    pthread_barrier_t start;
    int i;

    test_cond("concurrent: schema", db != NULL);
    if (db == NULL)
        return;
    handler_init(&h);
    h.wait_for_waiter = 1;
    h.monitor = db_open();
    pthread_barrier_init(&start, NULL, 2);
    for (i = 0; i < 2; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        o[i].db = db_open();
        o[i].d = delivery("k1", i ? "1700000000000-2" : "1700000000000-1", 10 + (uint64_t) i, "k1");
        o[i].h = &h;
        o[i].start = &start;
    }
    for (i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, hold, &o[i]);
    for (i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    test_cond("concurrent: both ACK", o[0].status == IDEMPROXY_STATUS_ACK && o[1].status == IDEMPROXY_STATUS_ACK);
    test_cond("concurrent: the handler ran once", h.calls == 1);
    test_cond("concurrent: the other waited for it", h.saw_waiter == 1);
    test_cond("concurrent: one effect, one inbox row", EFFECT_ROWS(db, "k1") == 1 && INBOX_ROWS(db, "k1") == 1);
    pthread_barrier_destroy(&start);
    for (i = 0; i < 2; i++)
        PQfinish(o[i].db);
    PQfinish(h.monitor);
    done(db);
}

int main(void)
{
    pg_url = getenv("IDEMPROXY_TEST_PG");
    if (pg_url == NULL || pg_url[0] == '\0') {
        printf("test_inbox: skipped: IDEMPROXY_TEST_PG is not set (../../tests/with-postgres make test "
               "runs these against a throwaway PostgreSQL)\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    migration = read_file(SQL_FILE);
    test_cond("the migration " SQL_FILE " is readable", migration != NULL);
    if (migration == NULL)
        return test_report();
    test_new_key();
    test_done_key();
    test_stale_token();
    test_handler_error();
    test_token_zero();
    test_misuse();
    test_concurrent();
    free(migration);
    return test_report();
}
