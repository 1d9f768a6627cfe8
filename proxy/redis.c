/*
 * redis.c - see redis.h. Replies on one connection come back in the order the
 * commands went out, so the pending commands form a FIFO and only its head
 * can be the first to miss its deadline... except that a blocking read may sit
 * ahead of short commands: each command's deadline is kept, and the timer
 * checks the earliest of them (the FIFO is short: reads are alone on their
 * links, and the command link carries batches that share one timeout).
 */
#include "redis.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <malloc.h>

#include <hiredis/async.h>
#include <hiredis/adapters/libev.h>
#include <hiredis/sds.h>

#include "cluster.h"
#include "log.h"
#include "reply.h"

#define PX_REDIS_BACKOFF_MIN_MS 100
#define PX_REDIS_BACKOFF_MAX_MS 5000
#define PX_SCRIPT_ARGC_MAX      8    /* EVALSHA sha numkeys + keys and arguments */
#define PX_REFUSED_LOG_S        10.0 /* an AUTH or ACL refusal: one line at most this often */
#define PX_REFUSED_MAX          8    /* commands remembered as refused (NOPERM) */
/* Buffers kept between commands and replies; larger ones (a huge entry read,
 * a large dead letter written) are given back once used (SPEC 5.6). A page of
 * 256 ordinary entries needs far less: hiredis' read buffer holds what is not
 * parsed yet, at most one string and a 16 KiB read. */
#define PX_BUF_KEEP             (256 * 1024)
#define PX_TRIM_AFTER           (4 * 1024 * 1024)   /* and then the heap's free pages */

unsigned long long px_redis_errors;

typedef struct px_rcmd {
    px_redis       *r;            /* (ref) */
    px_redis_cb    *cb;
    void           *priv;
    ev_tstamp       deadline;     /* loop time after which the link is dropped */
    px_script      *script;       /* (ref) set for EVALSHA, to retry as EVAL */
    const char     *argv[PX_SCRIPT_ARGC_MAX];  /* scripts only: into 'args' or *script */
    size_t          lens[PX_SCRIPT_ARGC_MAX];
    int             argc;
    char            verb[16];     /* the command's name (argv[0]), to clear a refusal */
    px_buf          args;         /* a script's arguments copied; kept with the record */
    struct px_rcmd *next;         /* FIFO order */
} px_rcmd;

struct px_redis {
    struct ev_loop     *loop;      /* (ref) */
    px_redis_opts       opts;      /* strings copied */
    redisAsyncContext  *ac;        /* NULL while disconnected */
    bool                up;        /* connected and authenticated */
    px_redis_state_cb  *state_cb;
    void               *udata;
    ev_timer            deadline;  /* the earliest pending command's deadline */
    ev_timer            retry;     /* reconnect backoff */
    long long           backoff_ms;
    px_rcmd            *head, *tail; /* pending commands, oldest first */
    bool                destroying;
    px_cluster         *cl;        /* cluster mode: the router; 'ac' stays NULL */
    px_reply_arena     *arena;     /* every context's replies (reply.c) */
};

static int px_redis_cmd(px_redis *r, px_redis_cb *cb, void *priv, const char *fmt, ...);

static void connect_start(px_redis *r);

/* --- small helpers ------------------------------------------------------ */

static void fifo_push(px_redis *r, px_rcmd *c)
{
    c->next = NULL;
    if (r->tail) r->tail->next = c; else r->head = c;
    r->tail = c;
}

static void fifo_remove(px_redis *r, px_rcmd *c)
{
    px_rcmd **pp = &r->head, *prev = NULL;
    while (*pp && *pp != c) { prev = *pp; pp = &(*pp)->next; }
    if (*pp == NULL) return;
    *pp = c->next;
    if (r->tail == c) r->tail = prev;
}

/* Command records are reused: one per command on the hot path. A record
 * keeps its 'args' memory, so a script command allocates nothing once warm. */
static px_rcmd *rcmd_pool;

static void rcmd_free(px_rcmd *c)
{
    c->next = rcmd_pool;
    rcmd_pool = c;
}

/* RESP for one command, into 'out' (reset first). hiredis 0.14 formats argv
 * through a generic sds printf that cost a quarter of the daemon's
 * instructions under load (callgrind); the protocol itself is this simple. */
