/*
 * sentinel.c - see sentinel.h. One link per sentinel answers
 * get-master-addr-by-name; one more (deferred, to each sentinel in turn after
 * a drop) holds the +switch-master subscription; the data link (deferred,
 * check_role) connects wherever the last answer said. The data link asks
 * again at every reconnect, so a stale answer costs one refused connect
 * (ROLE), never a write to a replica.
 */
#include "sentinel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "log.h"

#define PX_SN_ASK_AGAIN_S 1.0 /* every sentinel failed to answer: ask again after */

struct px_sentinel {
    struct ev_loop *loop; /* (ref) */
    char *name;           /* the px_redis's, for logs */
    char *master;         /* master_name */
    px_link *data;
    px_link **peers; /* one per sentinel, for the questions */
    char **addrs;    /* "host:port" of each sentinel */
    size_t npeers;
    px_link *sub;    /* the +switch-master subscription */
    size_t sub_next; /* the sentinel it goes to next */
    bool want;       /* the data link waits for an address */
    bool asking;     /* a question is out, to peers[cur] */
    size_t from, tried, cur;
    char host[256]; /* the master's address, last said */
    int port;
    ev_timer again;
    bool destroying;
    px_link_state_cb *state_cb; /* the data link's, handed on */
    void *udata;
};

static void next_peer(px_sentinel *s);

static void ask(px_sentinel *s)
{
    if (s->asking || !s->want || s->destroying) return;
    s->asking = true;
    s->tried = 0;
    next_peer(s);
}

static void addr_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_sentinel *s = priv;
    if (s->destroying) return;
    char host[256], why[200];
    int port = 0;
    px_sn_addr a = reply ? px_sentinel_parse_addr(reply, host, sizeof(host), &port, why, sizeof(why))
                         : PX_SN_ADDR_BAD;
    if (a != PX_SN_ADDR_OK) {
        static px_log_limit limit;
        if (reply)
            px_log_limited(&limit, 10.0, PX_LOG_WARN,
                           "redis %s: sentinel %s has no address for master %s: %s", s->name,
                           s->addrs[s->cur], s->master, why);
        next_peer(s);
        return;
    }
    s->asking = false;
    s->want = false;
    s->from = s->cur; /* ask the one that answered first next time */
    if (strcmp(host, s->host) != 0 || port != s->port)
        px_log_info("redis %s: sentinel %s says master %s is at %s:%d", s->name, s->addrs[s->cur],
                    s->master, host, port);
    snprintf(s->host, sizeof(s->host), "%s", host);
    s->port = port;
    px_link_connect_to(s->data, s->host, s->port);
}

/* The next sentinel not yet asked this round; after the last, a pause (a peer
 * coming up asks at once). */
static void next_peer(px_sentinel *s)
{
    static const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", NULL };
    size_t lens[3] = { 8, 23, 0 };
    argv[2] = s->master;
    lens[2] = strlen(s->master);
    while (s->tried < s->npeers) {
        size_t i = (s->from + s->tried++) % s->npeers;
        if (px_link_argv(s->peers[i], 0, addr_cb, s, 3, argv, lens) == PX_OK) {
            s->cur = i;
            return;
        }
    }
    s->asking = false;
    if (!ev_is_active(&s->again)) {
        ev_timer_set(&s->again, PX_SN_ASK_AGAIN_S, 0.);
        ev_timer_start(s->loop, &s->again);
    }
}

static void again_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    ask(w->data);
}

static void peer_state_cb(px_link *l, bool up, void *udata)
{
    (void)l;
    if (up) ask(udata);
}

static void data_state_cb(px_link *l, bool up, void *udata)
{
    px_sentinel *s = udata;
    if (s->state_cb) s->state_cb(l, up, s->udata);
}

static void data_want_cb(px_link *l, void *udata)
{
    (void)l;
    px_sentinel *s = udata;
    s->want = true;
    ask(s);
}

/* --- +switch-master ------------------------------------------------------ */

