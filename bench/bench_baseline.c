/*
 * bench_baseline.c - the baselines of `make bench`, run on the stream the
 * producer wrote, with one blocking hiredis connection and no proxy.
 *
 * Modes a and b read the stream with XRANGE in pages of --batch entries, parse each
 * entry's "payload" field with json-c and take "eventId" as the key (what
 * idemproxy renders from "#event.eventId"); the time of that reading and
 * parsing is included. The "handler" does nothing.
 *
 * --group G (mode b): read as idemproxy does in group mode, so Redis does the
 * same work: XREADGROUP GROUP G bench COUNT --batch ... ">" instead of XRANGE
 * (the group is created at "0" first), and one XACK per page, pipelined after
 * that page's done marks (the same connection, so after them), of every entry
 * the page settled. Without --group, no consumer group and no XACK: what
 * idemproxy does in group-less mode (XREAD).
 *
 * --mode a: the seeds' algorithm (seed 000's @RedisLock), what each service
 * does today: per event, one round trip per command:
 *   EXISTS done:k            -> 1: a copy, next event
 *   SET lock:k tok NX PX lease  -> nil: busy, next event
 *   EXISTS done:k            -> 1: a copy after all, release, next event
 *   (handler)
 *   SET done:k 1 PX ttl
 *   EVALSHA compare-and-delete lock:k tok
 *
 * --mode b: the same dedup with no proxy, pipelined: each page is claimed in
 * whole pipelined rounds, the commands idemproxy sends per key:
 *   --layout single: SET idem:k L:tok NX PX lease GET (nil: claimed, "D": copy,
 *     "L:..": busy); then SET idem:k D PX ttl GET for the claimed ones.
 *   --layout split: EXISTS done:k; then SET lock:k tok NX PX lease GET and
 *     EXISTS done:k for those not done; then SET done:k 1 PX ttl and EVALSHA
 *     compare-and-delete for the claimed ones.
 * A busy key (an earlier copy of it in the same page holds the lock) is
 * claimed again with the next page, as idemproxy looks at it again. The rounds
 * of a page, and the pages, run one after the other: one client, no overlap.
 *
 * --mode l: the latency floor, no dedup: XREAD BLOCK from "$" (started before
 * the producer) until --limit entries came, histogramming now - the producer's
 * "ts_us" per entry: what XADD -> a blocked reader costs here, at this load.
 * Prints {"mode":"l","entries":..,"lat_n":..,"p50_us":..,...}.
 *
 * --block MS (mode b with --group): the live guard, what a service that does the
 * dedup itself costs at a rate: XREADGROUP ... BLOCK MS, each page claimed and
 * done as above as soon as it comes, until a BLOCK ends with nothing (the
 * producer stopped). The JSON line gains "cpu_s", this process' CPU seconds
 * (user + system) while reading: the in-process cost idemproxy's CPU per entry
 * is compared with at the same rate.
 *
 * --limit N stops after N entries (baseline a runs on a sample).
 * Modes a and b print one JSON line: {"mode":..,"layout":..,"entries":..,
 * "keys":..,"copies":..,"busy":..,"unresolved":..,"bad":..,"seconds":..,
 * "keys_per_s":..,"entries_per_s":..}: keys claimed (the unique keys),
 * copies skipped, times a claim found the lock busy, entries still busy at
 * the end (0), entries whose payload had no eventId.
 */
#include <getopt.h>
#include <sys/resource.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <json-c/json.h>

#include "hist.h"

static const char release_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

static redisContext *c;
static char release_sha[64];
static long lease_ms = 5000, ttl_ms = 600000;
static unsigned long long n_keys, n_copies, n_busy, n_bad, n_entries;
static const char *group;               /* --group: XREADGROUP and XACK */
static const char *stream = "bench";

/* Group mode: the ids a page settles, XACKed in one command. */
static const char **ack_argv;
static size_t nack;

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_baseline: %s: %s\n", what, c->err ? c->errstr : "unexpected reply");
    exit(1);
}