static char *resp_len(char *p, char kind, size_t v)
{
    char tmp[24];
    int n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    *p++ = kind;
    while (n) *p++ = tmp[--n];
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static void resp_format(px_buf *out, int argc, const char **argv, const size_t *lens)
{
    size_t total = 24;
    for (int i = 0; i < argc; i++) total += lens[i] + 26;
    px_buf_reset(out);
    px_buf_reserve(out, total);
    char *p = resp_len(out->data, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        p = resp_len(p, '$', lens[i]);
        memcpy(p, argv[i], lens[i]);
        p += lens[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    out->len = (size_t)(p - out->data);
    out->data[out->len] = '\0';
}

/* Arm the timer for the oldest command. On one link every command gets the
 * same allowance (a reader's link carries one read at a time; the command
 * link's commands all get timeout_ms), so deadlines grow along the FIFO and
 * the head's is the earliest. The timer is re-armed lazily, when it fires. */
static void deadline_rearm(px_redis *r)
{
    if (r->head == NULL) { ev_timer_stop(r->loop, &r->deadline); return; }
    if (ev_is_active(&r->deadline)) return;
    ev_tstamp after = r->head->deadline - ev_now(r->loop);
    ev_timer_set(&r->deadline, after > 0 ? after : 0.001, 0.);
    ev_timer_start(r->loop, &r->deadline);
}

static void set_up(px_redis *r, bool up)
{
    if (r->up == up) return;
    r->up = up;
    if (r->state_cb && !r->destroying) r->state_cb(r, up, r->udata);
}

/* The link is gone (or being dropped): schedule a reconnect with backoff.
 * Called once per context: every caller first checks that 'r->ac' is the
 * context in question, and clears it here. */
static void link_lost_as(px_redis *r, const char *why, px_log_level level)
{
    r->ac = NULL;
    if (!r->destroying) {
        if (px_log_enabled(level))
            px_log(level, "redis %s: link lost: %s; reconnecting in %lld ms", r->opts.name, why,
                   r->backoff_ms);
        ev_timer_set(&r->retry, (double)r->backoff_ms / 1000.0, 0.);
        ev_timer_start(r->loop, &r->retry);
        r->backoff_ms *= 2;
        if (r->backoff_ms > PX_REDIS_BACKOFF_MAX_MS) r->backoff_ms = PX_REDIS_BACKOFF_MAX_MS;
    }
    set_up(r, false);
}

static void link_lost(px_redis *r, const char *why)
{
    link_lost_as(r, why, PX_LOG_WARN);
}

/* --- refusals: AUTH and ACL --------------------------------------------- */

/* Commands refused with NOPERM and not answered since (by name, lowercase). */
static char refused[PX_REFUSED_MAX][16];
static int nrefused;

bool px_redis_refused(void)
{
    return nrefused > 0;
}

static void refused_set(const char *verb, bool on)
{
    int free_at = -1;
    for (int i = 0; i < PX_REFUSED_MAX; i++) {
        if (refused[i][0] && strcmp(refused[i], verb) == 0) {
            if (!on) {
                refused[i][0] = '\0';
                nrefused--;
            }
            return;
        }
        if (!refused[i][0] && free_at < 0) free_at = i;
    }
    if (!on) return;
    if (free_at < 0) free_at = PX_REFUSED_MAX - 1;     /* full: the last one gives way */
    else nrefused++;
    snprintf(refused[free_at], sizeof(refused[0]), "%s", verb);
}

/* "user \"app\"" or "the default user", for the lines below. */
static const char *user_text(const px_redis *r, char *buf, size_t len)
{
    if (r->opts.user == NULL) return "the default user";
    snprintf(buf, len, "user \"%s\"", r->opts.user);
    return buf;
}

/* An ACL refusal of a command: NOPERM, or from inside a script (Redis 7.0
 * answers those with ERR and this text). A refused key ("NOPERM ... access
 * one of the keys", a script's "can't access") is not one: it belongs to the
 * entry whose rendered key it is, which ends in a dead letter after its tries
 * (px_decide_error_passes), while the rest of the stream goes on. */
static bool acl_refusal(const char *err)
{
    return (strncmp(err, "NOPERM", 6) == 0 && strstr(err, "to access") == NULL) ||
           strstr(err, "The user executing the script can't run") != NULL;
}

/* Drop the link after a refusal: every command on it is answered as lost (an
 * outage, retried once the link is back), quietly: the refusal's own line
 * said why. Runs inside a reply callback: hiredis frees the context when the
 * callback returns. */
static void refuse_drop(px_redis *r, const char *why)
{
    redisAsyncContext *ac = r->ac;
    link_lost_as(r, why, PX_LOG_DEBUG);
    redisAsyncFree(ac);
}

/* --- callbacks ---------------------------------------------------------- */

static void reply_cb(redisAsyncContext *ac, void *reply, void *privdata);

static int send_rcmd(px_redis *r, px_rcmd *c, int argc, const char **argv, const size_t *lens)
{
    static px_buf cmd;
    size_t vl = lens[0] < sizeof(c->verb) - 1 ? lens[0] : sizeof(c->verb) - 1;
    for (size_t i = 0; i < vl; i++) c->verb[i] = (char)(argv[0][i] | 0x20);   /* ASCII lowercase */
    c->verb[vl] = '\0';
    resp_format(&cmd, argc, argv, lens);
    int rc = redisAsyncFormattedCommand(r->ac, reply_cb, c, cmd.data, cmd.len);
    if (cmd.cap > PX_BUF_KEEP) px_buf_deinit(&cmd);     /* hiredis has its own copy */
    if (rc != REDIS_OK) return PX_ERR;
    fifo_push(r, c);
    if (!ev_is_active(&r->deadline)) deadline_rearm(r);
    return PX_OK;
}

/* After a reply that needed a large read buffer (hiredis keeps it at its
 * largest: maxbuf is 0, see connect_start), give it back once nothing is left
 * in it, and the heap's free pages with it. Between two replies the reader
 * holds only its buffer, its position and its length, so a fresh empty buffer
 * is a consistent state. */
static void readbuf_shrink(redisAsyncContext *ac)
{
    redisReader *rd = ac->c.reader;
    if (rd == NULL || rd->pos != rd->len) return;
    size_t had = sdsalloc(rd->buf);
    if (had <= PX_BUF_KEEP) return;
    sds empty = sdsempty();
    if (empty == NULL) return;
    sdsfree(rd->buf);
    rd->buf = empty;
    rd->pos = rd->len = 0;
    if (had > PX_TRIM_AFTER) malloc_trim(0);
}

static void version_cb(px_redis *r, redisReply *reply, void *priv);
static void script_loaded_cb(px_redis *r, redisReply *reply, void *priv);
static void auth_cb(px_redis *r, redisReply *reply, void *priv);
static void hello_cb(px_redis *r, redisReply *reply, void *priv);

static void reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
    px_rcmd *c = privdata;
    px_redis *r = c->r;
    redisReply *rep = reply;
    fifo_remove(r, c);
    if (r->head == NULL) ev_timer_stop(r->loop, &r->deadline);

    if (rep && rep->type == REDIS_REPLY_ERROR && strcmp(c->verb, "xinfo") == 0 &&
        acl_refusal(rep->str)) {
        /* XINFO feeds the group lag gauges and the idle-consumer cleanup only:
         * refused, those are off; the pipeline is not held up for them. */
        static px_log_limit limit;
        char ub[160];
        px_log_limited(&limit, 600.0, PX_LOG_WARN, "redis: %s lacks permission for XINFO (%s): "
                       "no group lag metrics, no idle-consumer cleanup", user_text(r, ub, sizeof(ub)),
                       rep->str);
        if (c->cb) c->cb(r, rep, c->priv);
        rcmd_free(c);
        readbuf_shrink(ac);
        return;
    }
    if (rep && rep->type == REDIS_REPLY_ERROR && r->ac && c->cb != version_cb &&
        c->cb != script_loaded_cb && acl_refusal(rep->str)) {
        /* A missing ACL permission: not ready until the command goes through.
         * HELLO (the version check) and SCRIPT LOAD (EVAL works without it)
         * may be refused. */
        static px_log_limit limit;
        char ub[160];
        px_redis_errors++;
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis: %s lacks permission: %s%s "
                       "(not ready; retrying with backoff)", user_text(r, ub, sizeof(ub)),
                       rep->str, strncmp(rep->str, "NOPERM", 6) == 0 ? ""
                       : " (in a script; ACL LOG names the command or key)");
        refused_set(c->verb[0] ? c->verb : "?", true);
        refuse_drop(r, "a command was refused");
        if (c->cb) c->cb(r, NULL, c->priv);
        rcmd_free(c);
        return;
    }
    if (nrefused && rep && rep->type != REDIS_REPLY_ERROR && c->verb[0])
        refused_set(c->verb, false);

    if (rep && rep->type == REDIS_REPLY_ERROR && c->script &&
        strncmp(rep->str, "NOSCRIPT", 8) == 0 && r->ac) {
        /* The script cache is volatile (restart, failover, SCRIPT FLUSH): send the body. */
        c->argv[0] = "EVAL";
        c->argv[1] = c->script->body;
        c->lens[0] = 4;
        c->lens[1] = strlen(c->script->body);
        c->script = NULL;
        c->deadline = ev_now(r->loop) + (double)r->opts.timeout_ms / 1000.0;
        if (send_rcmd(r, c, c->argc, c->argv, c->lens) == PX_OK) return;
        rep = NULL;
    }
    if ((rep == NULL || rep->type == REDIS_REPLY_ERROR) && !r->opts.cluster_node &&
        c->cb != auth_cb && !(rep && strncmp(rep->str, "NOAUTH", 6) == 0)) {
        /* (a NOAUTH is the handshake's to say, once: hello_cb) */
        px_redis_errors++;
        static px_log_limit limit;
        if (rep) px_log_limited(&limit, 1.0, PX_LOG_WARN, "redis %s: %s", r->opts.name, rep->str);
    }
    if (c->cb) c->cb(r, rep, c->priv);
    rcmd_free(c);
    if (reply) readbuf_shrink(ac);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    px_redis *r = w->data;
    if (r->head == NULL || r->ac == NULL) return;
    if (r->head->deadline > ev_now(loop)) { deadline_rearm(r); return; }   /* not yet: re-arm */
    /* Freeing the context runs every pending callback with reply == NULL. */
    redisAsyncContext *ac = r->ac;
    link_lost(r, "command timed out");
    redisAsyncFree(ac);
}

/* Scripts are loaded on every new connection; the sha lets later calls use EVALSHA. */
static px_script *scripts[8];
static size_t nscripts;

void px_script_init(px_script *s)
{
    s->sha[0] = '\0';
    if (nscripts < sizeof(scripts) / sizeof(scripts[0])) scripts[nscripts++] = s;
}

static void script_loaded_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_script *s = priv;
    if (reply && reply->type == REDIS_REPLY_STRING && reply->len == 40)
        memcpy(s->sha, reply->str, 41);
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
    const char *server = NULL, *version = NULL;
    for (size_t i = 0; i + 1 < hello->elements; i += 2) {
        const redisReply *k = hello->element[i], *v = hello->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) continue;
        if (strcmp(k->str, "server") == 0) server = v->str;
        else if (strcmp(k->str, "version") == 0) version = v->str;
    }
    if (version == NULL) return PX_SERVER_UNKNOWN;
    snprintf(ver, versize, "%s %s", server ? server : "redis", version);
    if (server && strcasecmp(server, "valkey") == 0) return PX_SERVER_OK;   /* forked from 7.2 */
    char *end;
    long major = strtol(version, &end, 10);
    if (end == version) return PX_SERVER_UNKNOWN;
    return major >= 7 ? PX_SERVER_OK : PX_SERVER_OLD;
}

