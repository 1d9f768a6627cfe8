/*
 * cluster.c - see cluster.h.
 *
 * The router keeps a slot table (slot -> node) learned from CLUSTER SLOTS and
 * a node list, one px_redis link per master. Each command is copied once into
 * a record (argv in one allocation), so it can be sent again after a redirect
 * or a wait; the caller's callback runs exactly once, with the final reply or
 * NULL (link lost, deadline passed), as on a single server.
 *
 * The map is refreshed after a MOVED, after a link is lost, and every half
 * second while the cluster is not ready (a failover in progress). Nodes that
 * are no longer masters are dropped once idle, from a timer (never from inside
 * one of their own callbacks).
 */
#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "decide.h"
#include "link.h"
#include "log.h"

#define PX_CLUSTER_MAX_REDIRECTS 16
#define PX_CLUSTER_WAIT_S        0.05 /* TRYAGAIN/CLUSTERDOWN and waiting commands retry */
#define PX_CLUSTER_REFRESH_S     0.5  /* map refresh while not ready */
#define PX_CLUSTER_REFRESH_MIN_S 0.1  /* at most this often */

unsigned long long px_redis_redirects[2];

/* --- the router ----------------------------------------------------------- */

typedef struct cl_node {
    px_cluster *cl; /* (ref) */
    char addr[280]; /* "host:port" */
    char host[PX_ADDR_HOST_MAX];
    px_link *link;
    bool master;  /* in the current map */
    bool pointed; /* gc_cb: a slot points at it */
    struct cl_node *next;
} cl_node;

typedef struct ccmd {
    px_cluster *cl;
    px_redis_cb *cb;
    void *priv;
    px_script *script;
    int nkeys;
    long long extra_ms;
    unsigned slot;
    bool any; /* no key: any master */
    int redirects;
    char ask[280];      /* one-shot ASK target, "" when none */
    ev_tstamp deadline; /* given up (reply NULL) after this, while waiting */
    struct ccmd *next;  /* waiting list */
    int argc;
    const char **argv; /* into the same allocation */
    size_t *lens;
} ccmd;

struct px_cluster {
    struct ev_loop *loop;
    px_redis *outer;
    px_cluster_state_cb *state_cb;
    px_redis_opts opts; /* strings copied, for the links made later */
    px_tls_opts tls;
    cl_node *nodes;
    cl_node *slots[PX_CLUSTER_SLOTS];
    bool have_map; /* every slot has a master */
    bool up;
    bool refreshing; /* a CLUSTER SLOTS in flight */
    ev_tstamp last_refresh;
    ev_timer refresh;
    ev_timer wait; /* retries waiting commands */
    ev_timer gc;   /* drops idle non-master nodes */
    ccmd *wait_head, *wait_tail;
    size_t nwaiting;
    bool destroying;
};

static void dispatch(px_cluster *cl, ccmd *c);
static void refresh_soon(px_cluster *cl);

static void update_up(px_cluster *cl)
{
    bool up = cl->have_map;
    for (cl_node *n = cl->nodes; n && up; n = n->next)
        if (n->master && !px_link_is_up(n->link)) up = false;
    if (!up) refresh_soon(cl);
    if (up == cl->up) return;
    cl->up = up;
    if (!cl->destroying) cl->state_cb(cl->outer, up);
}

static void retry_waiting(px_cluster *cl)
{
    ccmd *c = cl->wait_head;
    cl->wait_head = cl->wait_tail = NULL;
    cl->nwaiting = 0;
    ev_tstamp now = ev_now(cl->loop);
    while (c) {
        ccmd *next = c->next;
        if (now >= c->deadline) {
            px_redis_errors++;
            px_log_warn("redis %s: command gave up waiting for the cluster (slot %u)",
                        cl->opts.name, c->slot);
            if (c->cb) c->cb(cl->outer, NULL, c->priv);
            free(c);
        } else {
            dispatch(cl, c);
        }
        c = next;
    }
}

static void node_state_cb(px_link *l, bool up, void *udata)
{
    (void)l;
    cl_node *n = udata;
    px_cluster *cl = n->cl;
    if (cl->destroying) return;
    if (up && !cl->up && !cl->refreshing) {
        ev_timer_stop(cl->loop, &cl->refresh); /* a node to ask: ask now */
        cl->last_refresh = 0;
    }
    update_up(cl);
    if (up && cl->wait_head) retry_waiting(cl);
}

