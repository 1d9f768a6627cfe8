/*
 * fuzz_replies.c - libFuzzer target for the readers of what a misbehaving
 * Redis sends back (proxy/replies.c): SET NX GET and the claim's integer
 * replies (claim.c), XPENDING and XINFO CONSUMERS (the reader), XINFO GROUPS
 * (metrics.c), pub/sub messages and HELLO (link.c).
 *
 * The input is RESP, read by hiredis' reader into the daemon's reply arena.
 * The oracles, beyond no crash:
 *  1. types: a value is only read from an element of its type. SET NX GET is
 *     malformed exactly when the reply is neither nil nor a string, and ours
 *     only when its bytes are ours, all of them; an integer only from an
 *     integer; XPENDING with any count or idle that is not an integer, or
 *     XINFO CONSUMERS with a "pending" or "idle" that is not one, is refused
 *     (a non-integer is never read as 0); a group's pending is known only
 *     from its exact name's integer; HELLO tells old from new only from a
 *     "version" string that starts with a digit.
 *  2. round trip: what XPENDING and XINFO CONSUMERS accept, written back as
 *     RESP and read again, gives the same values.
 */
#include "replies.h"
#include "resp.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static const char mine[] = "L:1700000000000-0:4f2a";

static void check_scalars(const redisReply *r)
{
    px_lock_reply l = px_rp_lock_set(r, mine);
    bool nil_or_str = r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STRING;
    FUZZ_CHECK((l == PX_LOCK_NONE) == !nil_or_str, "lock %d for type %d", (int)l, r->type);
    if (r->type == REDIS_REPLY_STRING) {
        bool ours = r->len == strlen(mine) && memcmp(r->str, mine, r->len) == 0;
        FUZZ_CHECK((l == PX_LOCK_TAKEN) == ours, "taken %d, ours %d", l == PX_LOCK_TAKEN, ours);
        if (l == PX_LOCK_DONE) FUZZ_CHECK(r->len > 0 && r->str[0] == 'D', "done, not D");
    }
    long long v = 12345;
    bool isint = px_rp_int(r, &v);
    FUZZ_CHECK(isint == (r->type == REDIS_REPLY_INTEGER), "int %d for type %d", isint, r->type);
    if (isint) FUZZ_CHECK(v == r->integer, "int value");
    else FUZZ_CHECK(v == 12345, "a non-integer wrote the value");
    FUZZ_CHECK(!px_rp_pubsub_message(r) || (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                                            r->element[0]->type == REDIS_REPLY_STRING &&
                                            r->element[0]->len == 7 &&
                                            memcmp(r->element[0]->str, "message", 7) == 0),
               "a message that is not one");
    /* HELLO: a server known old or new has said its version, digits first. */
    char ver[80];
    px_server_check srv = px_redis_server_check(r, ver, sizeof(ver));
    FUZZ_CHECK(memchr(ver, '\0', sizeof(ver)) != NULL, "version text not terminated");
    if (srv != PX_SERVER_UNKNOWN && r->type == REDIS_REPLY_ARRAY) {
        bool said = false;
        for (size_t i = 0; i + 1 < r->elements && !said; i += 2) {
            const redisReply *key = r->element[i], *val = r->element[i + 1];
            said = key->type == REDIS_REPLY_STRING && key->len == 7 &&
                   memcmp(key->str, "version", 7) == 0 && val->type == REDIS_REPLY_STRING &&
                   val->len > 0 && val->str[0] >= '0' && val->str[0] <= '9';
        }
        FUZZ_CHECK(said, "server check %d without a version", (int)srv);
    }
}

/* Any element of an XPENDING reply whose idle or count is not an integer. */
static bool pending_has_non_integer(const redisReply *r)
{
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *p = r->element[i];
        if (p->type == REDIS_REPLY_ARRAY && p->elements == 4 &&
            (p->element[2]->type != REDIS_REPLY_INTEGER || p->element[3]->type != REDIS_REPLY_INTEGER))
            return true;
    }
    return false;
}

static void check_xpending(const redisReply *r)
{
    char why[200];
    px_rp_pending *v;
    long n = px_rp_xpending(r, &v, why, sizeof(why));
    if (n < 0) {
        FUZZ_CHECK(v == NULL && why[0], "refused without a reason");
        return;
    }
    FUZZ_CHECK(r->type == REDIS_REPLY_ARRAY && (size_t)n == r->elements, "n %ld", n);
    FUZZ_CHECK(!pending_has_non_integer(r), "a non-integer idle or count was read");
    resp_out o = { 0 };
    resp_head(&o, '*', n);
    for (long i = 0; i < n; i++) {
        FUZZ_CHECK(px_rp_stream_id(v[i].id, v[i].id_len) && strlen(v[i].id) == v[i].id_len, "id");
        FUZZ_CHECK(v[i].count >= 0 && v[i].idle_ms >= 0, "count %lld", v[i].count);
        resp_head(&o, '*', 4);
        resp_bulk(&o, v[i].id, v[i].id_len);
        resp_bulk(&o, v[i].consumer, v[i].consumer_len);
        resp_head(&o, ':', v[i].idle_ms);
        resp_head(&o, ':', v[i].count);
    }
    resp_read rr;
    resp_read_open(&rr, o.d, o.n);
    FUZZ_CHECK(rr.reply != NULL, "written back, not read");
    px_rp_pending *w;
    long m = px_rp_xpending(rr.reply, &w, why, sizeof(why));
    FUZZ_CHECK(m == n, "round trip: %ld, then %ld (%s)", n, m, why);
    for (long i = 0; i < n; i++)
        FUZZ_CHECK(w[i].id_len == v[i].id_len && memcmp(w[i].id, v[i].id, v[i].id_len) == 0 &&
                       w[i].consumer_len == v[i].consumer_len &&
                       memcmp(w[i].consumer, v[i].consumer, v[i].consumer_len) == 0 &&
                       w[i].idle_ms == v[i].idle_ms && w[i].count == v[i].count,
                   "round trip: element %ld differs", i);
    free(w);
    resp_read_close(&rr);
    free(o.d);
    free(v);
}