/* The server's version, at every connect: an old one is refused (not ready,
 * reconnecting with backoff) with one line that says why: one for the
 * process, not one per link and reconnect (again if the version changes, or
 * after a good server). */
static char refused_ver[80];

static void version_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)priv;
    if (reply == NULL || r->ac == NULL) return;
    char ver[80];
    switch (px_redis_server_check(reply, ver, sizeof(ver))) {
    case PX_SERVER_OK:
        refused_ver[0] = '\0';
        return;
    case PX_SERVER_UNKNOWN:
        px_log_debug("redis %s: server version unknown (%s); going on", r->opts.name,
                     reply->type == REDIS_REPLY_ERROR ? reply->str : ver);
        return;
    case PX_SERVER_OLD:
        break;
    }
    if (strcmp(refused_ver, ver) != 0)
        px_log_error("redis %s: the server is %s: idemproxy needs Redis 7.0 or newer, or Valkey "
                     "(SET NX GET); not ready, connecting again with backoff",
                     r->opts.name, ver);
    snprintf(refused_ver, sizeof(refused_ver), "%s", ver);
    redisAsyncContext *ac = r->ac;
    link_lost(r, "server too old");
    redisAsyncDisconnect(ac);
}

/* AUTH refused (WRONGPASS, a disabled user...): one line for the process at
 * most every PX_REFUSED_LOG_S, not one per link and reconnect; not ready,
 * connecting again with backoff (the password file is read again then). */
