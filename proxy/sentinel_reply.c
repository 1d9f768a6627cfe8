/*
 * sentinel_reply.c - the pure part of sentinel.h: replies and messages of a
 * sentinel and ROLE, parsed without I/O (tests/unit/test_sentinel.c).
 */
#include "sentinel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "1".."65535" and nothing else. */
static bool port_of(const char *s, size_t len, int *port)
{
    if (len == 0 || len > 5) return false;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535) return false;
    *port = (int)v;
    return true;
}

/* A host as a sentinel names one: no blank, control byte or NUL (with a NUL,
 * the link would dial the part before it, a host the sentinel did not name). */
static bool host_ok(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f) return false;
    return true;
}

px_sn_addr px_sentinel_parse_addr(const redisReply *r, char *host, size_t hostsize, int *port,
                                  char *why, size_t whysize)
{
    snprintf(why, whysize, "no reply");
    if (r == NULL) return PX_SN_ADDR_BAD;
    if (r->type == REDIS_REPLY_NIL) {
        snprintf(why, whysize, "it monitors no master of that name");
        return PX_SN_ADDR_UNKNOWN;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        /* "-\r\n" says nothing: the reason must still say something */
        snprintf(why, whysize, "%s", r->str[0] ? r->str : "an error reply without text");
        return PX_SN_ADDR_BAD;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
        snprintf(why, whysize, "the reply is not [ip, port]");
        return PX_SN_ADDR_BAD;
    }
    const redisReply *ip = r->element[0], *p = r->element[1];
    if (ip->len == 0 || ip->len >= hostsize || !host_ok(ip->str, ip->len)) {
        snprintf(why, whysize, "a bad address in the reply");
        return PX_SN_ADDR_BAD;
    }
    if (!port_of(p->str, p->len, port)) {
        snprintf(why, whysize, "a bad port in the reply");
        return PX_SN_ADDR_BAD;
    }
    memcpy(host, ip->str, ip->len);
    host[ip->len] = '\0';
    why[0] = '\0';
    return PX_SN_ADDR_OK;
}

bool px_sentinel_parse_switch(const char *msg, size_t msglen, const char *name, char *host,
                              size_t hostsize, int *port)
{
    const char *tok[5];
    size_t len[5];
    int n = 0;
    const char *p = msg, *end = msg + msglen;
    while (p < end) {
        while (p < end && *p == ' ') p++;
        if (p == end) break;
        if (n == 5) return false; /* more than five words */
        tok[n] = p;
        while (p < end && *p != ' ') p++;
        len[n] = (size_t)(p - tok[n]);
        n++;
    }
    if (n != 5) return false;
    if (len[0] != strlen(name) || memcmp(tok[0], name, len[0]) != 0) return false;
    int oldport;
    if (!port_of(tok[2], len[2], &oldport) || !port_of(tok[4], len[4], port)) return false;
    if (len[3] >= hostsize || !host_ok(tok[3], len[3])) return false;
    memcpy(host, tok[3], len[3]);
    host[len[3]] = '\0';
    return true;
}

bool px_sentinel_parse_message(const redisReply *r, const char *name, char *host, size_t hostsize,
                               int *port)
{
    static const char chan[] = "+switch-master";
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 3) return false;
    const redisReply *k = r->element[0], *c = r->element[1], *t = r->element[2];
    return k->type == REDIS_REPLY_STRING && k->len == 7 && memcmp(k->str, "message", 7) == 0 &&
           c->type == REDIS_REPLY_STRING && c->len == sizeof(chan) - 1 &&
           memcmp(c->str, chan, c->len) == 0 && t->type == REDIS_REPLY_STRING &&
           px_sentinel_parse_switch(t->str, t->len, name, host, hostsize, port);
}

bool px_sentinel_role_master(const redisReply *r, char *role, size_t rolesize)
{
    snprintf(role, rolesize, "?");
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return false;
    const redisReply *e = r->element[0];
    snprintf(role, rolesize, "%s", e->str);
    return e->len == 6 && memcmp(e->str, "master", 6) == 0; /* "master\0..." is not */
}
