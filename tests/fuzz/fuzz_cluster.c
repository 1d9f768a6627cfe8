/*
 * fuzz_cluster.c - libFuzzer target for the pure part of the cluster router
 * (proxy/slots.c): what Redis sends back is untrusted input.
 *
 * 1. The input as a key: its slot is below 16384, and a key with a non-empty
 *    first {tag} hashes as the tag alone.
 * 2. The input as an error reply: a MOVED/ASK it accepts has a slot below
 *    16384 and an address that splits into host and port.
 * 3. The input as RESP, read by hiredis' own reader into the daemon's reply
 *    arena (proxy/reply.c), fed in two pieces split where the input's last
 *    byte says: a CLUSTER SLOTS map it accepts has ranges within 0..16383,
 *    start <= end, and addresses that split into a host and port that were
 *    in the reply, for that range (the oracle: nothing is made up, nothing
 *    cut: a host longer than the buffer must be refused, not shortened); a
 *    range left out is said; a reply cut short by a protocol error leaves
 *    nothing alive in the arena.
 * 4. The input as a "host:port" (addr.c): it round-trips (addr_round_trip).
 */
#include <hiredis/hiredis.h>

#include "addr.h"
#include "cluster.h"
#include "fuzz.h"
#include "reply.h"

/* hiredis 0.14's reader allocates an aggregate's element array at its
 * declared count before reading any element ("*555555550" asks for 4 GiB);
 * that is hiredis trusting its server, not the code under test, so inputs
 * declaring more than 4096 elements are not fed to it. */
static bool huge_aggregate(const uint8_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (d[i] != '*' && d[i] != '$') continue;
        unsigned long v = 0;
        for (size_t j = i + 1; j < n && d[j] >= '0' && d[j] <= '9' && v <= 4096; j++)
            v = v * 10 + (unsigned long)(d[j] - '0');
        if (v > 4096) return true;
    }
    return false;
}

/* The reply has a range start..end whose master is host:port. */
static bool in_reply(const redisReply *r, unsigned start, unsigned end, const char *host, int port)
{
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) continue;
        const redisReply *m = e->element[2];
        if (e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[0]->integer != (long long)start || e->element[1]->integer != (long long)end ||
            m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING || m->element[1]->type != REDIS_REPLY_INTEGER ||
            m->element[1]->integer != port)
            continue;
        const redisReply *h = m->element[0];
        bool asked = h->len == 0 || (h->len == 1 && h->str[0] == '?');
        if (asked ? strcmp(host, "10.0.0.1") == 0
                  : strlen(host) == h->len && memcmp(host, h->str, h->len) == 0)
            return true;
    }
    return false;
}

/* 4. The input as an address (addr.c), under each set of flags: one that
 *    splits, written back ("[host]:port" when the host holds a ':'), splits
 *    again to the same host and port. */
static void addr_round_trip(const char *s, size_t size)
{
    if (strlen(s) != size) return; /* a NUL inside: the C string is shorter */
    for (unsigned flags = 0; flags < 4; flags++) {
        char host[PX_ADDR_HOST_MAX], host2[PX_ADDR_HOST_MAX], back[PX_ADDR_HOST_MAX + 16];
        int port, port2;
        if (!px_addr_split(s, host, sizeof(host), &port, flags)) continue;
        FUZZ_CHECK(port >= 1 && port <= 65535, "port %d", port);
        snprintf(back, sizeof(back), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
        FUZZ_CHECK(px_addr_split(back, host2, sizeof(host2), &port2, flags) &&
                       strcmp(host2, host) == 0 && port2 == port,
                   "'%s' (flags %u) split to '%s' and %d, written back as '%s' it does not", s, flags,
                   host, port, back);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *key = (const char *)data;
    unsigned slot = px_cluster_slot(key, size);
    FUZZ_CHECK(slot < PX_CLUSTER_SLOTS, "slot %u", slot);
    const char *open = memchr(key, '{', size);
    if (open) {
        const char *close = memchr(open + 1, '}', size - (size_t)(open - key) - 1);
        if (close && close > open + 1)
            FUZZ_CHECK(slot == px_cluster_slot(open + 1, (size_t)(close - open - 1)),
                       "the tag decides the slot");
    }

    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    px_redirect rd;
    char host[256];
    int port;
    if (px_cluster_redirect(text, &rd)) {
        FUZZ_CHECK(rd.slot < PX_CLUSTER_SLOTS, "redirect slot %u", rd.slot);
        FUZZ_CHECK(px_addr_split(rd.addr, host, sizeof(host), &port, PX_ADDR_BARE_IPV6), "addr %s",
                   rd.addr);
    }
    addr_round_trip(text, size);
    free(text);

    if (huge_aggregate(data, size)) return 0;
    px_reply_arena *arena = px_reply_arena_new();
    redisReader *r = redisReaderCreate();
    px_reply_attach(r, arena);
    void *reply = NULL;
    size_t cut = size ? data[size - 1] % (size + 1) : 0;
    int rc = redisReaderFeed(r, (const char *)data, cut);
    if (rc == REDIS_OK) rc = redisReaderGetReply(r, &reply);
    if (rc == REDIS_OK && reply == NULL) {
        rc = redisReaderFeed(r, (const char *)data + cut, size - cut);
        if (rc == REDIS_OK) rc = redisReaderGetReply(r, &reply);
    }
    if (rc != REDIS_OK)
        FUZZ_CHECK(px_reply_arena_in_use(arena) == 0, "an error left %zu bytes alive",
                   px_reply_arena_in_use(arena));
    if (rc == REDIS_OK && reply) {
        px_slot_range *v;
        char why[200];
        int n = px_cluster_parse_slots(reply, "10.0.0.1", &v, why, sizeof(why));
        FUZZ_CHECK(n >= -1, "n %d", n);
        for (int i = 0; i < n; i++) {
            FUZZ_CHECK(v[i].start <= v[i].end && v[i].end < PX_CLUSTER_SLOTS, "range %u-%u",
                       v[i].start, v[i].end);
            /* Every address kept is one a link can dial, and names a host and
             * port that were in the reply (or the node asked, for ""/"?"). */
            FUZZ_CHECK(px_addr_split(v[i].addr, host, sizeof(host), &port, PX_ADDR_BARE_IPV6),
                       "addr %s", v[i].addr);
            FUZZ_CHECK(in_reply((const redisReply *)reply, v[i].start, v[i].end, host, port),
                       "%u-%u at %s is not in the reply", v[i].start, v[i].end, v[i].addr);
        }
        /* What was left out was said. */
        if (n >= 0) FUZZ_CHECK((size_t)n == ((const redisReply *)reply)->elements || why[0],
                               "%d of %zu ranges kept, no reason", n,
                               ((const redisReply *)reply)->elements);
        free(v);
        r->fn->freeObject(reply);
        FUZZ_CHECK(px_reply_arena_in_use(arena) == 0, "freed, yet %zu bytes alive",
                   px_reply_arena_in_use(arena));
    }
    redisReaderFree(r);
    px_reply_arena_release(arena);
    return 0;
}