static void auth_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)priv;
    if (reply == NULL || r->ac == NULL || reply->type != REDIS_REPLY_ERROR) return;
    static px_log_limit limit;
    char ub[160];
    px_redis_errors++;
    px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis: AUTH refused for %s: %s "
                   "(not ready; retrying with backoff)", user_text(r, ub, sizeof(ub)), reply->str);
    refuse_drop(r, "AUTH refused");
}

static void hello_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)priv;
    if (reply == NULL || r->ac == NULL) return;
    if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOAUTH", 6) == 0) {
        /* No password configured, and the server wants one: as a refused AUTH. */
        static px_log_limit limit;
        px_redis_errors++;
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis: the server wants a "
                       "password and none is configured (redis.password_file): %s (not ready; "
                       "retrying with backoff)", reply->str);
        refuse_drop(r, "no password");
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        /* A wrong db: keep retrying, as with any other outage. */
        redisAsyncContext *ac = r->ac;
        link_lost(r, "handshake refused");
        redisAsyncDisconnect(ac);
        return;
    }
    if (reply->type != REDIS_REPLY_STATUS || strcmp(reply->str, "PONG") != 0) return;
    /* While a command is refused the backoff keeps growing: each connect
     * would be refused again, and must not spin. */
    bool quiet = r->opts.cluster_node || nrefused;
    if (!nrefused) r->backoff_ms = PX_REDIS_BACKOFF_MIN_MS;
    if (quiet) px_log_debug("redis %s: connected", r->opts.name);
    else px_log_info("redis %s: connected", r->opts.name);
    set_up(r, true);
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
    px_redis *r = ac->data;
    if (status != REDIS_OK) {
        /* hiredis frees the context itself; the disconnect callback will not run. */
        char why[160];
        snprintf(why, sizeof(why), "connect failed: %s", ac->c.errstr);
        if (r->ac == ac) link_lost(r, why);
    }
}