/* The node for "host:port", created (and connecting) when 'create'. */
static cl_node *node_get(px_cluster *cl, const char *addr, bool create)
{
    for (cl_node *n = cl->nodes; n; n = n->next)
        if (strcmp(n->addr, addr) == 0) return n;
    if (!create) return NULL;
    char host[PX_ADDR_HOST_MAX];
    int port;
    /* A startup node ("[::1]:7000") or what Redis sent ("::1:7000", unbracketed). */
    if (!px_addr_split(addr, host, sizeof(host), &port, PX_ADDR_BARE_IPV6)) return NULL;
    cl_node *n = px_calloc(1, sizeof(*n));
    n->cl = cl;
    snprintf(n->addr, sizeof(n->addr), "%s", addr);
    snprintf(n->host, sizeof(n->host), "%s", host);
    char name[400];
    snprintf(name, sizeof(name), "%s %s", cl->opts.name, addr);
    px_redis_opts o = cl->opts;
    o.name = name;
    o.host = host;
    o.port = port;
    o.unix_path = NULL;
    o.seeds = NULL;
    o.nseeds = 0;
    o.cluster_node = true;
    n->next = cl->nodes;
    cl->nodes = n;
    n->link = px_link_create(cl->loop, &o, cl->outer, node_state_cb, n);
    return n;
}

static void node_free(cl_node *n)
{
    px_link_destroy(n->link);
    free(n);
}

static void finish(ccmd *c, redisReply *reply)
{
    if (reply == NULL || (reply->type == REDIS_REPLY_ERROR && !px_decide_error_expected(reply->str))) {
        px_redis_errors++;
        static px_log_limit limit;
        if (reply) px_log_limited(&limit, 1.0, PX_LOG_WARN, "redis %s: %s", c->cl->opts.name, reply->str);
    }
    if (c->cb) c->cb(c->cl->outer, reply, c->priv);
    free(c);
}

static void wait_push(px_cluster *cl, ccmd *c)
{
    c->next = NULL;
    if (cl->wait_tail) cl->wait_tail->next = c;
    else cl->wait_head = c;
    cl->wait_tail = c;
    cl->nwaiting++;
    if (!ev_is_active(&cl->wait)) {
        ev_timer_set(&cl->wait, PX_CLUSTER_WAIT_S, 0.);
        ev_timer_start(cl->loop, &cl->wait);
    }
}

static void command_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    ccmd *c = priv;
    px_cluster *cl = c->cl;
    if (cl->destroying) {
        finish(c, NULL);
        return;
    }
    if (reply == NULL) {
        refresh_soon(cl);
    } else if (reply->type == REDIS_REPLY_ERROR) {
        px_redirect rd;
        if (px_cluster_redirect(reply->str, &rd) && c->redirects < PX_CLUSTER_MAX_REDIRECTS) {
            c->redirects++;
            px_redis_redirects[rd.ask]++;
            if (rd.ask) {
                snprintf(c->ask, sizeof(c->ask), "%s", rd.addr);
            } else {
                cl_node *n = node_get(cl, rd.addr, true);
                if (n) cl->slots[rd.slot] = n;
                refresh_soon(cl);
            }
            dispatch(cl, c);
            return;
        }
        if ((strncmp(reply->str, "TRYAGAIN", 8) == 0 || strncmp(reply->str, "CLUSTERDOWN", 11) == 0) &&
            ev_now(cl->loop) < c->deadline) {
            if (reply->str[0] == 'C') refresh_soon(cl);
            wait_push(cl, c);
            return;
        }
    }
    finish(c, reply);
}

static cl_node *any_master(px_cluster *cl)
{
    for (cl_node *n = cl->nodes; n; n = n->next)
        if (n->master && px_link_is_up(n->link)) return n;
    return NULL;
}

static void dispatch(px_cluster *cl, ccmd *c)
{
    cl_node *n = c->ask[0] ? node_get(cl, c->ask, true) : c->any ? any_master(cl)
                                                                 : cl->slots[c->slot];
    if (n == NULL || !px_link_is_up(n->link)) {
        wait_push(cl, c);
        return;
    }
    if (c->ask[0]) {
        static const char *asking[] = { "ASKING" };
        static const size_t asking_len[] = { 6 };
        px_link_argv(n->link, 0, NULL, NULL, 1, asking, asking_len);
        c->ask[0] = '\0';
    }
    int rc = c->script
                 ? px_link_script(n->link, c->script, command_reply_cb, c, c->nkeys, c->argc, c->argv, c->lens)
                 : px_link_argv(n->link, c->extra_ms, command_reply_cb, c, c->argc, c->argv, c->lens);
    if (rc != PX_OK) wait_push(cl, c);
}

