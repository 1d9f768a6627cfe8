/*
 * sentinel.c - see sentinel.h. The sentinels' links are a process's, not a
 * data link's: one watch per loop and sentinel configuration (struct
 * sn_watch) holds one link per sentinel, which answers
 * get-master-addr-by-name, and one more (deferred, to each sentinel in turn
 * after a drop) for the +switch-master subscription, whatever the number of
 * data links that follow the master (the command link and one per stream
 * read). Each px_sentinel is one data link (deferred, check_role), connected
 * wherever the last answer to its own question said; it asks again at every
 * reconnect, so a stale answer costs one refused connect (ROLE), never a
 * write to a replica. A +switch-master drops every data link of the watch.
 */
#include "sentinel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "log.h"

#define PX_SN_ASK_AGAIN_S 1.0 /* every sentinel failed to answer: ask again after */

typedef struct sn_watch {
    struct sn_watch *next; /* in 'watches' */
    struct ev_loop *loop;  /* (ref) */
    char *key;             /* what makes two configurations one: see watch_key */
    char *master;          /* master_name */
    unsigned refs;         /* the px_sentinels using it */
    px_link **peers;       /* one per sentinel, for the questions */
    char **addrs;          /* "host:port" of each sentinel */
    size_t npeers;
    px_link *sub;           /* the +switch-master subscription */
    size_t sub_next;        /* the sentinel it goes to next */
    struct px_sentinel *on; /* the data links following the master (through 'next_on') */
} sn_watch;

static sn_watch *watches; /* every watch of the process (its loops: the daemon's, ops') */