static void disconnect_cb(const redisAsyncContext *ac, int status)
{
    px_redis *r = ac->data;
    if (r->ac != ac) return;  /* already handled (timeout, destroy) */
    link_lost(r, status == REDIS_OK ? "closed" : ac->c.errstr);
}

static void retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop; (void)revents;
    connect_start(w->data);
}

int px_redis_read_password(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        errno = err;
        return -1;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (buf[0]) *out = px_strdup(buf);
    return 0;
}

/* The password file again, at every connect: a rotated Secret is used from
 * the next connect on, without a restart. A file that cannot be read (a
 * Secret being swapped), or is empty while a user is set, keeps the last
 * password. */
static void reread_password(px_redis *r)
{
    static px_log_limit limit;
    char *pw;
    if (px_redis_read_password(r->opts.password_file, &pw) != 0) {
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_WARN, "redis: cannot read "
                       "redis.password_file %s: %s; using the password read before",
                       r->opts.password_file, strerror(errno));
        return;
    }
    if (pw == NULL && r->opts.user) {
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_WARN, "redis: redis.password_file %s "
                       "is empty, and user \"%s\" needs a password; using the password read "
                       "before", r->opts.password_file, r->opts.user);
        return;
    }
    free((char *)r->opts.password);
    r->opts.password = pw;
}