bool px_cluster_key_up(const px_cluster *cl, const char *key, size_t len)
{
    if (key == NULL) {
        for (cl_node *n = cl->nodes; n; n = n->next)
            if (n->master && px_link_is_up(n->link)) return true;
        return false;
    }
    const cl_node *n = cl->slots[px_cluster_slot(key, len)];
    return n && px_link_is_up(n->link);
}

int px_cluster_send(px_cluster *cl, px_script *s, int nkeys, const char *key, size_t keylen,
                    long long extra_ms, px_redis_cb *cb, void *priv, int argc, const char **argv, const size_t *lens)
{
    /* A master down (a failover in progress) stops only the commands for its
     * slots: the other masters' keys are served, their leases extended. */
    if (!cl->up && !px_cluster_key_up(cl, key, keylen)) return PX_ERR;
    size_t bytes = 0;
    for (int i = 0; i < argc; i++) bytes += lens[i] + 1;
    ccmd *c = px_malloc(sizeof(*c) + (size_t)argc * (sizeof(char *) + sizeof(size_t)) + bytes);
    memset(c, 0, sizeof(*c));
    c->cl = cl;
    c->cb = cb;
    c->priv = priv;
    c->script = s;
    c->nkeys = nkeys;
    c->extra_ms = extra_ms;
    c->deadline = ev_now(cl->loop) + (double)(cl->opts.timeout_ms + extra_ms) / 1000.0;
    c->any = key == NULL;
    c->slot = key ? px_cluster_slot(key, keylen) : 0;
    c->argc = argc;
    c->argv = (const char **)(c + 1);
    c->lens = (size_t *)(c->argv + argc);
    char *p = (char *)(c->lens + argc);
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        p[lens[i]] = '\0';
        c->argv[i] = p;
        c->lens[i] = lens[i];
        p += lens[i] + 1;
    }
    dispatch(cl, c);
    return PX_OK;
}

/* --- the map ---------------------------------------------------------------- */

static void gc_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_cluster *cl = w->data;
    /* A MOVED may have pointed a slot at a node the map does not list, after
     * the map that made this cleanup due (issue 15, item 10): such a node
     * stays until a map says where that slot lives. */
    for (cl_node *n = cl->nodes; n; n = n->next) n->pointed = false;
    for (unsigned s = 0; s < PX_CLUSTER_SLOTS; s++)
        if (cl->slots[s]) cl->slots[s]->pointed = true;
    for (cl_node **pp = &cl->nodes; *pp;) {
        cl_node *n = *pp;
        if (!n->master && !n->pointed && px_link_pending(n->link) == 0 && cl->have_map) {
            *pp = n->next;
            node_free(n);
        } else {
            pp = &n->next;
        }
    }
}

static void slots_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    cl_node *asked = priv; /* the node asked: freed only once idle (gc_cb) */
    px_cluster *cl = asked->cl;
    cl->refreshing = false;
    if (cl->destroying) return;
    px_slot_range *v;
    char why[200];
    int nr = px_cluster_parse_slots(reply, asked ? asked->host : "127.0.0.1", &v, why, sizeof(why));
    if (why[0]) {
        px_redis_errors++;
        px_log_warn("redis %s: CLUSTER SLOTS: malformed reply, refused %s", cl->opts.name, why);
    }
    if (nr < 0) {
        px_log_warn("redis %s: CLUSTER SLOTS: %s", cl->opts.name,
                    reply && reply->type == REDIS_REPLY_ERROR ? reply->str : "no slot map");
        update_up(cl);
        return;
    }
    for (cl_node *n = cl->nodes; n; n = n->next) n->master = false;
    memset(cl->slots, 0, sizeof(cl->slots));
    for (int i = 0; i < nr; i++) {
        cl_node *n = node_get(cl, v[i].addr, true);
        if (n == NULL) continue;
        n->master = true;
        for (unsigned s = v[i].start; s <= v[i].end; s++) cl->slots[s] = n;
    }
    free(v);
    size_t unmapped = 0;
    for (unsigned s = 0; s < PX_CLUSTER_SLOTS; s++) unmapped += cl->slots[s] == NULL;
    if (unmapped && (cl->have_map || !cl->last_refresh))
        px_log_warn("redis %s: %zu slots have no master", cl->opts.name, unmapped);
    cl->have_map = unmapped == 0;
    if (!ev_is_active(&cl->gc)) { /* two maps in one loop turn: one cleanup */
        ev_timer_set(&cl->gc, 0., 0.);
        ev_timer_start(cl->loop, &cl->gc);
    }
    update_up(cl);
    if (cl->wait_head) retry_waiting(cl);
}

