/*
 * redis.c - see redis.h. A thin front: a px_redis is one link (link.h) to a
 * single server, or one Redis Cluster router (cluster.h) over a link per
 * master, or the link to the master the sentinels name (sentinel.h). The routing key of every command is the caller's, explicitly.
 * It also holds what every link shares: the scripts each loads at connect,
 * the error count, and the pure checks of the handshake (the server's version,
 * the password file).
 */
#include "redis.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cluster.h"
#include "link.h"
#include "log.h"
#include "sentinel.h"

/* --- what every link shares: its scripts, its error count, the checks of
 * its handshake -------------------------------------------------------------- */

unsigned long long px_redis_errors;

/* Scripts are loaded on every new connection; the sha lets later calls use EVALSHA. */
static px_script *scripts[9]; /* NULL-terminated */
static size_t nscripts;

void px_script_init(px_script *s)
{
    s->sha[0] = '\0';
    if (nscripts + 1 < sizeof(scripts) / sizeof(scripts[0])) scripts[nscripts++] = s;
}

px_script **px_scripts(void)
{
    return scripts;
}


/* read(2), not stdio: stdio's buffer would be freed holding the password;
 * 'buf' is wiped before returning. */
int px_redis_read_password(const char *path, char **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[1024];
    size_t n = 0;
    int err = 0;
    while (n < sizeof(buf) - 1) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) err = errno;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (err) {
        explicit_bzero(buf, sizeof(buf));
        errno = err;
        return -1;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (buf[0]) *out = px_strdup(buf);
    explicit_bzero(buf, sizeof(buf));
    return 0;
}

/* --- the front ---------------------------------------------------------------- */

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