struct px_sentinel {
    struct ev_loop *loop; /* (ref) */
    char *name;           /* the px_redis's, for logs */
    sn_watch *w;
    px_sentinel *next_on; /* in w->on */
    px_link *data;
    bool want;   /* the data link waits for an address */
    bool asking; /* a question is out, to w->peers[cur]; if destroyed meanwhile, its answer frees */
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
    if (s->destroying) { /* destroyed while its question was out (px_sentinel_destroy) */
        free(s);
        return;
    }
    char host[256], why[200];
    int port = 0;
    px_sn_addr a = reply ? px_sentinel_parse_addr(reply, host, sizeof(host), &port, why, sizeof(why))
                         : PX_SN_ADDR_BAD;
    if (a != PX_SN_ADDR_OK) {
        static px_log_limit limit;
        if (reply)
            px_log_limited(&limit, 10.0, PX_LOG_WARN,
                           "redis %s: sentinel %s has no address for master %s: %s", s->name,
                           s->w->addrs[s->cur], s->w->master, why);
        next_peer(s);
        return;
    }
    s->asking = false;
    s->want = false;
    s->from = s->cur; /* ask the one that answered first next time */
    if (strcmp(host, s->host) != 0 || port != s->port)
        px_log_info("redis %s: sentinel %s says master %s is at %s:%d", s->name, s->w->addrs[s->cur],
                    s->w->master, host, port);
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
    argv[2] = s->w->master;
    lens[2] = strlen(s->w->master);
    while (s->tried < s->w->npeers) {
        size_t i = (s->from + s->tried++) % s->w->npeers;
        if (px_link_argv(s->w->peers[i], 0, addr_cb, s, 3, argv, lens) == PX_OK) {
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
    sn_watch *w = udata;
    if (up)
        for (px_sentinel *s = w->on; s; s = s->next_on) ask(s);
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
    sn_watch *w = udata;
    char host[256];
    int port;
    const char *addr = w->addrs[w->sub_next++ % w->npeers];
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
    sn_watch *w = priv;
    char host[256];
    int port;
    if (!px_sentinel_parse_message(reply, w->master, host, sizeof(host), &port)) return;
    /* Drop each data link, even to the new address: it may have been made
     * before the switch, to the old master's address. The reconnect asks again. */
    for (px_sentinel *s = w->on; s; s = s->next_on) {
        px_log_info("redis %s: +switch-master: master %s is now at %s:%d; following it", s->name,
                    w->master, host, port);
        px_link_reset(s->data, "the master switched (+switch-master)");
    }
}

/* --- the watches ---------------------------------------------------------- */

/* Two px_redis_opts share a watch when they name the same master through the
 * same sentinels, with the same credentials and TLS (the daemon's links all
 * do: px_config_redis_opts). */
static char *watch_key(const px_redis_opts *o)
{
    px_buf b = { 0 };
    px_buf_printf(&b, "%s\n%s\n%s\n%p", o->master_name, o->sentinel_user ? o->sentinel_user : "",
                  o->sentinel_password_file ? o->sentinel_password_file : "", (const void *)o->tls);
    for (size_t i = 0; i < o->nsentinels; i++) px_buf_printf(&b, "\n%s", o->sentinels[i]);
    return b.data;
}

static sn_watch *watch_get(struct ev_loop *loop, const px_redis_opts *opts)
{
    char *key = watch_key(opts);
    for (sn_watch *w = watches; w; w = w->next)
        if (w->loop == loop && strcmp(w->key, key) == 0) {
            free(key);
            w->refs++;
            return w;
        }
    sn_watch *w = px_calloc(1, sizeof(*w));
    w->loop = loop;
    w->key = key;
    w->master = px_strdup(opts->master_name);
    w->refs = 1;
    w->next = watches;
    watches = w;
    /* The sentinels: their own credentials, no db, no scripts; TLS as the master's. */
    px_redis_opts p = {
        .user = opts->sentinel_user,
        .password_file = opts->sentinel_password_file,
        .timeout_ms = opts->timeout_ms,
        .tls = opts->tls,
        .sentinel_peer = true,
    };
    w->npeers = opts->nsentinels;
    w->peers = px_calloc(w->npeers, sizeof(*w->peers));
    w->addrs = px_calloc(w->npeers, sizeof(*w->addrs));
    for (size_t i = 0; i < w->npeers; i++) {
        char host[256], name[300];
        int port = 0;
        w->addrs[i] = px_strdup(opts->sentinels[i]);
        if (!px_addr_split(opts->sentinels[i], host, sizeof(host), &port, 0))
            snprintf(host, sizeof(host), "%s", opts->sentinels[i]); /* config.c checked it */
        snprintf(name, sizeof(name), "sentinel %s", opts->sentinels[i]);
        p.name = name;
        p.host = host;
        p.port = port;
        w->peers[i] = px_link_create(loop, &p, NULL, peer_state_cb, w);
    }
    p.name = "sentinel subscription";
    p.host = NULL;
    p.port = 0;
    w->sub = px_link_create_deferred(loop, &p, NULL, sub_state_cb, sub_want_cb, w);
    px_link_on_message(w->sub, message_cb, w);
    sub_want_cb(w->sub, w);
    return w;
}

/* The last user gone: its links are closed (a question still out is answered
 * as lost: addr_cb frees the px_sentinel that asked it). */
static void watch_put(sn_watch *w)
{
    if (--w->refs > 0) return;
    for (sn_watch **p = &watches; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    px_link_destroy(w->sub);
    for (size_t i = 0; i < w->npeers; i++) {
        px_link_destroy(w->peers[i]);
        free(w->addrs[i]);
    }
    free(w->peers);
    free(w->addrs);
    free(w->master);
    free(w->key);
    free(w);
}

/* --- public -------------------------------------------------------------- */

px_sentinel *px_sentinel_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *owner,
                                px_link_state_cb *state_cb, void *udata)
{
    px_sentinel *s = px_calloc(1, sizeof(*s));
    s->loop = loop;
    s->name = px_strdup(opts->name);
    ev_timer_init(&s->again, again_cb, 0., 0.);
    s->again.data = s;
    s->state_cb = state_cb;
    s->udata = udata;
    s->w = watch_get(loop, opts);
    s->next_on = s->w->on;
    s->w->on = s;

    px_redis_opts d = *opts;
    d.host = NULL;
    d.master_name = NULL;
    d.sentinels = NULL;
    d.nsentinels = 0;
    d.check_role = true;
    s->data = px_link_create_deferred(loop, &d, owner, data_state_cb, data_want_cb, s);
    data_want_cb(s->data, s);
    return s;
}

void px_sentinel_destroy(px_sentinel *s)
{
    if (s == NULL) return;
    s->destroying = true;
    ev_timer_stop(s->loop, &s->again);
    for (px_sentinel **p = &s->w->on; *p; p = &(*p)->next_on)
        if (*p == s) {
            *p = s->next_on;
            break;
        }
    px_link_destroy(s->data);
    free(s->name);
    bool answer_frees = s->asking; /* its question is out on a shared link */
    watch_put(s->w);               /* may answer it now, as lost */
    if (!answer_frees) free(s);
}

px_link *px_sentinel_link(const px_sentinel *s)
{
    return s->data;
}
