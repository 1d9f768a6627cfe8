/*
 * slots.c - the pure part of Redis Cluster routing (declared in cluster.h):
 * the hash slot of a key, MOVED/ASK errors and CLUSTER SLOTS replies (their
 * "host:port" addresses split by addr.c). No loop, no connection:
 * tests/unit/test_cluster.c checks it on replies built by hiredis' own reader.
 */
#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"

static uint16_t crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

unsigned px_cluster_slot(const char *key, size_t len)
{
    /* Only the part between the first '{' and the next '}' is hashed, if non-empty. */
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1) {
            key = open + 1;
            len = (size_t)(close - key);
        }
    }
    return crc16(key, len) & (PX_CLUSTER_SLOTS - 1);
}

bool px_cluster_redirect(const char *err, px_redirect *out)
{
    char kind[8], addr[sizeof(out->addr)], host[PX_ADDR_HOST_MAX];
    unsigned slot;
    int port;
    if (sscanf(err, "%7s %u %279s", kind, &slot, addr) != 3) return false;
    if (strcmp(kind, "MOVED") != 0 && strcmp(kind, "ASK") != 0) return false;
    if (slot >= PX_CLUSTER_SLOTS || !px_addr_split(addr, host, sizeof(host), &port, PX_ADDR_BARE_IPV6))
        return false;
    out->ask = kind[0] == 'A';
    out->slot = slot;
    snprintf(out->addr, sizeof(out->addr), "%s", addr);
    return true;
}

/* A host Redis sent that a link can dial: a name or an address, without the
 * brackets, blanks, control bytes or NUL no host holds, short enough to keep. */
static const char *host_fault(const char *h, size_t len)
{
    if (len >= PX_ADDR_HOST_MAX) return "a host too long";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)h[i];
        if (c == '\0') return "a NUL in the host";
        if (c <= ' ' || c == 0x7f) return "a blank or control byte in the host";
        if (c == '[' || c == ']') return "a bracket in the host";
    }
    return NULL;
}

int px_cluster_parse_slots(const redisReply *r, const char *asked_host, px_slot_range **out,
                           char *why, size_t whysize)
{
    *out = NULL;
    if (whysize) why[0] = '\0';
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) return -1;
    px_slot_range *v = px_calloc(r->elements ? r->elements : 1, sizeof(*v));
    int n = 0;
    size_t refused = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) goto bad;
        const redisReply *s = e->element[0], *t = e->element[1], *m = e->element[2];
        if (s->type != REDIS_REPLY_INTEGER || t->type != REDIS_REPLY_INTEGER ||
            s->integer < 0 || t->integer < s->integer || t->integer >= PX_CLUSTER_SLOTS ||
            m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING || m->element[1]->type != REDIS_REPLY_INTEGER)
            goto bad;
        /* A range whose master cannot be dialled is refused here, with the
         * reason, not left for the router to drop without a word. */
        const char *host = m->element[0]->str;
        long long port = m->element[1]->integer;
        const char *fault = host_fault(host, m->element[0]->len);
        if (fault == NULL && (port < 1 || port > 65535)) fault = "a port outside 1-65535";
        if (fault) {
            if (refused++ == 0 && whysize)
                snprintf(why, whysize, "slots %lld-%lld: %s", s->integer, t->integer, fault);
            continue;
        }
        if (host[0] == '\0' || strcmp(host, "?") == 0) host = asked_host;
        v[n].start = (unsigned)s->integer;
        v[n].end = (unsigned)t->integer;
        snprintf(v[n].addr, sizeof(v[n].addr), "%s:%lld", host, port);
        n++;
    }
    if (refused > 1 && whysize) {
        size_t l = strlen(why);
        snprintf(why + l, whysize - l, " (and %zu more ranges)", refused - 1);
    }
    *out = v;
    return n;
bad:
    free(v);
    return -1;
}

void px_cluster_tag(const char *dl, px_buf *b)
{
    const char *open = strchr(dl, '{'), *close = open ? strchr(open + 1, '}') : NULL;
    if (close && close > open + 1) { /* its own hash tag */
        px_buf_append(b, open + 1, (size_t)(close - open - 1));
        return;
    }
    if (dl[0] && strchr(dl, '}') == NULL) { /* no tag: the whole name hashes */
        px_buf_appends(b, dl);
        return;
    }
    unsigned slot = px_cluster_slot(dl, strlen(dl));
    char num[16];
    for (unsigned i = 0;; i++) { /* every slot is reached within 2^17 */
        int n = snprintf(num, sizeof(num), "%u", i);
        if (px_cluster_slot(num, (size_t)n) == slot) break;
    }
    px_buf_appends(b, num);
}