/* A reply of any type but an error, or exit. */
static redisReply *checked(redisReply *r, const char *what)
{
    if (r == NULL) die(what);
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "bench_baseline: %s: %s\n", what, r->str);
        exit(1);
    }
    return r;
}

static redisReply *cmd(const char *what, int argc, const char **argv)
{
    return checked(redisCommandArgv(c, argc, argv, NULL), what);
}

static void append(int argc, const char **argv)
{
    if (redisAppendCommandArgv(c, argc, argv, NULL) != REDIS_OK) die("append");
}

static redisReply *get_reply(const char *what)
{
    redisReply *r;
    if (redisGetReply(c, (void **)&r) != REDIS_OK) die(what);
    return checked(r, what);
}

typedef struct ev { char *key, tok[24], id[40]; } ev;

static void new_token(ev *e)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 20; i++) e->tok[i] = hex[random() & 15];
    e->tok[20] = '\0';
}

/* Keys are built into these buffers, one per event of a page. */
static char *name(char *buf, size_t size, const char *prefix, const char *key)
{
    snprintf(buf, size, "%s%s", prefix, key);
    return buf;
}

/* Group mode: 'id' settled; XACKed with the rest of its page. */
static void ack_later(const char *id)
{
    if (group) ack_argv[3 + nack++] = id;
}

/* Group mode: append the page's XACK; returns how many replies to read (0 or 1). */
static size_t append_xack(void)
{
    if (nack == 0) return 0;
    append((int)(3 + nack), ack_argv);
    nack = 0;
    return 1;
}

/* --- mode a: five round trips per new key, one per copy ------------------ */

static void one_event(ev *e)
{
    char lock[300], done[300], px[24], ttl[24];
    snprintf(px, sizeof(px), "%ld", lease_ms);
    snprintf(ttl, sizeof(ttl), "%ld", ttl_ms);
    name(lock, sizeof(lock), "lock:", e->key);
    name(done, sizeof(done), "done:", e->key);
    new_token(e);

    redisReply *r = cmd("EXISTS", 2, (const char *[]){ "EXISTS", done });
    long long is_done = r->integer;
    freeReplyObject(r);
    if (is_done) { n_copies++; return; }

    r = cmd("SET NX", 6, (const char *[]){ "SET", lock, e->tok, "NX", "PX", px });
    int locked = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!locked) { n_busy++; return; }

    r = cmd("EXISTS", 2, (const char *[]){ "EXISTS", done });
    is_done = r->integer;
    freeReplyObject(r);
    if (!is_done) {
        /* the handler would run here */
        freeReplyObject(cmd("SET done", 5, (const char *[]){ "SET", done, "1", "PX", ttl }));
        n_keys++;
    } else {
        n_copies++;
    }
    freeReplyObject(cmd("EVALSHA", 5, (const char *[]){ "EVALSHA", release_sha, "1", lock, e->tok }));
}

/* --- mode b: a page in pipelined rounds ----------------------------------- */

/* Page states. */
enum { OPEN, COPY, COPY_LOCKED, CLAIMED, BUSY };

/* Count the page's outcomes, free what is finished and move the busy events
 * to the front of v; returns how many there are. */
static size_t page_settle(ev *v, size_t n, const char *state)
{
    size_t nbusy = 0;
    for (size_t i = 0; i < n; i++) {
        if (state[i] == BUSY) { n_busy++; v[nbusy++] = v[i]; continue; }
        if (state[i] == CLAIMED) n_keys++; else n_copies++;
        free(v[i].key);
        v[i].key = NULL;
    }
    return nbusy;
}

