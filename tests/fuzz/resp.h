/*
 * resp.h - what the RESP-reading harnesses share: the input read by hiredis'
 * own reader into the daemon's reply arena (proxy/reply.c), as a link reads
 * it, and a small RESP writer for round trips (parse, write back, parse again).
 */
#ifndef PX_FUZZ_RESP_H
#define PX_FUZZ_RESP_H

#include <hiredis/hiredis.h>

#include "fuzz.h"
#include "reply.h"

/* hiredis 0.14's reader allocates an aggregate's element array at its
 * declared count before reading any element; that is hiredis trusting its
 * server, not the code under test (the daemon caps it: reply.h), so inputs
 * declaring more than 4096 elements are not fed to it. */
static inline bool resp_huge(const uint8_t *d, size_t n)
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

typedef struct resp_read {
    px_reply_arena *arena;
    redisReader *reader;
    redisReply *reply; /* NULL: no whole reply in the input */
} resp_read;

/* The first reply in 'd', if any. */
static inline void resp_read_open(resp_read *rr, const void *d, size_t n)
{
    rr->arena = px_reply_arena_new();
    rr->reader = redisReaderCreate();
    px_reply_attach(rr->reader, rr->arena);
    void *reply = NULL;
    if (redisReaderFeed(rr->reader, d, n) != REDIS_OK ||
        redisReaderGetReply(rr->reader, &reply) != REDIS_OK)
        reply = NULL;
    rr->reply = reply;
}

static inline void resp_read_close(resp_read *rr)
{
    if (rr->reply) rr->reader->fn->freeObject(rr->reply);
    redisReaderFree(rr->reader);
    FUZZ_CHECK(px_reply_arena_in_use(rr->arena) == 0, "%zu bytes alive",
               px_reply_arena_in_use(rr->arena));
    px_reply_arena_release(rr->arena);
}

/* A growing buffer of RESP. */
typedef struct resp_out {
    char *d;
    size_t n, cap;
} resp_out;

static inline void resp_put(resp_out *o, const void *p, size_t n)
{
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 64;
        o->d = realloc(o->d, o->cap);
    }
    memcpy(o->d + o->n, p, n);
    o->n += n;
}

static inline void resp_head(resp_out *o, char kind, long long v)
{
    char b[32];
    int k = snprintf(b, sizeof(b), "%c%lld\r\n", kind, v);
    resp_put(o, b, (size_t)k);
}

static inline void resp_bulk(resp_out *o, const char *s, size_t n)
{
    resp_head(o, '$', (long long)n);
    resp_put(o, s, n);
    resp_put(o, "\r\n", 2);
}

static inline void resp_cstr(resp_out *o, const char *s)
{
    resp_bulk(o, s, strlen(s));
}

#endif