/* A key of a map whose value is there with another type than 'type'. */
static bool map_has_other(const redisReply *m, const char *key, int type)
{
    for (size_t j = 0; j + 1 < m->elements; j += 2) {
        const redisReply *k = m->element[j];
        if ((k->type == REDIS_REPLY_STRING || k->type == REDIS_REPLY_STATUS) && k->len == strlen(key) &&
            memcmp(k->str, key, k->len) == 0 && m->element[j + 1]->type != type)
            return true;
    }
    return false;
}

static void check_consumers(const redisReply *r)
{
    char why[200];
    px_rp_consumer *v;
    long n = px_rp_xinfo_consumers(r, &v, why, sizeof(why));
    if (n < 0) {
        FUZZ_CHECK(v == NULL && why[0], "refused without a reason");
        return;
    }
    FUZZ_CHECK(r->type == REDIS_REPLY_ARRAY && (size_t)n == r->elements, "n %ld", n);
    for (size_t i = 0; i < r->elements; i++)
        FUZZ_CHECK(!map_has_other(r->element[i], "pending", REDIS_REPLY_INTEGER) &&
                       !map_has_other(r->element[i], "idle", REDIS_REPLY_INTEGER),
                   "consumer %zu: a non-integer pending or idle was read", i);
    resp_out o = { 0 };
    resp_head(&o, '*', n);
    for (long i = 0; i < n; i++) {
        resp_head(&o, '*', 6);
        resp_cstr(&o, "name");
        resp_bulk(&o, v[i].name, v[i].name_len);
        resp_cstr(&o, "pending");
        resp_head(&o, ':', v[i].pending);
        resp_cstr(&o, "idle");
        resp_head(&o, ':', v[i].idle_ms);
    }
    resp_read rr;
    resp_read_open(&rr, o.d, o.n);
    FUZZ_CHECK(rr.reply != NULL, "written back, not read");
    px_rp_consumer *w;
    long m = px_rp_xinfo_consumers(rr.reply, &w, why, sizeof(why));
    FUZZ_CHECK(m == n, "round trip: %ld, then %ld (%s)", n, m, why);
    for (long i = 0; i < n; i++)
        FUZZ_CHECK(w[i].name_len == v[i].name_len && memcmp(w[i].name, v[i].name, v[i].name_len) == 0 &&
                       w[i].pending == v[i].pending && w[i].idle_ms == v[i].idle_ms,
                   "round trip: consumer %ld differs", i);
    free(w);
    resp_read_close(&rr);
    free(o.d);
    free(v);
}

/* XINFO GROUPS for 'group': a known pending is the integer of a group of
 * exactly that name. */
static void check_group(const redisReply *r, const char *group)
{
    long long pending = -7, lag = -7;
    bool pk = true, lk = true;
    bool found = px_rp_xinfo_group(r, group, &pending, &pk, &lag, &lk);
    FUZZ_CHECK(found || (!pk && !lk), "not found, yet known");
    if (!pk) return;
    bool seen = false;
    for (size_t i = 0; i < r->elements && !seen; i++) {
        const redisReply *g = r->element[i];
        if (g->type != REDIS_REPLY_ARRAY) continue;
        bool named = false, has = false;
        for (size_t j = 0; j + 1 < g->elements; j += 2) {
            const redisReply *k = g->element[j], *val = g->element[j + 1];
            if (k->type != REDIS_REPLY_STRING && k->type != REDIS_REPLY_STATUS) continue;
            if (k->len == 4 && memcmp(k->str, "name", 4) == 0)
                named = val->type == REDIS_REPLY_STRING && val->len == strlen(group) &&
                        memcmp(val->str, group, val->len) == 0;
            if (k->len == 7 && memcmp(k->str, "pending", 7) == 0)
                has = val->type == REDIS_REPLY_INTEGER && val->integer == pending;
        }
        seen = named && has;
    }
    FUZZ_CHECK(seen, "pending %lld of group '%s' is not in the reply", pending, group);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (resp_huge(data, size)) return 0;
    resp_read rr;
    resp_read_open(&rr, data, size);
    const redisReply *r = rr.reply;
    if (r) {
        check_scalars(r);
        check_xpending(r);
        check_consumers(r);
        check_group(r, "g");
        /* and the name of the first group, when it is a string without a NUL */
        if (r->type == REDIS_REPLY_ARRAY && r->elements && r->element[0]->type == REDIS_REPLY_ARRAY &&
            r->element[0]->elements >= 2 && r->element[0]->element[1]->type == REDIS_REPLY_STRING &&
            strlen(r->element[0]->element[1]->str) == r->element[0]->element[1]->len)
            check_group(r, r->element[0]->element[1]->str);
    }
    resp_read_close(&rr);
    return 0;
}