static void refresh_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    px_cluster *cl = w->data;
    if (cl->refreshing) return;
    static const char *argv[] = { "CLUSTER", "SLOTS" };
    static const size_t lens[] = { 7, 5 };
    /* Ask a master first, then any node we know; with none up, dial the startup nodes again. */
    cl_node *n = any_master(cl);
    for (cl_node *m = cl->nodes; n == NULL && m; m = m->next)
        if (px_link_is_up(m->link)) n = m;
    cl->last_refresh = ev_now(loop);
    if (n && px_link_argv(n->link, 0, slots_reply_cb, n, 2, argv, lens) == PX_OK) {
        cl->refreshing = true;
        return;
    }
    for (size_t i = 0; i < cl->opts.nseeds; i++) node_get(cl, cl->opts.seeds[i], true);
    ev_timer_set(&cl->refresh, PX_CLUSTER_REFRESH_S, 0.);
    ev_timer_start(loop, &cl->refresh);
}

/* Ask for the map again: at once if the last ask is old enough, else a bit later. */
static void refresh_soon(px_cluster *cl)
{
    if (cl->destroying || cl->refreshing || ev_is_active(&cl->refresh)) return;
    ev_tstamp after = cl->last_refresh + (cl->up ? PX_CLUSTER_REFRESH_MIN_S : PX_CLUSTER_REFRESH_S) - ev_now(cl->loop);
    ev_timer_set(&cl->refresh, after > 0 ? after : 0., 0.);
    ev_timer_start(cl->loop, &cl->refresh);
}

static void wait_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    retry_waiting(w->data);
}

/* A startup node's link coming up starts the first refresh (node_state_cb -> update_up). */
px_cluster *px_cluster_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *outer,
                              px_cluster_state_cb *state_cb)
{
    px_cluster *cl = px_calloc(1, sizeof(*cl));
    cl->loop = loop;
    cl->outer = outer;
    cl->state_cb = state_cb;
    cl->opts = *opts;
    cl->opts.name = px_strdup(opts->name);
    cl->opts.user = opts->user ? px_strdup(opts->user) : NULL;
    cl->opts.password = opts->password ? px_strdup(opts->password) : NULL;
    cl->opts.password_file = opts->password_file ? px_strdup(opts->password_file) : NULL;
    char **seeds = px_malloc(sizeof(char *) * (opts->nseeds ? opts->nseeds : 1));
    for (size_t i = 0; i < opts->nseeds; i++) seeds[i] = px_strdup(opts->seeds[i]);
    cl->opts.seeds = (const char *const *)seeds;
    if (opts->tls) { /* the link copies its files' names again */
        cl->tls = *opts->tls;
        cl->opts.tls = &cl->tls;
    }
    ev_timer_init(&cl->refresh, refresh_cb, 0., 0.);
    cl->refresh.data = cl;
    ev_timer_init(&cl->wait, wait_cb, 0., 0.);
    cl->wait.data = cl;
    ev_timer_init(&cl->gc, gc_cb, 0., 0.);
    cl->gc.data = cl;
    for (size_t i = 0; i < opts->nseeds; i++) node_get(cl, opts->seeds[i], true);
    refresh_soon(cl);
    return cl;
}

void px_cluster_destroy(px_cluster *cl)
{
    if (cl == NULL) return;
    cl->destroying = true;
    ev_timer_stop(cl->loop, &cl->refresh);
    ev_timer_stop(cl->loop, &cl->wait);
    ev_timer_stop(cl->loop, &cl->gc);
    while (cl->nodes) {
        cl_node *n = cl->nodes;
        cl->nodes = n->next;
        node_free(n);
    }
    for (ccmd *c = cl->wait_head, *next; c; c = next) {
        next = c->next;
        if (c->cb) c->cb(cl->outer, NULL, c->priv);
        free(c);
    }
    for (size_t i = 0; i < cl->opts.nseeds; i++) free((char *)cl->opts.seeds[i]);
    free((void *)cl->opts.seeds);
    free((char *)cl->opts.name);
    free((char *)cl->opts.user);
    px_free_secret((char *)cl->opts.password);
    free((char *)cl->opts.password_file);
    free(cl);
}

size_t px_cluster_stale_slots(const px_cluster *cl)
{
    size_t n = 0;
    for (unsigned s = 0; s < PX_CLUSTER_SLOTS; s++) {
        if (cl->slots[s] == NULL) continue;
        const cl_node *m = cl->nodes;
        while (m && m != cl->slots[s]) m = m->next;
        n += m == NULL;
    }
    return n;
}

size_t px_cluster_pending(const px_cluster *cl)
{
    size_t n = cl->nwaiting;
    for (cl_node *m = cl->nodes; m; m = m->next) n += px_link_pending(m->link);
    return n;
}