static size_t page_single(ev *v, size_t n, char *state)
{
    char k[300], val[32], px[24], ttl[24];
    snprintf(px, sizeof(px), "%ld", lease_ms);
    snprintf(ttl, sizeof(ttl), "%ld", ttl_ms);
    for (size_t i = 0; i < n; i++) {
        new_token(&v[i]);
        snprintf(val, sizeof(val), "L:%s", v[i].tok);
        append(7, (const char *[]){ "SET", name(k, sizeof(k), "idem:", v[i].key), val, "NX", "PX", px, "GET" });
    }
    size_t nclaimed = 0;
    for (size_t i = 0; i < n; i++) {
        redisReply *r = get_reply("SET NX GET");
        if (r->type == REDIS_REPLY_NIL) { state[i] = CLAIMED; nclaimed++; }
        else if (r->type == REDIS_REPLY_STRING && strcmp(r->str, "D") == 0) state[i] = COPY;
        else state[i] = BUSY;
        freeReplyObject(r);
    }
    for (size_t i = 0; i < n; i++)
        if (state[i] == CLAIMED)
            append(6, (const char *[]){ "SET", name(k, sizeof(k), "idem:", v[i].key), "D", "PX", ttl, "GET" });
    for (size_t i = 0; i < n; i++)
        if (state[i] != BUSY) ack_later(v[i].id);
    size_t acks = append_xack();
    for (size_t i = 0; i < nclaimed; i++) freeReplyObject(get_reply("SET D"));
    if (acks) freeReplyObject(get_reply("XACK"));
    return page_settle(v, n, state);
}