static void connect_start(px_redis *r)
{
    redisAsyncContext *ac = r->opts.unix_path
        ? redisAsyncConnectUnix(r->opts.unix_path)
        : redisAsyncConnect(r->opts.host, r->opts.port);
    if (ac == NULL || ac->err) {
        char why[160];
        snprintf(why, sizeof(why), "connect failed: %s", ac ? ac->errstr : "out of memory");
        if (ac) redisAsyncFree(ac);
        link_lost(r, why);
        return;
    }
    ac->data = r;
    r->ac = ac;
    /* hiredis frees its read buffer whenever it empties and is over 16 KiB
     * (maxbuf): every batch of replies larger than that (a read of 256
     * entries is ~40 KiB) would grow it again from nothing. Keep it; it is
     * as large as the largest batch of replies, one per link. */
    ac->c.reader->maxbuf = 0;
    px_reply_attach(ac->c.reader, r->arena);
    /* At least 64 KiB: no reply the daemon reads besides stream entries has
     * arrays of strings that large, and a small max_entry_bytes must not
     * elide a node id or a consumer name. */
    size_t limit = r->opts.max_array_bytes;
    px_reply_arena_limit(r->arena, limit && limit < 65536 ? 65536 : limit);
    redisLibevAttach(r->loop, ac);
    redisAsyncSetConnectCallback(ac, connect_cb);
    redisAsyncSetDisconnectCallback(ac, disconnect_cb);
    if (!r->opts.unix_path) redisEnableKeepAlive(&ac->c);

    /* Commands queue up before the connection completes; PING's reply says we are in. */
    if (r->opts.password_file) reread_password(r);
    if (r->opts.password) {
        if (r->opts.user)
            px_redis_cmd(r, auth_cb, NULL, "AUTH %s %s", r->opts.user, r->opts.password);
        else
            px_redis_cmd(r, auth_cb, NULL, "AUTH %s", r->opts.password);
    }
    if (r->opts.db) px_redis_cmd(r, hello_cb, NULL, "SELECT %d", r->opts.db);
    px_redis_cmd(r, version_cb, NULL, "HELLO 2");
    for (size_t i = 0; i < nscripts; i++)
        px_redis_cmd(r, script_loaded_cb, scripts[i], "SCRIPT LOAD %s", scripts[i]->body);
    px_redis_cmd(r, hello_cb, NULL, "PING");
}

/* --- public ------------------------------------------------------------- */

px_redis *px_redis_create(struct ev_loop *loop, const px_redis_opts *opts,
                          px_redis_state_cb *state_cb, void *udata)
{
    px_redis *r = px_calloc(1, sizeof(*r));
    r->loop = loop;
    r->opts = *opts;
    r->opts.name = px_strdup(opts->name);
    r->opts.host = px_strdup(opts->host);
    r->opts.unix_path = px_strdup(opts->unix_path);
    r->opts.user = px_strdup(opts->user);
    r->opts.password = px_strdup(opts->password);
    r->opts.password_file = px_strdup(opts->password_file);
    r->state_cb = state_cb;
    r->udata = udata;
    r->backoff_ms = PX_REDIS_BACKOFF_MIN_MS;
    ev_timer_init(&r->deadline, deadline_cb, 0., 0.);
    r->deadline.data = r;
    ev_timer_init(&r->retry, retry_cb, 0., 0.);
    r->retry.data = r;
    if (opts->nseeds) {
        char **seeds = px_malloc(sizeof(char *) * opts->nseeds);
        for (size_t i = 0; i < opts->nseeds; i++) seeds[i] = px_strdup(opts->seeds[i]);
        r->opts.seeds = (const char *const *)seeds;
        r->cl = px_cluster_create(loop, &r->opts, r);
        return r;
    }
    r->opts.seeds = NULL;
    r->arena = px_reply_arena_new();
    connect_start(r);
    return r;
}

void px_redis_destroy(px_redis *r)
{
    if (r == NULL) return;
    r->destroying = true;
    px_cluster_destroy(r->cl);
    for (size_t i = 0; r->opts.seeds && i < r->opts.nseeds; i++) free((char *)r->opts.seeds[i]);
    free((void *)r->opts.seeds);
    ev_timer_stop(r->loop, &r->deadline);
    ev_timer_stop(r->loop, &r->retry);
    if (r->ac) {
        redisAsyncContext *ac = r->ac;
        r->ac = NULL;
        redisAsyncFree(ac);
    }
    px_reply_arena_release(r->arena);   /* after the reader's last reply, if it holds one */
    free((char *)r->opts.name);
    free((char *)r->opts.host);
    free((char *)r->opts.unix_path);
    free((char *)r->opts.user);
    free((char *)r->opts.password);
    free((char *)r->opts.password_file);
    free(r);
}

bool px_redis_is_up(const px_redis *r)
{
    return r->up;
}

void px_redis_cluster_state(px_redis *outer, bool up)
{
    if (up) px_log_info("redis %s: cluster ready", outer->opts.name);
    set_up(outer, up);
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
    if (r->cl) return px_cluster_pending(r->cl);
    size_t n = 0;
    for (px_rcmd *c = r->head; c; c = c->next) n++;
    return n;
}