static void sub_want_cb(px_link *l, void *udata)
{
    px_sentinel *s = udata;
    char host[256];
    int port;
    const char *addr = s->addrs[s->sub_next++ % s->npeers];
    if (px_addr_split(addr, host, sizeof(host), &port, 0)) px_link_connect_to(l, host, port);
}

static void subscribed_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    (void)reply;
    (void)priv;
}

static void sub_state_cb(px_link *l, bool up, void *udata)
{
    (void)udata;
    static const char *argv[2] = { "SUBSCRIBE", "+switch-master" };
    static const size_t lens[2] = { 9, 14 };
    if (up) px_link_argv(l, 0, subscribed_cb, NULL, 2, argv, lens);
}

static void message_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_sentinel *s = priv;
    char host[256];
    int port;
    const redisReply *text = reply->element[2];
    if (s->destroying || text->type != REDIS_REPLY_STRING ||
        !px_sentinel_parse_switch(text->str, s->master, host, sizeof(host), &port))
        return;
    px_log_info("redis %s: +switch-master: master %s is now at %s:%d; following it", s->name,
                s->master, host, port);
    /* Drop the link, even to the new address: it may have been made before
     * the switch, to the old master's address. The reconnect asks again. */
    px_link_reset(s->data, "the master switched (+switch-master)");
}

/* --- public -------------------------------------------------------------- */

px_sentinel *px_sentinel_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *owner,
                                px_link_state_cb *state_cb, void *udata)
{
    px_sentinel *s = px_calloc(1, sizeof(*s));
    s->loop = loop;
    s->name = px_strdup(opts->name);
    s->master = px_strdup(opts->master_name);
    ev_timer_init(&s->again, again_cb, 0., 0.);
    s->again.data = s;
    s->state_cb = state_cb;
    s->udata = udata;

    px_redis_opts d = *opts;
    d.host = NULL;
    d.master_name = NULL;
    d.sentinels = NULL;
    d.nsentinels = 0;
    d.check_role = true;
    s->data = px_link_create_deferred(loop, &d, owner, data_state_cb, data_want_cb, s);

    /* The sentinels: their own credentials, no db, no scripts; TLS as the master's. */
    px_redis_opts p = {
        .user = opts->sentinel_user,
        .password_file = opts->sentinel_password_file,
        .timeout_ms = opts->timeout_ms,
        .tls = opts->tls,
        .sentinel_peer = true,
    };
    s->npeers = opts->nsentinels;
    s->peers = px_calloc(s->npeers, sizeof(*s->peers));
    s->addrs = px_calloc(s->npeers, sizeof(*s->addrs));
    for (size_t i = 0; i < s->npeers; i++) {
        char host[256], name[300];
        int port = 0;
        s->addrs[i] = px_strdup(opts->sentinels[i]);
        if (!px_addr_split(opts->sentinels[i], host, sizeof(host), &port, 0))
            snprintf(host, sizeof(host), "%s", opts->sentinels[i]); /* config.c checked it */
        snprintf(name, sizeof(name), "sentinel %s", opts->sentinels[i]);
        p.name = name;
        p.host = host;
        p.port = port;
        s->peers[i] = px_link_create(loop, &p, owner, peer_state_cb, s);
    }
    p.name = "sentinel subscription";
    p.host = NULL;
    p.port = 0;
    s->sub = px_link_create_deferred(loop, &p, owner, sub_state_cb, sub_want_cb, s);
    px_link_on_message(s->sub, message_cb, s);
    sub_want_cb(s->sub, s);
    data_want_cb(s->data, s);
    return s;
}

void px_sentinel_destroy(px_sentinel *s)
{
    if (s == NULL) return;
    s->destroying = true;
    ev_timer_stop(s->loop, &s->again);
    px_link_destroy(s->sub);
    for (size_t i = 0; i < s->npeers; i++) {
        px_link_destroy(s->peers[i]);
        free(s->addrs[i]);
    }
    px_link_destroy(s->data);
    free(s->peers);
    free(s->addrs);
    free(s->name);
    free(s->master);
    free(s);
}

px_link *px_sentinel_link(const px_sentinel *s)
{
    return s->data;
}
