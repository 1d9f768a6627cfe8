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
        snprintf(why, whysize, "%s", r->str);
        return PX_SN_ADDR_BAD;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
        snprintf(why, whysize, "the reply is not [ip, port]");
        return PX_SN_ADDR_BAD;
    }
    const redisReply *ip = r->element[0], *p = r->element[1];
    if (ip->len == 0 || ip->len >= hostsize || memchr(ip->str, ' ', ip->len) != NULL) {
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

bool px_sentinel_parse_switch(const char *msg, const char *name, char *host, size_t hostsize,
                              int *port)
{
    const char *tok[5];
    size_t len[5];
    int n = 0;
    const char *p = msg;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        if (n == 5) return false; /* more than five words */
        tok[n] = p;
        while (*p && *p != ' ') p++;
        len[n] = (size_t)(p - tok[n]);
        n++;
    }
    if (n != 5) return false;
    if (len[0] != strlen(name) || memcmp(tok[0], name, len[0]) != 0) return false;
    int oldport;
    if (!port_of(tok[2], len[2], &oldport) || !port_of(tok[4], len[4], port)) return false;
    if (len[3] >= hostsize) return false;
    memcpy(host, tok[3], len[3]);
    host[len[3]] = '\0';
    return true;
}

bool px_sentinel_role_master(const redisReply *r, char *role, size_t rolesize)
{
    snprintf(role, rolesize, "?");
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return false;
    snprintf(role, rolesize, "%s", r->element[0]->str);
    return strcmp(r->element[0]->str, "master") == 0;
}