static px_rcmd *rcmd_new(px_redis *r, px_redis_cb *cb, void *priv, long long extra_ms)
{
    px_rcmd *c = rcmd_pool;
    if (c) {
        px_buf args = c->args;
        rcmd_pool = c->next;
        memset(c, 0, sizeof(*c));
        c->args = args;
    } else c = px_calloc(1, sizeof(*c));
    c->r = r;
    c->cb = cb;
    c->priv = priv;
    c->deadline = ev_now(r->loop) + (double)(r->opts.timeout_ms + extra_ms) / 1000.0;
    return c;
}

int px_redis_argv(px_redis *r, const char *key, long long extra_ms, px_redis_cb *cb,
                  void *priv, int argc, const char **argv, const size_t *lens)
{
    if (r->cl)
        return px_cluster_send(r->cl, NULL, 0, key, key ? strlen(key) : 0, extra_ms, cb, priv,
                               argc, argv, lens);
    if (r->ac == NULL || !r->up) return PX_ERR;
    px_rcmd *c = rcmd_new(r, cb, priv, extra_ms);
    if (send_rcmd(r, c, argc, argv, lens) != PX_OK) { rcmd_free(c); return PX_ERR; }
    return PX_OK;
}

int px_redis_strv(px_redis *r, px_redis_cb *cb, void *priv, int argc, const char **argv)
{
    size_t lens[16];
    if (argc > 16) return PX_ERR;
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    return px_redis_argv(r, argc > 1 ? argv[1] : NULL, 0, cb, priv, argc, argv, lens);
}

/* Printf-style, for the handshake (hiredis' format). */
static int px_redis_cmd(px_redis *r, px_redis_cb *cb, void *priv, const char *fmt, ...)
{
    if (r->ac == NULL) return PX_ERR;
    px_rcmd *c = rcmd_new(r, cb, priv, 0);
    size_t vl = strcspn(fmt, " ");                  /* the command's name, as in send_rcmd */
    if (vl > sizeof(c->verb) - 1) vl = sizeof(c->verb) - 1;
    for (size_t i = 0; i < vl; i++) c->verb[i] = (char)(fmt[i] | 0x20);
    c->verb[vl] = '\0';
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAsyncCommand(r->ac, reply_cb, c, fmt, ap);
    va_end(ap);
    if (rc != REDIS_OK) { rcmd_free(c); return PX_ERR; }
    fifo_push(r, c);
    if (!ev_is_active(&r->deadline)) deadline_rearm(r);
    return PX_OK;
}

int px_redis_script(px_redis *r, px_script *s, px_redis_cb *cb, void *priv, int nkeys,
                    int argc, const char **argv, const size_t *lens)
{
    if (r->cl)
        return px_cluster_send(r->cl, s, nkeys, nkeys > 0 ? argv[0] : NULL, nkeys > 0 ? lens[0] : 0,
                               0, cb, priv, argc, argv, lens);
    if (r->ac == NULL || !r->up || argc + 3 > PX_SCRIPT_ARGC_MAX || nkeys < 0 || nkeys > argc)
        return PX_ERR;
    px_rcmd *c = rcmd_new(r, cb, priv, 0);
    c->script = s;
    c->argc = argc + 3;
    /* Kept for a NOSCRIPT retry: the script and its sha outlive the command;
     * numkeys and the arguments are copied into the record's own buffer. */
    if (s->sha[0]) {
        c->argv[0] = "EVALSHA";  c->lens[0] = 7;
        c->argv[1] = s->sha;     c->lens[1] = 40;
    } else {
        c->script = NULL;
        c->argv[0] = "EVAL";     c->lens[0] = 4;
        c->argv[1] = s->body;    c->lens[1] = strlen(s->body);
    }
    size_t total = 1;                               /* numkeys: one digit, 0..5 */
    for (int i = 0; i < argc; i++) total += lens[i];
    px_buf_reset(&c->args);
    px_buf_reserve(&c->args, total);                /* copies below never move */
    char *p = c->args.data;
    *p = (char)('0' + nkeys);
    c->argv[2] = p++;  c->lens[2] = 1;
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        c->argv[i + 3] = p;  c->lens[i + 3] = lens[i];
        p += lens[i];
    }
    *p = '\0';                                      /* px_buf keeps a NUL at the end */
    c->args.len = total;
    if (send_rcmd(r, c, c->argc, c->argv, c->lens) != PX_OK) {
        rcmd_free(c);
        return PX_ERR;
    }
    return PX_OK;
}
