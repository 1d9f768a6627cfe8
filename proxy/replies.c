/*
 * replies.c - see replies.h.
 */
#include "replies.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "px.h"

bool px_rp_is(const redisReply *r, const char *s)
{
    size_t n = strlen(s);
    return r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) &&
           r->len == n && memcmp(r->str, s, n) == 0;
}

bool px_rp_int(const redisReply *r, long long *v)
{
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) return false;
    *v = r->integer;
    return true;
}

bool px_rp_str_or_nil(const redisReply *r, const char **s, size_t *len)
{
    if (r == NULL) return false;
    if (r->type == REDIS_REPLY_NIL) {
        *s = NULL;
        *len = 0;
        return true;
    }
    if (r->type != REDIS_REPLY_STRING) return false;
    *s = r->str;
    *len = r->len;
    return true;
}

px_lock_reply px_rp_lock_set(const redisReply *r, const char *mine)
{
    const char *old;
    size_t len;
    if (!px_rp_str_or_nil(r, &old, &len)) return PX_LOCK_NONE;
    return px_decide_lock_reply(old, len, mine);
}

static bool digits(const char *s, size_t n)
{
    if (n == 0 || n > 20) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

bool px_rp_stream_id(const char *s, size_t len)
{
    const char *dash = memchr(s, '-', len);
    return dash != NULL && digits(s, (size_t)(dash - s)) &&
           digits(dash + 1, len - (size_t)(dash - s) - 1);
}

long px_rp_xpending(const redisReply *r, px_rp_pending **out, char *why, size_t whysize)
{
    *out = NULL;
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        snprintf(why, whysize, "not an array");
        return -1;
    }
    px_rp_pending *v = px_calloc(r->elements ? r->elements : 1, sizeof(*v));
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *p = r->element[i];
        if (p->type != REDIS_REPLY_ARRAY || p->elements != 4) {
            snprintf(why, whysize, "element %zu is not [id, consumer, idle, count]", i);
            goto bad;
        }
        const redisReply *id = p->element[0], *c = p->element[1];
        if (id->type != REDIS_REPLY_STRING || !px_rp_stream_id(id->str, id->len)) {
            snprintf(why, whysize, "element %zu: not an entry id", i);
            goto bad;
        }
        if (c->type != REDIS_REPLY_STRING) {
            snprintf(why, whysize, "element %zu: the consumer is not a string", i);
            goto bad;
        }
        if (!px_rp_int(p->element[2], &v[i].idle_ms) || !px_rp_int(p->element[3], &v[i].count) ||
            v[i].idle_ms < 0 || v[i].count < 0) {
            snprintf(why, whysize, "element %zu: idle or count is not a count", i);
            goto bad;
        }
        v[i].id = id->str;
        v[i].id_len = id->len;
        v[i].consumer = c->str;
        v[i].consumer_len = c->len;
    }
    *out = v;
    return (long)r->elements;
bad:
    free(v);
    return -1;
}

/* The value of 'key' in a RESP2 map [key, value, ...]; NULL when absent. '*twice'
 * is set when the key is there more than once. */
static const redisReply *map_get(const redisReply *m, const char *key, bool *twice)
{
    const redisReply *found = NULL;
    for (size_t i = 0; i + 1 < m->elements; i += 2) {
        if (!px_rp_is(m->element[i], key)) continue;
        if (found) *twice = true;
        else found = m->element[i + 1];
    }
    return found;
}

long px_rp_xinfo_consumers(const redisReply *r, px_rp_consumer **out, char *why, size_t whysize)
{
    *out = NULL;
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        snprintf(why, whysize, "not an array");
        return -1;
    }
    px_rp_consumer *v = px_calloc(r->elements ? r->elements : 1, sizeof(*v));
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *c = r->element[i];
        if (c->type != REDIS_REPLY_ARRAY || c->elements % 2 != 0) {
            snprintf(why, whysize, "consumer %zu is not a map", i);
            goto bad;
        }
        bool twice = false;
        const redisReply *name = map_get(c, "name", &twice);
        const redisReply *pending = map_get(c, "pending", &twice);
        const redisReply *idle = map_get(c, "idle", &twice);
        if (twice) {
            snprintf(why, whysize, "consumer %zu names a field twice", i);
            goto bad;
        }
        if (name == NULL || name->type != REDIS_REPLY_STRING) {
            snprintf(why, whysize, "consumer %zu: no name", i);
            goto bad;
        }
        if (!px_rp_int(pending, &v[i].pending) || !px_rp_int(idle, &v[i].idle_ms) ||
            v[i].pending < 0) {
            snprintf(why, whysize, "consumer %zu: pending or idle is not an integer", i);
            goto bad;
        }
        v[i].name = name->str;
        v[i].name_len = name->len;
    }
    *out = v;
    return (long)r->elements;
bad:
    free(v);
    return -1;
}

bool px_rp_xinfo_group(const redisReply *r, const char *group, long long *pending,
                       bool *pending_known, long long *lag, bool *lag_known)
{
    *pending_known = *lag_known = false;
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) return false;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *g = r->element[i];
        bool twice = false;
        if (g->type != REDIS_REPLY_ARRAY) continue;
        const redisReply *name = map_get(g, "name", &twice);
        if (name == NULL || name->type != REDIS_REPLY_STRING || !px_rp_is(name, group)) continue;
        const redisReply *p = map_get(g, "pending", &twice), *l = map_get(g, "lag", &twice);
        if (twice) return true; /* found, but nothing in it can be trusted */
        *pending_known = px_rp_int(p, pending);
        *lag_known = px_rp_int(l, lag);
        return true;
    }
    return false;
}

bool px_rp_pubsub_message(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
           r->element[0]->type == REDIS_REPLY_STRING && px_rp_is(r->element[0], "message");
}

px_server_check px_redis_server_check(const redisReply *hello, char *ver, size_t versize)
{
    snprintf(ver, versize, "?");
    if (hello == NULL) return PX_SERVER_UNKNOWN;
    if (hello->type == REDIS_REPLY_ERROR) {
        if (strncmp(hello->str, "ERR unknown command", 19) != 0) return PX_SERVER_UNKNOWN;
        snprintf(ver, versize, "older than 6.0 (no HELLO)");
        return PX_SERVER_OLD;
    }
    if (hello->type != REDIS_REPLY_ARRAY) return PX_SERVER_UNKNOWN;
    const redisReply *server = NULL, *version = NULL;
    for (size_t i = 0; i + 1 < hello->elements; i += 2) {
        const redisReply *k = hello->element[i], *v = hello->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) continue;
        if (px_rp_is(k, "server")) server = v;
        else if (px_rp_is(k, "version")) version = v;
    }
    if (version == NULL) return PX_SERVER_UNKNOWN;
    snprintf(ver, versize, "%s %s", server ? server->str : "redis", version->str);
    /* "7.0.15": digits first, read whole (no sign, blank or NUL before them) */
    if (version->len == 0 || version->str[0] < '0' || version->str[0] > '9')
        return PX_SERVER_UNKNOWN;
    if (server && server->len == 6 && strncasecmp(server->str, "valkey", 6) == 0)
        return PX_SERVER_OK; /* forked from 7.2 */
    long major = 0;
    for (size_t i = 0; i < version->len && i < 4 && version->str[i] >= '0' && version->str[i] <= '9'; i++)
        major = major * 10 + (version->str[i] - '0');
    return major >= 7 ? PX_SERVER_OK : PX_SERVER_OLD;
}
