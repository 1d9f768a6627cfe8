/*
 * redis.c - see redis.h. A thin front: a px_redis is one link (link.h) to a
 * single server, or one Redis Cluster router (cluster.h) over a link per
 * master, or the link to the master the sentinels name (sentinel.h). The routing key of every command is the caller's, explicitly.
 */
#include "redis.h"

#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "link.h"
#include "log.h"
#include "sentinel.h"

struct px_redis {
    char *name;
    px_link *link;   /* a single server */
    px_cluster *cl;  /* or a cluster */
    px_sentinel *sn; /* or a master the sentinels name: link is its data link */
    bool up;
    bool destroying;
    px_redis_state_cb *state_cb;
    void *udata;
};

static void set_up(px_redis *r, bool up)
{
    if (r->up == up) return;
    r->up = up;
    if (r->state_cb && !r->destroying) r->state_cb(r, up, r->udata);
}

static void link_state_cb(px_link *l, bool up, void *udata)
{
    (void)l;
    set_up(udata, up);
}

static void cluster_state_cb(px_redis *r, bool up)
{
    if (up) px_log_info("redis %s: cluster ready", r->name);
    set_up(r, up);
}

px_redis *px_redis_create(struct ev_loop *loop, const px_redis_opts *opts,
                          px_redis_state_cb *state_cb, void *udata)
{
    px_redis *r = px_calloc(1, sizeof(*r));
    r->name = px_strdup(opts->name);
    r->state_cb = state_cb;
    r->udata = udata;
    if (opts->nseeds) r->cl = px_cluster_create(loop, opts, r, cluster_state_cb);
    else if (opts->master_name) {
        r->sn = px_sentinel_create(loop, opts, r, link_state_cb, r);
        r->link = px_sentinel_link(r->sn);
    } else r->link = px_link_create(loop, opts, r, link_state_cb, r);
    return r;
}

void px_redis_destroy(px_redis *r)
{
    if (r == NULL) return;
    r->destroying = true;
    px_cluster_destroy(r->cl);
    if (r->sn) px_sentinel_destroy(r->sn); /* and its data link */
    else px_link_destroy(r->link);
    free(r->name);
    free(r);
}

bool px_redis_is_up(const px_redis *r)
{
    return r->up;
}

bool px_redis_key_up(const px_redis *r, const char *key, size_t len)
{
    return r->cl ? px_cluster_key_up(r->cl, key, len) : r->up;
}

px_cluster *px_redis_router(const px_redis *r)
{
    return r->cl;
}

bool px_redis_clustered(const px_redis *r)
{
    return r->cl != NULL;
}

bool px_redis_same_slot(const px_redis *r, const char *a, const char *b)
{
    return r->cl == NULL || px_cluster_slot(a, strlen(a)) == px_cluster_slot(b, strlen(b));
}

size_t px_redis_pending(const px_redis *r)
{
    return r->cl ? px_cluster_pending(r->cl) : px_link_pending(r->link);
}

bool px_redis_refused(void)
{
    return px_link_refused();
}

int px_redis_argv(px_redis *r, const char *key, long long extra_ms, px_redis_cb *cb,
                  void *priv, int argc, const char **argv, const size_t *lens)
{
    if (r->cl)
        return px_cluster_send(r->cl, NULL, 0, key, key ? strlen(key) : 0, extra_ms, cb, priv,
                               argc, argv, lens);
    return px_link_argv(r->link, extra_ms, cb, priv, argc, argv, lens);
}

int px_redis_strv(px_redis *r, const char *key, px_redis_cb *cb, void *priv, int argc,
                  const char **argv)
{
    size_t lens[16];
    if (argc > 16) return PX_ERR;
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    return px_redis_argv(r, key, 0, cb, priv, argc, argv, lens);
}

int px_redis_script(px_redis *r, px_script *s, px_redis_cb *cb, void *priv, int nkeys,
                    int argc, const char **argv, const size_t *lens)
{
    if (r->cl)
        return px_cluster_send(r->cl, s, nkeys, nkeys > 0 ? argv[0] : NULL, nkeys > 0 ? lens[0] : 0,
                               0, cb, priv, argc, argv, lens);
    return px_link_script(r->link, s, cb, priv, nkeys, argc, argv, lens);
}