static size_t page_split(ev *v, size_t n, char *state)
{
    char lk[300], dk[300], px[24], ttl[24];
    snprintf(px, sizeof(px), "%ld", lease_ms);
    snprintf(ttl, sizeof(ttl), "%ld", ttl_ms);
    for (size_t i = 0; i < n; i++)
        append(2, (const char *[]){ "EXISTS", name(dk, sizeof(dk), "done:", v[i].key) });
    for (size_t i = 0; i < n; i++) {
        redisReply *r = get_reply("EXISTS");
        state[i] = r->integer == 1 ? COPY : OPEN;
        freeReplyObject(r);
    }
    for (size_t i = 0; i < n; i++) {
        if (state[i] != OPEN) continue;
        new_token(&v[i]);
        append(7, (const char *[]){ "SET", name(lk, sizeof(lk), "lock:", v[i].key), v[i].tok, "NX", "PX", px, "GET" });
        append(2, (const char *[]){ "EXISTS", name(dk, sizeof(dk), "done:", v[i].key) });
    }
    for (size_t i = 0; i < n; i++) {
        if (state[i] != OPEN) continue;
        redisReply *set = get_reply("SET NX GET"), *ex = get_reply("EXISTS");
        if (set->type != REDIS_REPLY_NIL) state[i] = BUSY;
        else if (ex->integer == 1) state[i] = COPY_LOCKED;   /* the double check */
        else state[i] = CLAIMED;
        freeReplyObject(set);
        freeReplyObject(ex);
    }
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        if (state[i] == CLAIMED) {
            append(5, (const char *[]){ "SET", name(dk, sizeof(dk), "done:", v[i].key), "1", "PX", ttl });
            sent++;
        }
        if (state[i] == CLAIMED || state[i] == COPY_LOCKED) {
            append(5, (const char *[]){ "EVALSHA", release_sha, "1", name(lk, sizeof(lk), "lock:", v[i].key), v[i].tok });
            sent++;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (state[i] != BUSY) ack_later(v[i].id);
    sent += append_xack();
    for (size_t i = 0; i < sent; i++) freeReplyObject(get_reply("finish"));
    return page_settle(v, n, state);
}

/* --- mode l: XADD -> XREAD latency, no dedup ------------------------------ */

static int latency_floor(long limit)
{
    static hist h;
    char last[64] = "$";
    long seen = 0;
    while (seen < limit) {
        redisReply *r = cmd("XREAD", 8, (const char *[]){ "XREAD", "COUNT", "1000", "BLOCK", "10000",
                                                         "STREAMS", stream, last });
        uint64_t now = now_us(CLOCK_REALTIME);
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {      /* nil: 10 s of nothing */
            freeReplyObject(r);
            break;
        }
        redisReply *entries = r->element[0]->element[1];
        for (size_t i = 0; i < entries->elements; i++) {
            redisReply *en = entries->element[i], *f = en->element[1];
            snprintf(last, sizeof(last), "%s", en->element[0]->str);
            seen++;
            for (size_t j = 0; j + 1 < f->elements; j += 2) {
                uint64_t ts;
                if (strcmp(f->element[j]->str, "payload") == 0 &&
                    payload_ts(f->element[j + 1]->str, f->element[j + 1]->len, &ts) == 0)
                    hist_add(&h, now > ts ? now - ts : 0);
            }
        }
        freeReplyObject(r);
    }
    printf("{\"mode\":\"l\",\"entries\":%ld,", seen);
    hist_print_json(&h);
    printf("}\n");
    return 0;
}

/* The eventId of one XRANGE entry, or NULL (counted as bad input). */
static char *entry_key(redisReply *en)
{
    if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 || en->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL;
    redisReply *f = en->element[1];
    for (size_t i = 0; i + 1 < f->elements; i += 2) {
        if (strcmp(f->element[i]->str, "payload") != 0) continue;
        json_object *o = json_tokener_parse(f->element[i + 1]->str), *id;
        char *key = NULL;
        if (o && json_object_object_get_ex(o, "eventId", &id) && json_object_is_type(id, json_type_string))
            key = strdup(json_object_get_string(id));
        json_object_put(o);
        return key;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *layout = "split";
    int port = 6379;
    char mode = 'b';
    long batch = 256, limit = 0, block_ms = -1;
    static const struct option opts[] = {
        { "host", required_argument, NULL, 'h' },   { "port", required_argument, NULL, 'p' },
        { "stream", required_argument, NULL, 's' }, { "mode", required_argument, NULL, 'm' },
        { "layout", required_argument, NULL, 'l' }, { "batch", required_argument, NULL, 'b' },
        { "limit", required_argument, NULL, 'n' },  { "lease", required_argument, NULL, 'L' },
        { "ttl", required_argument, NULL, 'T' },    { "group", required_argument, NULL, 'g' },
        { "block", required_argument, NULL, 'B' },  { NULL, 0, NULL, 0 } };
    int o;
    while ((o = getopt_long(argc, argv, "h:p:s:m:l:b:n:L:T:g:B:", opts, NULL)) != -1) {
        switch (o) {
        case 'h': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 's': stream = optarg; break;
        case 'm': mode = optarg[0]; break;
        case 'l': layout = optarg; break;
        case 'b': batch = atol(optarg); break;
        case 'n': limit = atol(optarg); break;
        case 'L': lease_ms = atol(optarg); break;
        case 'T': ttl_ms = atol(optarg); break;
        case 'g': group = optarg; break;
        case 'B': block_ms = atol(optarg); break;
        default:
            fprintf(stderr, "usage: bench_baseline --mode a|b|l [--layout single|split] [--host H]"
                            " [--port P] [--stream S] [--batch N] [--limit N] [--group G [--block MS]]\n");
            return 2;
        }
    }
    int single = strcmp(layout, "single") == 0;
    if ((mode != 'a' && mode != 'b' && mode != 'l') || (!single && strcmp(layout, "split") != 0) || batch < 1 ||
        (group && mode != 'b') || (block_ms >= 0 && !group)) {
        fprintf(stderr, "bench_baseline: bad --mode, --layout, --batch, --group (mode b only) or --block (with --group)\n");
        return 2;
    }
    if (mode == 'a') single = 0;   /* the seeds use lock: and done: keys */
    srandom((unsigned)getpid());

    c = redisConnect(host, port);
    if (c == NULL || c->err) {
        fprintf(stderr, "bench_baseline: connect %s:%d: %s\n", host, port, c ? c->errstr : "oom");
        return 1;
    }
    if (mode == 'l') {
        /* say we are reading: the orchestrator starts the producer after this line */
        fprintf(stderr, "reading\n");
        return latency_floor(limit > 0 ? limit : 1);
    }
    redisReply *r = cmd("SCRIPT LOAD", 3, (const char *[]){ "SCRIPT", "LOAD", release_lua });
    snprintf(release_sha, sizeof(release_sha), "%s", r->str);
    freeReplyObject(r);

    ev *v = calloc((size_t)batch * 2, sizeof(ev));   /* a page plus the busy carried over */
    char *state = calloc((size_t)batch * 2, 1);
    ack_argv = calloc((size_t)batch * 2 + 3, sizeof(*ack_argv));
    char (*bad_ids)[40] = calloc((size_t)batch, sizeof(*bad_ids));
    if (v == NULL || state == NULL || ack_argv == NULL || bad_ids == NULL) {
        fprintf(stderr, "bench_baseline: out of memory\n");
        return 1;
    }
    if (group) {
        ack_argv[0] = "XACK";
        ack_argv[1] = stream;
        ack_argv[2] = group;
        r = cmd("XGROUP CREATE", 6, (const char *[]){ "XGROUP", "CREATE", stream, group, "0", "MKSTREAM" });
        freeReplyObject(r);
    }
    size_t carried = 0;
    char start[64] = "-", count[24], block[24];
    snprintf(block, sizeof(block), "%ld", block_ms);
    double t0 = now_s(), c0 = cpu_s();
    for (;;) {
        long want = batch;
        if (limit > 0 && (long)n_entries + want > limit) want = limit - (long)n_entries;
        if (want <= 0) break;
        snprintf(count, sizeof(count), "%ld", want);
        redisReply *reply, *page;
        if (group) {
            /* XREADGROUP's reply: [[stream, entries]], or nil when nothing is new. */
            reply = block_ms >= 0
                        ? cmd("XREADGROUP", 11, (const char *[]){ "XREADGROUP", "GROUP", group, "bench", "COUNT",
                                                                  count, "BLOCK", block, "STREAMS", stream, ">" })
                        : cmd("XREADGROUP", 9, (const char *[]){ "XREADGROUP", "GROUP", group, "bench", "COUNT",
                                                                 count, "STREAMS", stream, ">" });
            page = reply->type == REDIS_REPLY_ARRAY && reply->elements == 1 ? reply->element[0]->element[1]
                                                                               : NULL;
        } else {
            reply = page = cmd("XRANGE", 6, (const char *[]){ "XRANGE", stream, start, "+", "COUNT", count });
            if (page->type != REDIS_REPLY_ARRAY) die("XRANGE");
        }
        size_t n = carried, got = page ? page->elements : 0, nbad = 0;
        for (size_t i = 0; i < got; i++) {
            redisReply *en = page->element[i];
            n_entries++;
            char *key = entry_key(en);
            if (key == NULL) {        /* bad input: acked with the page, as idemproxy's skip */
                n_bad++;
                snprintf(bad_ids[nbad], sizeof(bad_ids[nbad]), "%s", en->element[0]->str);
                ack_later(bad_ids[nbad++]);
                continue;
            }
            v[n].key = key;
            v[n].tok[0] = '\0';
            snprintf(v[n].id, sizeof(v[n].id), "%s", en->element[0]->str);
            n++;
        }
        if (got > 0)
            snprintf(start, sizeof(start), "(%s", page->element[got - 1]->element[0]->str);
        freeReplyObject(reply);
        if (mode == 'a') {
            for (size_t i = 0; i < n; i++) { one_event(&v[i]); free(v[i].key); }
            carried = 0;
        } else {
            carried = single ? page_single(v, n, state) : page_split(v, n, state);
            if (got == 0 && carried > 0)   /* the stream is read: one more round for the busy */
                carried = single ? page_single(v, carried, state) : page_split(v, carried, state);
        }
        if (got == 0 && (block_ms < 0 || n_entries > 0)) break;   /* live: wait for the first */
    }
    double dt = now_s() - t0, cpu = cpu_s() - c0;
    printf("{\"mode\":\"%c\",\"layout\":\"%s\",\"entries\":%llu,\"keys\":%llu,\"copies\":%llu,"
           "\"busy\":%llu,\"unresolved\":%zu,\"bad\":%llu,\"seconds\":%.6f,\"keys_per_s\":%.1f,"
           "\"entries_per_s\":%.1f,\"cpu_s\":%.6f}\n",
           mode, single ? "single" : "split", n_entries, n_keys, n_copies, n_busy, carried, n_bad, dt,
           (double)n_keys / dt, (double)n_entries / dt, cpu);
    free(v);
    free(state);
    redisFree(c);
    return 0;
}
