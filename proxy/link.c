/*
 * link.c - see link.h. Replies on one connection come back in the order the
 * commands went out, so the pending commands form a FIFO whose head is the
 * next reply's. Every command on one link gets the same allowance (a reader's
 * link carries one read at a time; the command link's commands all get
 * timeout_ms), so deadlines grow along the FIFO and the head's is the
 * earliest. Not quite always: on a cluster, a reader's node link can carry
 * CLUSTER SLOTS (or ASKING) behind its blocking read, whose deadline is
 * later by the BLOCK time; replies come in order, so the command behind is
 * answered after the read anyway, and the head's deadline bounds both. The
 * handshake's commands are queued before the name is resolved,
 * so one deadline covers the lookup, the connect, TLS and the handshake.
 * A deadline bounds silence, not transfer (docs/guarantee.md): while a reply's
 * bytes keep arriving, the link's deadlines are at least timeout_ms after the
 * last of them ('heard', due), so a huge reply on a slow link is read to its
 * end and one that stops arriving still times out.
 */
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <malloc.h>

#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "decide.h"
#include "log.h"
#include "replies.h"
#include "reply.h"
#include "sentinel.h"

#define PX_LINK_BACKOFF_MIN_MS 100
#define PX_LINK_BACKOFF_MAX_MS 5000
#define PX_ADDR_MIN_MS         50   /* the least a connect to one address of several gets */
#define PX_SCRIPT_ARGC_MAX     8    /* EVALSHA sha numkeys + keys and arguments */
#define PX_REFUSED_LOG_S       10.0 /* an AUTH or ACL refusal: one line at most this often */
#define PX_REFUSED_MAX         8    /* commands remembered as refused (NOPERM) */
#define PX_READ_CHUNK          (16 * 1024)
/* Buffers kept between commands and replies; larger ones (a huge entry read,
 * a large dead letter written) are given back once used (docs/guarantee.md). */
#define PX_BUF_KEEP   (256 * 1024)
#define PX_TRIM_AFTER (4 * 1024 * 1024) /* and then the heap's free pages */

typedef struct px_rcmd {
    px_link *l; /* (ref) */
    px_redis_cb *cb;
    void *priv;
    ev_tstamp deadline;                   /* loop time after which the link is dropped */
    bool blocking;                        /* its deadline has a BLOCK time on top */
    px_script *script;                    /* (ref) set for EVALSHA, to retry as EVAL */
    const char *argv[PX_SCRIPT_ARGC_MAX]; /* scripts only: into 'args' or *script */
    size_t lens[PX_SCRIPT_ARGC_MAX];
    int argc;
    char verb[16];        /* the command's name (argv[0]), to clear a refusal */
    px_buf args;          /* a script's arguments copied; kept with the record */
    struct px_rcmd *next; /* FIFO order */
} px_rcmd;

typedef enum { ST_DOWN,
               ST_RESOLVING,
               ST_CONNECTING,
               ST_TLS,
               ST_OPEN } link_state;

typedef struct rjob rjob;

struct px_link {
    struct ev_loop *loop; /* (ref) */
    px_redis_opts opts;   /* strings copied */
    px_tls_opts tls;      /* strings copied; enabled false: plain */
    px_redis *owner;      /* (ref) handed to every command's callback */
    px_link_state_cb *state_cb;
    void *udata;
    link_state st;
    bool up; /* connected and through the handshake */
    int fd;  /* -1 while down or resolving */
    SSL_CTX *ctx;
    SSL *ssl;
    ev_io rio, wio;                     /* wio only while a write would block (EAGAIN) */
    ev_prepare flush;                   /* writes 'out' once per loop turn (queue_out) */
    bool tls_wants_read;                /* SSL_write waits for the socket to be readable */
    ev_timer deadline;                  /* the earliest pending command's deadline */
    ev_tstamp heard;                    /* loop time bytes last came in on this connection */
    ev_timer retry;                     /* reconnect backoff */
    ev_timer addr_wait;                 /* the connect to one address of several (try_next_addr) */
    ev_async resolved;                  /* the resolver thread is done */
    rjob *job;                          /* the lookup in flight */
    struct addrinfo *addrs, *next_addr; /* the lookup's answer, the next to try */
    char last_err[200];                 /* why the last address failed */
    long long backoff_ms;
    bool bad_reply;       /* lost to a protocol error: the backoff keeps growing until a
                             command after the handshake is answered */
    px_rcmd *head, *tail; /* pending commands, oldest first */
    px_buf out;           /* RESP not yet written */
    size_t out_off;       /* bytes of 'out' written */
    bool out_secret;      /* 'out' holds an AUTH: wiped once written or dropped */
    redisReader *reader;
    px_reply_arena *arena;
    unsigned gen;             /* bumped at every drop */
    int busy;                 /* callbacks running: a destroy waits for them */
    bool dead;                /* destroyed while busy */
    px_link_want_cb *want_cb; /* the owner sets the target (px_link_connect_to) */
    bool waiting;             /* down, waiting for px_link_connect_to */
    px_redis_cb *msg_cb;      /* pub/sub messages (px_link_on_message) */
    void *msg_priv;
};

static void connect_start(px_link *l);
static void drop(px_link *l, const char *why, px_log_level level);
static int link_cmd(px_link *l, px_redis_cb *cb, void *priv, const char *fmt, ...);
static void link_free(px_link *l);

/* --- small helpers ------------------------------------------------------ */

static void fifo_push(px_link *l, px_rcmd *c)
{
    /* Deadlines grow along the FIFO but behind a blocking read (above).
     * Debug builds only: they are loop times (ev_now), which follow the wall
     * clock, and a step of it back is no reason to stop. */
    PX_ASSERT(l->tail == NULL || l->tail->blocking || c->deadline >= l->tail->deadline);
    c->next = NULL;
    if (l->tail) l->tail->next = c;
    else l->head = c;
    l->tail = c;
}

/* Command records are reused: one per command on the hot path. A record
 * keeps its 'args' memory, so a script command allocates nothing once warm. */
static px_rcmd *rcmd_pool;

static void rcmd_free(px_rcmd *c)
{
    c->next = rcmd_pool;
    rcmd_pool = c;
}

static px_rcmd *rcmd_new(px_link *l, px_redis_cb *cb, void *priv, long long extra_ms)
{
    px_rcmd *c = rcmd_pool;
    if (c) {
        px_buf args = c->args;
        rcmd_pool = c->next;
        memset(c, 0, sizeof(*c));
        c->args = args;
    } else c = px_calloc(1, sizeof(*c));
    c->l = l;
    c->cb = cb;
    c->priv = priv;
    c->deadline = ev_now(l->loop) + (double)(l->opts.timeout_ms + extra_ms) / 1000.0;
    c->blocking = extra_ms > 0;
    return c;
}

/* RESP for one command, appended to 'out'. hiredis 0.14 formats argv through
 * a generic sds printf that cost a quarter of the daemon's instructions under
 * load (callgrind); the protocol itself is this simple. */
static char *resp_len(char *p, char kind, size_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    *p++ = kind;
    while (n) *p++ = tmp[--n];
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static void resp_append(px_buf *out, int argc, const char **argv, const size_t *lens)
{
    size_t total = 24;
    for (int i = 0; i < argc; i++) total += lens[i] + 26;
    px_buf_reserve(out, total);
    char *p = resp_len(out->data + out->len, '*', (size_t)argc);
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

/* When the oldest command times out: at its deadline, or timeout_ms after
 * the last bytes came in if that is later (a reply still arriving). Only
 * ever later: neither the deadline nor 'heard' moves back. */
static ev_tstamp due(const px_link *l)
{
    ev_tstamp quiet = l->heard + (double)l->opts.timeout_ms / 1000.0;
    return l->head->deadline > quiet ? l->head->deadline : quiet;
}

/* Arm the timer for the oldest command; re-armed lazily, when it fires (bytes
 * coming in do not touch the timer: deadline_cb looks at 'heard'). */
static void deadline_rearm(px_link *l)
{
    if (l->head == NULL) {
        ev_timer_stop(l->loop, &l->deadline);
        return;
    }
    if (ev_is_active(&l->deadline)) return;
    ev_tstamp after = due(l) - ev_now(l->loop);
    ev_timer_set(&l->deadline, after > 0 ? after : 0.001, 0.);
    ev_timer_start(l->loop, &l->deadline);
}

static void set_up(px_link *l, bool up)
{
    if (l->up == up) return;
    l->up = up;
    if (l->state_cb && !l->dead) l->state_cb(l, up, l->udata);
}

/* After callbacks: false when the link was destroyed meanwhile (now freed). */
static bool leave(px_link *l)
{
    if (--l->busy == 0 && l->dead) {
        link_free(l);
        return false;
    }
    return !l->dead;
}

/* Queue RESP and have it written at the end of this loop turn, by the link's
 * ev_prepare (flush_prepare_cb): many commands of one turn go in one write.
 * The write is tried at once there and the write watcher started only when
 * the socket is full (EAGAIN): starting and stopping it per write cost two
 * epoll_ctl calls and an epoll_wait per command at low rates (issue 18). */
static void queue_out(px_link *l)
{
    (void)l;
}

/* --- the resolver thread ------------------------------------------------- */

/* getaddrinfo blocks; it runs in a thread of its own per lookup, which hands
 * the answer over through the link's ev_async. A link that gives up on a
 * lookup (its deadline, a destroy) leaves the job to the thread to free. */
struct rjob {
    px_link *l; /* NULL once abandoned (under rj_lock) */
    struct addrinfo *res;
    int err;
    bool done;
    int refs; /* the thread's and the link's (under rj_lock) */
    char host[256];
    char port[8];
};

static pthread_mutex_t rj_lock = PTHREAD_MUTEX_INITIALIZER;

static void rjob_unref(rjob *j)
{
    pthread_mutex_lock(&rj_lock);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&rj_lock);
    if (!last) return;
    if (j->res) freeaddrinfo(j->res);
    free(j);
}

static void *rjob_run(void *p)
{
    rjob *j = p;
    struct addrinfo hints = { 0 }, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int err = getaddrinfo(j->host, j->port, &hints, &res);
    pthread_mutex_lock(&rj_lock);
    j->res = res;
    j->err = err;
    j->done = true;
    if (j->l) ev_async_send(j->l->loop, &j->l->resolved);
    pthread_mutex_unlock(&rj_lock);
    rjob_unref(j);
    return NULL;
}

static void rjob_abandon(px_link *l)
{
    if (l->job == NULL) return;
    pthread_mutex_lock(&rj_lock);
    l->job->l = NULL;
    pthread_mutex_unlock(&rj_lock);
    rjob_unref(l->job);
    l->job = NULL;
}

static void try_next_addr(px_link *l);

static void resolved_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    px_link *l = w->data;
    rjob *j = l->job;
    if (j == NULL || l->st != ST_RESOLVING) return;
    pthread_mutex_lock(&rj_lock);
    bool done = j->done;
    struct addrinfo *res = j->res;
    int err = j->err;
    if (done) j->res = NULL;
    pthread_mutex_unlock(&rj_lock);
    if (!done) return;
    rjob_abandon(l);
    if (err != 0 || res == NULL) {
        char why[400];
        snprintf(why, sizeof(why), "connect failed: cannot resolve %s: %s", l->opts.host,
                 err ? gai_strerror(err) : "no address");
        if (res) freeaddrinfo(res);
        drop(l, why, PX_LOG_WARN);
        return;
    }
    l->addrs = l->next_addr = res;
    try_next_addr(l);
}

static void resolve_start(px_link *l)
{
    char port[8];
    snprintf(port, sizeof(port), "%d", l->opts.port);
    /* A numeric address needs no lookup (and no thread). */
    struct addrinfo hints = { 0 }, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST;
    if (getaddrinfo(l->opts.host, port, &hints, &res) == 0 && res) {
        l->addrs = l->next_addr = res;
        try_next_addr(l);
        return;
    }
    rjob *j = px_calloc(1, sizeof(*j));
    j->l = l;
    j->refs = 2;
    snprintf(j->host, sizeof(j->host), "%s", l->opts.host);
    snprintf(j->port, sizeof(j->port), "%s", port);
    l->job = j;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 512 * 1024); /* NSS modules can be deep */
    pthread_t t;
    int err = pthread_create(&t, &attr, rjob_run, j);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        j->refs = 1; /* no thread */
        rjob_abandon(l);
        char why[200];
        snprintf(why, sizeof(why), "connect failed: no resolver thread: %s", strerror(err));
        drop(l, why, PX_LOG_WARN);
    }
}

/* --- connect ------------------------------------------------------------- */

static void addr_text(const struct sockaddr *sa, char *out, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        port = ntohs(in->sin_port);
        snprintf(out, len, "%s:%d", ip, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in->sin6_addr, ip, sizeof(ip));
        port = ntohs(in->sin6_port);
        snprintf(out, len, "[%s]:%d", ip, port);
    } else {
        snprintf(out, len, "?");
    }
}

static void tcp_options(int fd)
{
    int on = 1, idle = 15, intvl = 5, cnt = 3; /* as hiredis' redisEnableKeepAlive */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

static void watch_fd(px_link *l)
{
    ev_io_set(&l->rio, l->fd, EV_READ);
    ev_io_set(&l->wio, l->fd, EV_WRITE);
}

static void tls_start(px_link *l);
static void opened(px_link *l);

/* The address being tried: the one before next_addr. */
static void tried_addr_text(px_link *l, char *at, size_t len)
{
    struct addrinfo *a = l->addrs, *prev = NULL;
    for (; a && a != l->next_addr; a = a->ai_next) prev = a;
    if (prev) addr_text(prev->ai_addr, at, len);
}

/* A connect that is never answered (a dead host, a firewall that drops) would
 * hold the handshake's whole deadline and hide the addresses after it: each
 * address but the last gets its share of the time left (at least
 * PX_ADDR_MIN_MS), then its socket is closed and the next one tried, as after
 * a refused connect. The last one has what is left: the deadline (deadline_cb). */
static void addr_wait_start(px_link *l)
{
    size_t left = 0;
    for (struct addrinfo *a = l->next_addr; a; a = a->ai_next) left++;
    if (left == 0 || l->head == NULL) return;
    double rest = l->head->deadline - ev_now(l->loop);
    double share = rest / (double)(left + 1);
    if (share < PX_ADDR_MIN_MS / 1000.0) share = PX_ADDR_MIN_MS / 1000.0;
    ev_timer_set(&l->addr_wait, share, 0.);
    ev_timer_start(l->loop, &l->addr_wait);
}

static void try_next_addr(px_link *l);

static void addr_wait_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_link *l = w->data;
    if (l->st != ST_CONNECTING || l->fd < 0) return;
    char at[120] = "?";
    tried_addr_text(l, at, sizeof(at));
    snprintf(l->last_err, sizeof(l->last_err), "%s: connect timed out", at);
    ev_io_stop(l->loop, &l->wio);
    close(l->fd);
    l->fd = -1;
    try_next_addr(l);
}

/* Start a connect to the next address of the lookup; when none is left, the
 * link is lost with the last address's error. */
static void try_next_addr(px_link *l)
{
    while (l->next_addr) {
        struct addrinfo *a = l->next_addr;
        l->next_addr = a->ai_next;
        char at[80];
        addr_text(a->ai_addr, at, sizeof(at));
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(l->last_err, sizeof(l->last_err), "%s: %s", at, strerror(errno));
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            snprintf(l->last_err, sizeof(l->last_err), "%s: %s", at, strerror(errno));
            close(fd);
            continue;
        }
        l->fd = fd;
        l->st = ST_CONNECTING;
        watch_fd(l);
        ev_io_start(l->loop, &l->wio);
        addr_wait_start(l);
        return;
    }
    char why[400];
    snprintf(why, sizeof(why), "connect failed: %s", l->last_err[0] ? l->last_err : "no address");
    drop(l, why, PX_LOG_WARN);
}

static void connect_done(px_link *l)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == EINPROGRESS) return;
    ev_io_stop(l->loop, &l->wio);
    ev_timer_stop(l->loop, &l->addr_wait);
    if (err) {
        char at[120] = "?";
        if (l->opts.unix_path) snprintf(at, sizeof(at), "%s", l->opts.unix_path);
        else tried_addr_text(l, at, sizeof(at));
        snprintf(l->last_err, sizeof(l->last_err), "%s: %s", at, strerror(err));
        close(l->fd);
        l->fd = -1;
        if (l->opts.unix_path) {
            char why[300];
            snprintf(why, sizeof(why), "connect failed: %s", l->last_err);
            drop(l, why, PX_LOG_WARN);
        } else {
            try_next_addr(l);
        }
        return;
    }
    if (!l->opts.unix_path) tcp_options(l->fd);
    if (l->tls.enabled) tls_start(l);
    else opened(l);
}

static void connect_unix(px_link *l)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(l->opts.unix_path) >= sizeof(sa.sun_path)) {
        drop(l, "connect failed: unix socket path too long", PX_LOG_WARN);
        return;
    }
    strcpy(sa.sun_path, l->opts.unix_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS &&
                   errno != EAGAIN)) {
        char why[300];
        snprintf(why, sizeof(why), "connect failed: %s: %s", l->opts.unix_path, strerror(errno));
        if (fd >= 0) close(fd);
        drop(l, why, PX_LOG_WARN);
        return;
    }
    l->fd = fd;
    l->st = ST_CONNECTING;
    watch_fd(l);
    ev_io_start(l->loop, &l->wio);
}

/* --- TLS ----------------------------------------------------------------- */

/* The reason of a TLS failure, for the line that drops the link. */
static void tls_reason(px_link *l, int ret, char *out, size_t len)
{
    long vr = l->ssl ? SSL_get_verify_result(l->ssl) : X509_V_OK;
    unsigned long e = ERR_peek_last_error();
    if (vr != X509_V_OK && ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        snprintf(out, len, "certificate verify failed: %s", X509_verify_cert_error_string(vr));
    } else if (e) {
        char buf[256];
        ERR_error_string_n(e, buf, sizeof(buf));
        const char *reason = ERR_reason_error_string(e);
        snprintf(out, len, "%s", reason ? reason : buf);
    } else if (ret == 0 || errno == 0) {
        snprintf(out, len, "the server closed the connection during the TLS handshake "
                           "(a plain-text server, or one that refused this client?)");
    } else {
        snprintf(out, len, "%s", strerror(errno));
    }
    ERR_clear_error();
}

static void tls_drop(px_link *l, int ret, const char *during)
{
    char reason[300], why[400];
    tls_reason(l, ret, reason, sizeof(reason));
    snprintf(why, sizeof(why), "TLS%s: %s", during, reason);
    drop(l, why, PX_LOG_WARN);
}

/* A client context from the files of 'tls', or NULL with the reason. */
static SSL_CTX *tls_ctx_new(const px_tls_opts *tls, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        snprintf(err, errlen, "no TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    const char *what = NULL;
    ERR_clear_error();
    if (tls->ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL) != 1) what = tls->ca_file;
    } else {
        SSL_CTX_set_default_verify_paths(ctx);
    }
    if (!what && tls->cert_file &&
        SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file) != 1) what = tls->cert_file;
    if (!what && tls->key_file &&
        SSL_CTX_use_PrivateKey_file(ctx, tls->key_file, SSL_FILETYPE_PEM) != 1) what = tls->key_file;
    if (what) {
        unsigned long e = ERR_peek_last_error();
        const char *reason = ERR_reason_error_string(e);
        if (ERR_GET_LIB(e) == ERR_LIB_SYS) reason = strerror(ERR_GET_REASON(e));
        if (what == tls->key_file && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH)
            snprintf(err, errlen, "%s is not the private key of %s", tls->key_file, tls->cert_file);
        else
            snprintf(err, errlen, "cannot load %s: %s", what, reason ? reason : "unreadable");
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (tls->cert_file && tls->key_file && SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "%s is not the private key of %s", tls->key_file, tls->cert_file);
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_verify(ctx, tls->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    return ctx;
}

bool px_link_tls_check(const px_tls_opts *tls, char *err, size_t errlen)
{
    if (tls == NULL || !tls->enabled) return true;
    SSL_CTX *ctx = tls_ctx_new(tls, err, errlen);
    if (ctx == NULL) return false;
    SSL_CTX_free(ctx);
    return true;
}

static bool tls_ctx(px_link *l, char *err, size_t errlen)
{
    SSL_CTX *ctx = tls_ctx_new(&l->tls, err, errlen);
    if (ctx == NULL) return false;
    if (l->ctx) SSL_CTX_free(l->ctx);
    l->ctx = ctx;
    return true;
}

static void tls_handshake(px_link *l)
{
    ERR_clear_error();
    errno = 0;
    int ret = SSL_connect(l->ssl);
    if (ret == 1) {
        ev_io_stop(l->loop, &l->rio);
        ev_io_stop(l->loop, &l->wio);
        opened(l);
        return;
    }
    switch (SSL_get_error(l->ssl, ret)) {
    case SSL_ERROR_WANT_READ:
        ev_io_stop(l->loop, &l->wio);
        ev_io_start(l->loop, &l->rio);
        return;
    case SSL_ERROR_WANT_WRITE:
        ev_io_stop(l->loop, &l->rio);
        ev_io_start(l->loop, &l->wio);
        return;
    default:
        tls_drop(l, ret, " handshake");
    }
}

static void tls_start(px_link *l)
{
    char err[400];
    if (!tls_ctx(l, err, sizeof(err))) {
        char why[450];
        snprintf(why, sizeof(why), "TLS: %s", err);
        drop(l, why, PX_LOG_WARN);
        return;
    }
    l->ssl = SSL_new(l->ctx);
    SSL_set_fd(l->ssl, l->fd);
    SSL_set_mode(l->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    const char *name = l->tls.server_name ? l->tls.server_name : l->opts.host;
    unsigned char ip[16];
    bool numeric = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    if (!numeric) SSL_set_tlsext_host_name(l->ssl, name);
    if (l->tls.verify) {
        X509_VERIFY_PARAM *param = SSL_get0_param(l->ssl);
        if (numeric) X509_VERIFY_PARAM_set1_ip_asc(param, name);
        else {
            X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            X509_VERIFY_PARAM_set1_host(param, name, 0);
        }
    }
    l->st = ST_TLS;
    tls_handshake(l);
}

/* --- I/O ----------------------------------------------------------------- */

/* After a reply that needed a large read buffer (kept at its largest:
 * maxbuf is 0, see connect_start), give it back once nothing is left in it,
 * and the heap's free pages with it. Between two replies the reader holds
 * only its buffer, its position and its length. */
static void readbuf_shrink(redisReader *rd)
{
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

static void read_in(px_link *l);

/* 'out' is written (or dropped): empty it, and overwrite it if it held the
 * password, so no buffer keeps a copy (SECURITY.md). */
static void out_reset(px_link *l)
{
    if (l->out_secret && l->out.data) explicit_bzero(l->out.data, l->out.cap);
    l->out_secret = false;
    px_buf_reset(&l->out);
    l->out_off = 0;
    if (l->out.cap > PX_BUF_KEEP) px_buf_deinit(&l->out);
}

static void flush_out(px_link *l)
{
    l->tls_wants_read = false;
    while (l->out_off < l->out.len) {
        const char *p = l->out.data + l->out_off;
        size_t n = l->out.len - l->out_off;
        ssize_t w;
        if (l->ssl) {
            ERR_clear_error();
            errno = 0;
            int ret = SSL_write(l->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n);
            if (ret <= 0) {
                int e = SSL_get_error(l->ssl, ret);
                if (e == SSL_ERROR_WANT_WRITE) {
                    ev_io_start(l->loop, &l->wio);
                    return;
                }
                if (e == SSL_ERROR_WANT_READ) {
                    ev_io_stop(l->loop, &l->wio);
                    l->tls_wants_read = true; /* rio_cb writes again */
                    return;
                }
                if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
                    /* The server may have said why before it closed (TLS 1.3: a client
                     * certificate it wanted, after the handshake): read its alert. */
                    int err = errno;
                    unsigned gen = l->gen;
                    l->busy++;
                    read_in(l);
                    if (!leave(l) || l->gen != gen || l->st != ST_OPEN) return;
                    char why[200];
                    snprintf(why, sizeof(why), "write failed: %s", err ? strerror(err) : "closed");
                    drop(l, why, PX_LOG_WARN);
                    return;
                }
                tls_drop(l, ret, "");
                return;
            }
            w = ret;
        } else {
            w = write(l->fd, p, n);
            if (w < 0) {
                if (errno == EAGAIN || errno == EINTR) {
                    ev_io_start(l->loop, &l->wio);
                    return;
                }
                char why[200];
                snprintf(why, sizeof(why), "write failed: %s", strerror(errno));
                drop(l, why, PX_LOG_WARN);
                return;
            }
        }
        l->out_off += (size_t)w;
    }
    ev_io_stop(l->loop, &l->wio);
    out_reset(l);
}

static void complete(px_link *l, px_rcmd *c, redisReply *rep);

/* The server sent what no Redis reply can be, or more than the daemon ever
 * needs (reply.h: a header alone must not take gigabytes): counted, one line
 * at most every PX_REFUSED_LOG_S, and the link dropped and dialled again
 * with backoff, which a good handshake does not reset (the server would send
 * the same again): a real command's answer does. */
static void protocol_error(px_link *l, const char *what)
{
    static px_log_limit limit;
    char why[200];
    snprintf(why, sizeof(why), "protocol error: %s", what);
    px_redis_errors++;
    l->bad_reply = true;
    px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_WARN,
                   "redis %s: link lost: %s; reconnecting in %lld ms", l->opts.name, why,
                   l->backoff_ms);
    drop(l, why, PX_LOG_DEBUG);
}

/* Hand every complete reply in the reader to its command. */
static void dispatch_replies(px_link *l)
{
    unsigned gen = l->gen;
    l->busy++;
    while (l->st == ST_OPEN && l->gen == gen && !l->dead) {
        void *reply = NULL;
        if (redisReaderGetReply(l->reader, &reply) != REDIS_OK) {
            protocol_error(l, px_reply_error(l->reader));
            break;
        }
        if (reply == NULL) {
            char why[160];
            if (!px_reply_pending_ok(l->reader, PX_REPLY_MAX_BULK, why, sizeof(why)))
                protocol_error(l, why);
            else readbuf_shrink(l->reader);
            break;
        }
        if (l->msg_cb && px_rp_pubsub_message(reply)) { /* replies.c: not for a command */
            redisReplyObjectFunctions *mfn = l->reader->fn;
            l->msg_cb(l->owner, reply, l->msg_priv);
            mfn->freeObject(reply);
            continue;
        }
        px_rcmd *c = l->head;
        if (c == NULL) {
            l->reader->fn->freeObject(reply);
            drop(l, "a reply without a command", PX_LOG_WARN);
            break;
        }
        l->head = c->next;
        if (l->head == NULL) {
            l->tail = NULL;
            ev_timer_stop(l->loop, &l->deadline);
        }
        redisReplyObjectFunctions *fn = l->reader->fn; /* the arena's (reply.c) */
        if (l->up) l->bad_reply = false;
        complete(l, c, reply);
        fn->freeObject(reply);
    }
    leave(l);
}

static void read_in(px_link *l)
{
    char buf[PX_READ_CHUNK];
    unsigned gen = l->gen;
    for (;;) {
        ssize_t n;
        if (l->ssl) {
            ERR_clear_error();
            errno = 0;
            int ret = SSL_read(l->ssl, buf, sizeof(buf));
            if (ret <= 0) {
                int e = SSL_get_error(l->ssl, ret);
                if (e == SSL_ERROR_WANT_READ) return;
                if (e == SSL_ERROR_WANT_WRITE) {
                    ev_io_start(l->loop, &l->wio);
                    return;
                }
                /* A server that is killed sends no close_notify (OpenSSL 3: "unexpected
                 * eof"); RESP is framed, a cut reply is never used: a plain close. */
                if (e == SSL_ERROR_ZERO_RETURN ||
                    (e == SSL_ERROR_SSL &&
                     ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
                    ERR_clear_error();
                    drop(l, "closed", PX_LOG_WARN);
                    return;
                }
                if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
                    /* the socket ended without a TLS alert: as on plain TCP */
                    char why[200];
                    snprintf(why, sizeof(why), "%s%s", errno ? "read failed: " : "closed",
                             errno ? strerror(errno) : "");
                    drop(l, why, PX_LOG_WARN);
                    return;
                }
                tls_drop(l, ret, "");
                return;
            }
            n = ret;
        } else {
            n = read(l->fd, buf, sizeof(buf));
            if (n == 0) {
                drop(l, "closed", PX_LOG_WARN);
                return;
            }
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR) return;
                char why[200];
                snprintf(why, sizeof(why), "read failed: %s", strerror(errno));
                drop(l, why, PX_LOG_WARN);
                return;
            }
        }
        l->heard = ev_now(l->loop);
        if (redisReaderFeed(l->reader, buf, (size_t)n) != REDIS_OK) {
            drop(l, "out of memory reading a reply", PX_LOG_WARN);
            return;
        }
        l->busy++;
        dispatch_replies(l);
        if (!leave(l) || l->gen != gen || l->st != ST_OPEN) return;
        /* Plain TCP: one read per readiness, as hiredis does; TLS: until
         * OpenSSL wants more (what it holds, the socket will not announce). */
        if (!l->ssl) return;
    }
}

static void rio_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    px_link *l = w->data;
    if (l->st == ST_TLS) {
        tls_handshake(l);
        return;
    }
    if (l->st != ST_OPEN) return;
    unsigned gen = l->gen;
    l->busy++;
    read_in(l);
    if (leave(l) && l->gen == gen && l->st == ST_OPEN && l->out_off < l->out.len && l->ssl)
        flush_out(l); /* an SSL_write that wanted to read first */
}

/* Among the last of the loop turn's prepare watchers (EV_MINPRI + 1: after
 * the proxy's flush_cb, which queues most commands; before its loop-busy
 * measure at EV_MINPRI): write what this turn queued, unless
 * the write watcher or TLS is already waiting to. Always active, so a command
 * queued by another prepare watcher in this same turn is still written
 * before the loop sleeps (a prepare started during the prepare phase would
 * only run on the next turn). */
static void flush_prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)loop;
    (void)revents;
    px_link *l = w->data;
    if (l->st != ST_OPEN || l->out_off >= l->out.len || ev_is_active(&l->wio) || l->tls_wants_read) return;
    l->busy++;
    flush_out(l);
    leave(l);
}

static void wio_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    px_link *l = w->data;
    switch (l->st) {
    case ST_CONNECTING: connect_done(l); return;
    case ST_TLS: tls_handshake(l); return;
    case ST_OPEN:
        flush_out(l);
        if (l->st == ST_OPEN && l->ssl && SSL_pending(l->ssl) > 0) rio_cb(l->loop, &l->rio, EV_READ);
        return;
    default:
        ev_io_stop(l->loop, &l->wio);
    }
}

/* Connected (and through TLS): the queued handshake goes out. */
static void opened(px_link *l)
{
    l->st = ST_OPEN;
    ev_io_start(l->loop, &l->rio);
    if (l->out.len > l->out_off) ev_io_start(l->loop, &l->wio);
}

/* Close the connection, whatever its state (no callbacks). */
static void close_conn(px_link *l)
{
    ev_io_stop(l->loop, &l->rio);
    ev_io_stop(l->loop, &l->wio);
    ev_timer_stop(l->loop, &l->addr_wait);
    l->tls_wants_read = false;
    rjob_abandon(l);
    if (l->addrs) freeaddrinfo(l->addrs);
    l->addrs = l->next_addr = NULL;
    if (l->ssl) {
        SSL_free(l->ssl); /* no close_notify: the peer may be gone */
        l->ssl = NULL;
    }
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
    l->heard = 0;
    out_reset(l);
}

/* Every pending command answered as lost. */
static void fail_pending(px_link *l)
{
    ev_timer_stop(l->loop, &l->deadline);
    while (l->head) {
        px_rcmd *c = l->head;
        l->head = c->next;
        if (l->head == NULL) l->tail = NULL;
        complete(l, c, NULL);
    }
}

/* The connection is gone (or being dropped): schedule a reconnect with
 * backoff, say why at 'level', then run every pending callback with NULL. */
static void drop(px_link *l, const char *why, px_log_level level)
{
    if (l->st == ST_DOWN) return;
    close_conn(l);
    l->st = ST_DOWN;
    l->gen++;
    if (!l->dead) {
        if (px_log_enabled(level))
            px_log(level, "redis %s: link lost: %s; reconnecting in %lld ms", l->opts.name, why,
                   l->backoff_ms);
        ev_timer_set(&l->retry, (double)l->backoff_ms / 1000.0, 0.);
        ev_timer_start(l->loop, &l->retry);
        l->backoff_ms *= 2;
        if (l->backoff_ms > PX_LINK_BACKOFF_MAX_MS) l->backoff_ms = PX_LINK_BACKOFF_MAX_MS;
    }
    l->busy++;
    set_up(l, false);
    fail_pending(l);
    leave(l);
}

/* --- refusals: AUTH and ACL --------------------------------------------- */

/* Commands refused with NOPERM and not answered since (by name, lowercase). */
static char refused[PX_REFUSED_MAX][16];
static int nrefused;

bool px_link_refused(void)
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
    if (free_at < 0) free_at = PX_REFUSED_MAX - 1; /* full: the last one gives way */
    else nrefused++;
    snprintf(refused[free_at], sizeof(refused[0]), "%s", verb);
}

/* "user \"app\"" or "the default user", for the lines below. */
static const char *user_text(const px_link *l, char *buf, size_t len)
{
    if (l->opts.user == NULL) return "the default user";
    snprintf(buf, len, "user \"%s\"", l->opts.user);
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

/* --- replies ------------------------------------------------------------- */

static int send_rcmd(px_link *l, px_rcmd *c, int argc, const char **argv, const size_t *lens)
{
    size_t vl = lens[0] < sizeof(c->verb) - 1 ? lens[0] : sizeof(c->verb) - 1;
    for (size_t i = 0; i < vl; i++) c->verb[i] = (char)(argv[0][i] | 0x20); /* ASCII lowercase */
    c->verb[vl] = '\0';
    resp_append(&l->out, argc, argv, lens);
    fifo_push(l, c);
    queue_out(l);
    if (!ev_is_active(&l->deadline)) deadline_rearm(l);
    return PX_OK;
}

static void version_reply_cb(px_redis *r, redisReply *reply, void *priv);
static void script_load_reply_cb(px_redis *r, redisReply *reply, void *priv);
static void auth_reply_cb(px_redis *r, redisReply *reply, void *priv);
static void handshake_reply_cb(px_redis *r, redisReply *reply, void *priv);
static void role_reply_cb(px_redis *r, redisReply *reply, void *priv);

/* The handshake's callbacks get their link through 'priv' (their commands are
 * sent with priv = the link, or a script). */
static void complete(px_link *l, px_rcmd *c, redisReply *rep)
{
    bool open = l->st == ST_OPEN;
    if (rep && rep->type == REDIS_REPLY_ERROR && strcmp(c->verb, "xinfo") == 0 &&
        acl_refusal(rep->str)) {
        /* XINFO feeds the group lag gauges and the idle-consumer cleanup only:
         * refused, those are off; the pipeline is not held up for them. */
        static px_log_limit limit;
        char ub[160];
        px_log_limited(&limit, 600.0, PX_LOG_WARN, "redis: %s lacks permission for XINFO (%s): "
                                                   "no group lag metrics, no idle-consumer cleanup",
                       user_text(l, ub, sizeof(ub)),
                       rep->str);
        if (c->cb) c->cb(l->owner, rep, c->priv);
        rcmd_free(c);
        return;
    }
    if (rep && rep->type == REDIS_REPLY_ERROR && strcmp(c->verb, "blpop") == 0) {
        /* The batch window's wait in Redis (reader.c): any refusal keeps the
         * window in the daemon on this link, which the reader says, once. */
        if (c->cb) c->cb(l->owner, rep, c->priv);
        rcmd_free(c);
        return;
    }
    if (rep && rep->type == REDIS_REPLY_ERROR && open && c->cb != version_reply_cb &&
        c->cb != script_load_reply_cb && acl_refusal(rep->str)) {
        /* A missing ACL permission: not ready until the command goes through.
         * HELLO (the version check) and SCRIPT LOAD (EVAL works without it)
         * may be refused. The link is dropped, quietly: this line says why. */
        static px_log_limit limit;
        char ub[160];
        px_redis_errors++;
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis: %s lacks permission: %s%s "
                                                               "(not ready; retrying with backoff)",
                       user_text(l, ub, sizeof(ub)),
                       rep->str, strncmp(rep->str, "NOPERM", 6) == 0 ? "" : " (in a script; ACL LOG names the command or key)");
        refused_set(c->verb[0] ? c->verb : "?", true);
        drop(l, "a command was refused", PX_LOG_DEBUG);
        if (c->cb) c->cb(l->owner, NULL, c->priv);
        rcmd_free(c);
        return;
    }
    if (rep && rep->type == REDIS_REPLY_ERROR && open && l->opts.check_role &&
        strncmp(rep->str, "READONLY", 8) == 0) {
        /* A master the sentinels named has become a replica (a failover):
         * nothing is written to it; the sentinels are asked again, and the
         * command runs as after a lost link (docs/guarantee.md). */
        static px_log_limit limit;
        px_redis_errors++;
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_WARN, "redis %s: %s:%d answered READONLY: "
                                                              "it is no longer the master; asking the sentinels again",
                       l->opts.name, l->opts.host, l->opts.port);
        drop(l, "not the master (READONLY)", PX_LOG_DEBUG);
        if (c->cb) c->cb(l->owner, NULL, c->priv);
        rcmd_free(c);
        return;
    }
    if (nrefused && rep && rep->type != REDIS_REPLY_ERROR && c->verb[0])
        refused_set(c->verb, false);

    if (rep && rep->type == REDIS_REPLY_ERROR && c->script &&
        strncmp(rep->str, "NOSCRIPT", 8) == 0 && open) {
        /* The script cache is volatile (restart, failover, SCRIPT FLUSH): send the body. */
        c->argv[0] = "EVAL";
        c->argv[1] = c->script->body;
        c->lens[0] = 4;
        c->lens[1] = strlen(c->script->body);
        c->script = NULL;
        c->deadline = ev_now(l->loop) + (double)l->opts.timeout_ms / 1000.0;
        send_rcmd(l, c, c->argc, c->argv, c->lens);
        return;
    }
    if ((rep == NULL || rep->type == REDIS_REPLY_ERROR) && !l->opts.cluster_node &&
        !l->opts.sentinel_peer && c->cb != auth_reply_cb &&
        !(rep && (strncmp(rep->str, "NOAUTH", 6) == 0 || px_decide_error_expected(rep->str)))) {
        /* (a NOAUTH is the handshake's to say, once: handshake_reply_cb) */
        px_redis_errors++;
        static px_log_limit limit;
        if (rep) px_log_limited(&limit, 1.0, PX_LOG_WARN, "redis %s: %s", l->opts.name, rep->str);
    }
    if (c->cb) c->cb(l->owner, rep, c->priv);
    rcmd_free(c);
}

static void deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    px_link *l = w->data;
    if (l->head == NULL || l->st == ST_DOWN) return;
    if (due(l) > ev_now(loop)) {
        deadline_rearm(l);
        return;
    } /* not yet (a later command, or bytes came in): re-arm */
    switch (l->st) {
    case ST_RESOLVING: {
        char why[400];
        snprintf(why, sizeof(why), "connect failed: resolving %s took longer than timeout_ms",
                 l->opts.host);
        drop(l, why, PX_LOG_WARN);
        return;
    }
    case ST_CONNECTING: {
        char why[300];
        snprintf(why, sizeof(why), "connect failed: timed out%s%s", l->last_err[0] ? " (before: " : "",
                 l->last_err[0] ? l->last_err : "");
        if (l->last_err[0]) strncat(why, ")", sizeof(why) - strlen(why) - 1);
        drop(l, why, PX_LOG_WARN);
        return;
    }
    case ST_TLS:
        drop(l, "TLS handshake timed out (does the server speak TLS on this port?)", PX_LOG_WARN);
        return;
    default:
        drop(l, "command timed out", PX_LOG_WARN);
    }
}

static void script_load_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_script *s = priv;
    if (reply && reply->type == REDIS_REPLY_STRING && reply->len == 40)
        memcpy(s->sha, reply->str, 41);
}

/* The server's version, at every connect: an old one is refused (not ready,
 * reconnecting with backoff) with one line that says why: one for the
 * process, not one per link and reconnect (again if the version changes, or
 * after a good server). */
static char refused_ver[80];

static void version_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_link *l = priv;
    if (reply == NULL || l->st != ST_OPEN) return;
    char ver[80];
    switch (px_redis_server_check(reply, ver, sizeof(ver))) {
    case PX_SERVER_OK:
        refused_ver[0] = '\0';
        return;
    case PX_SERVER_UNKNOWN:
        px_log_debug("redis %s: server version unknown (%s); going on", l->opts.name,
                     reply->type == REDIS_REPLY_ERROR ? reply->str : ver);
        return;
    case PX_SERVER_OLD:
        break;
    }
    if (strcmp(refused_ver, ver) != 0)
        px_log_error("redis %s: the server is %s: idemproxy needs Redis 7.0 or newer, or Valkey "
                     "(SET NX GET); not ready, connecting again with backoff",
                     l->opts.name, ver);
    snprintf(refused_ver, sizeof(refused_ver), "%s", ver);
    drop(l, "server too old", PX_LOG_WARN);
}

/* AUTH refused (WRONGPASS, a disabled user...): one line for the process at
 * most every PX_REFUSED_LOG_S, not one per link and reconnect; not ready,
 * connecting again with backoff (the password file is read again then). */
static void auth_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_link *l = priv;
    if (reply == NULL || l->st != ST_OPEN || reply->type != REDIS_REPLY_ERROR) return;
    static px_log_limit limit, sentinel_limit;
    char ub[160];
    px_redis_errors++;
    if (l->opts.sentinel_peer) /* its own credentials: redis.sentinel.* */
        px_log_limited(&sentinel_limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis %s: AUTH refused "
                                                                        "by sentinel %s:%d for %s: %s (redis.sentinel.username, password_file; not "
                                                                        "ready; retrying with backoff)",
                       l->opts.name, l->opts.host, l->opts.port,
                       user_text(l, ub, sizeof(ub)), reply->str);
    else
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis: AUTH refused for %s: %s "
                                                               "(not ready; retrying with backoff)",
                       user_text(l, ub, sizeof(ub)), reply->str);
    drop(l, "AUTH refused", PX_LOG_DEBUG);
}

static void handshake_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_link *l = priv;
    if (reply == NULL || l->st != ST_OPEN) return;
    if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOAUTH", 6) == 0) {
        /* No password configured, and the server wants one: as a refused AUTH. */
        static px_log_limit limit;
        px_redis_errors++;
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis%s%s: the server wants a "
                                                               "password and none is configured (redis.%spassword_file): %s (not ready; "
                                                               "retrying with backoff)",
                       l->opts.sentinel_peer ? " " : "",
                       l->opts.sentinel_peer ? l->opts.name : "",
                       l->opts.sentinel_peer ? "sentinel." : "", reply->str);
        drop(l, "no password", PX_LOG_DEBUG);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        /* A wrong db: keep retrying, as with any other outage. */
        drop(l, "handshake refused", PX_LOG_WARN);
        return;
    }
    if (reply->type != REDIS_REPLY_STATUS || strcmp(reply->str, "PONG") != 0) return;
    /* While a command is refused the backoff keeps growing: each connect
     * would be refused again, and must not spin. */
    bool quiet = l->opts.cluster_node || l->opts.sentinel_peer || nrefused;
    if (!nrefused && !l->bad_reply) l->backoff_ms = PX_LINK_BACKOFF_MIN_MS;
    if (quiet) px_log_debug("redis %s: connected", l->opts.name);
    else px_log_info("redis %s: connected", l->opts.name);
    set_up(l, true);
}

/* ROLE of a master the sentinels named: anything but "master" (a replica
 * not yet promoted, or an address gone stale) is refused before a command is
 * written to it; the sentinels are asked again after the backoff. */
static void role_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_link *l = priv;
    char role[32];
    if (reply == NULL || l->st != ST_OPEN || reply->type == REDIS_REPLY_ERROR) return;
    if (px_sentinel_role_master(reply, role, sizeof(role))) return;
    static px_log_limit limit;
    px_redis_errors++;
    px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_ERROR, "redis %s: %s:%d is not the master "
                                                           "(ROLE says %s): nothing is written to it; asking the sentinels again "
                                                           "(not ready)",
                   l->opts.name, l->opts.host, l->opts.port, role);
    drop(l, "not the master (ROLE)", PX_LOG_DEBUG);
}

static void retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_link *l = w->data;
    if (l->want_cb) {
        l->waiting = true;
        l->want_cb(l, l->udata);
        return;
    }
    connect_start(l);
}

/* The password file again, at every connect: a rotated Secret is used from
 * the next connect on, without a restart. A file that cannot be read (a
 * Secret being swapped), or is empty while a user is set, keeps the last
 * password. */
static void reread_password(px_link *l)
{
    static px_log_limit limit;
    char *pw;
    if (px_redis_read_password(l->opts.password_file, &pw) != 0) {
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_WARN, "redis: cannot read "
                                                              "redis.password_file %s: %s; using the password read before",
                       l->opts.password_file, strerror(errno));
        return;
    }
    if (pw == NULL && l->opts.user) {
        px_log_limited(&limit, PX_REFUSED_LOG_S, PX_LOG_WARN, "redis: redis.password_file %s "
                                                              "is empty, and user \"%s\" needs a password; using the password read "
                                                              "before",
                       l->opts.password_file, l->opts.user);
        return;
    }
    px_free_secret((char *)l->opts.password);
    l->opts.password = pw;
}

static void connect_start(px_link *l)
{
    if (l->reader) redisReaderFree(l->reader);
    l->reader = redisReaderCreate();
    /* hiredis frees its read buffer whenever it empties and is over 16 KiB
     * (maxbuf): every batch of replies larger than that (a read of 256
     * entries is ~40 KiB) would grow it again from nothing. Keep it; it is
     * as large as the largest batch of replies, one per link. */
    l->reader->maxbuf = 0;
    px_reply_attach(l->reader, l->arena);
    /* At least 64 KiB: no reply the daemon reads besides stream entries has
     * arrays of strings that large, and a small max_entry_bytes must not
     * elide a node id or a consumer name. */
    size_t limit = l->opts.max_array_bytes;
    px_reply_arena_limit(l->arena, limit && limit < 65536 ? 65536 : limit);
    px_reply_arena_max_elements(l->arena, l->opts.max_elements);
    l->last_err[0] = '\0';
    l->st = ST_RESOLVING;

    /* Commands queue up before the connection completes; PING's reply says we are in. */
    if (l->opts.password_file) reread_password(l);
    if (l->opts.password) {
        /* Room for the whole handshake first, so no realloc leaves a copy of
         * the AUTH in freed memory; out_reset wipes it once written. */
        size_t room = 1024 + strlen(l->opts.password) + (l->opts.user ? strlen(l->opts.user) : 0);
        for (px_script **at = px_scripts(); *at; at++) room += strlen((*at)->body) + 64;
        px_buf_reserve(&l->out, room);
        l->out_secret = true;
        /* Straight into 'out' (not link_cmd: hiredis' formatter frees
         * intermediate copies unwiped). */
        const char *argv[3] = { "AUTH", l->opts.user, l->opts.password };
        size_t lens[3] = { 4, l->opts.user ? strlen(l->opts.user) : 0, strlen(l->opts.password) };
        int argc = 3;
        if (l->opts.user == NULL) {
            argv[1] = argv[2];
            lens[1] = lens[2];
            argc = 2;
        }
        send_rcmd(l, rcmd_new(l, auth_reply_cb, l, 0), argc, argv, lens);
    }
    if (!l->opts.sentinel_peer) { /* a sentinel is not a data node */
        if (l->opts.db) link_cmd(l, handshake_reply_cb, l, "SELECT %d", l->opts.db);
        if (l->opts.check_role) link_cmd(l, role_reply_cb, l, "ROLE");
        link_cmd(l, version_reply_cb, l, "HELLO 2");
        for (px_script *sc, **at = px_scripts(); (sc = *at) != NULL; at++)
            link_cmd(l, script_load_reply_cb, sc, "SCRIPT LOAD %s", sc->body);
    }
    link_cmd(l, handshake_reply_cb, l, "PING");

    if (l->opts.unix_path) connect_unix(l);
    else resolve_start(l);
}

/* --- public ------------------------------------------------------------- */

static char *dup_or_null(const char *s)
{
    return s ? px_strdup(s) : NULL;
}

static px_link *link_new(struct ev_loop *loop, const px_redis_opts *opts, px_redis *owner,
                         px_link_state_cb *state_cb, void *udata)
{
    px_link *l = px_calloc(1, sizeof(*l));
    l->loop = loop;
    l->opts = *opts;
    l->opts.name = px_strdup(opts->name);
    l->opts.host = dup_or_null(opts->host);
    l->opts.unix_path = dup_or_null(opts->unix_path);
    l->opts.user = dup_or_null(opts->user);
    l->opts.password = dup_or_null(opts->password);
    l->opts.password_file = dup_or_null(opts->password_file);
    l->opts.seeds = NULL;
    l->opts.nseeds = 0;
    l->opts.tls = NULL;
    if (opts->tls && opts->tls->enabled) {
        l->tls = *opts->tls;
        l->tls.ca_file = dup_or_null(opts->tls->ca_file);
        l->tls.cert_file = dup_or_null(opts->tls->cert_file);
        l->tls.key_file = dup_or_null(opts->tls->key_file);
        l->tls.server_name = dup_or_null(opts->tls->server_name);
        static bool warned;
        if (!l->tls.verify && !warned) {
            warned = true;
            px_log_warn("redis: TLS without peer verification (redis.tls.verify: false): the "
                        "connection is encrypted, but anyone on the path can pose as the server");
        }
    }
    if (l->opts.host == NULL && l->opts.unix_path == NULL) l->opts.host = px_strdup("127.0.0.1");
    l->owner = owner;
    l->state_cb = state_cb;
    l->udata = udata;
    l->fd = -1;
    l->backoff_ms = PX_LINK_BACKOFF_MIN_MS;
    l->arena = px_reply_arena_new();
    ev_io_init(&l->rio, rio_cb, -1, EV_READ);
    l->rio.data = l;
    ev_io_init(&l->wio, wio_cb, -1, EV_WRITE);
    l->wio.data = l;
    ev_prepare_init(&l->flush, flush_prepare_cb);
    l->flush.data = l;
    ev_set_priority(&l->flush, EV_MINPRI + 1);
    ev_prepare_start(loop, &l->flush);
    ev_timer_init(&l->deadline, deadline_cb, 0., 0.);
    l->deadline.data = l;
    ev_timer_init(&l->retry, retry_cb, 0., 0.);
    l->retry.data = l;
    ev_timer_init(&l->addr_wait, addr_wait_cb, 0., 0.);
    l->addr_wait.data = l;
    ev_async_init(&l->resolved, resolved_cb);
    l->resolved.data = l;
    ev_async_start(loop, &l->resolved);
    return l;
}

px_link *px_link_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *owner,
                        px_link_state_cb *state_cb, void *udata)
{
    px_link *l = link_new(loop, opts, owner, state_cb, udata);
    connect_start(l);
    return l;
}

px_link *px_link_create_deferred(struct ev_loop *loop, const px_redis_opts *opts,
                                 px_redis *owner, px_link_state_cb *state_cb,
                                 px_link_want_cb *want_cb, void *udata)
{
    px_link *l = link_new(loop, opts, owner, state_cb, udata);
    l->want_cb = want_cb;
    l->waiting = true;
    return l;
}

void px_link_connect_to(px_link *l, const char *host, int port)
{
    if (l->dead) return;
    if (l->opts.host != host) {
        free((char *)l->opts.host);
        l->opts.host = px_strdup(host);
    }
    l->opts.port = port;
    if (!l->waiting) return;
    l->waiting = false;
    connect_start(l);
}

void px_link_reset(px_link *l, const char *why)
{
    if (l->dead) return;
    if (l->st != ST_DOWN) {
        drop(l, why, PX_LOG_WARN);
    } else if (ev_is_active(&l->retry)) {
        /* Down, waiting out a backoff grown against an address that is gone
         * (a killed master): there is news now, so dial again at once. */
        ev_timer_stop(l->loop, &l->retry);
        l->backoff_ms = PX_LINK_BACKOFF_MIN_MS;
        retry_cb(l->loop, &l->retry, 0);
    }
}

void px_link_on_message(px_link *l, px_redis_cb *cb, void *priv)
{
    l->msg_cb = cb;
    l->msg_priv = priv;
}

static void link_free(px_link *l)
{
    if (l->reader) redisReaderFree(l->reader);
    px_reply_arena_release(l->arena); /* after the reader's last reply, if it holds one */
    if (l->ctx) SSL_CTX_free(l->ctx);
    if (l->out.data) explicit_bzero(l->out.data, l->out.cap);
    px_buf_deinit(&l->out);
    free((char *)l->opts.name);
    free((char *)l->opts.host);
    free((char *)l->opts.unix_path);
    free((char *)l->opts.user);
    px_free_secret((char *)l->opts.password);
    free((char *)l->opts.password_file);
    free((char *)l->tls.ca_file);
    free((char *)l->tls.cert_file);
    free((char *)l->tls.key_file);
    free((char *)l->tls.server_name);
    free(l);
}

void px_link_destroy(px_link *l)
{
    if (l == NULL || l->dead) return;
    l->dead = true;
    ev_timer_stop(l->loop, &l->deadline);
    ev_timer_stop(l->loop, &l->retry);
    ev_timer_stop(l->loop, &l->addr_wait);
    ev_prepare_stop(l->loop, &l->flush);
    ev_async_stop(l->loop, &l->resolved);
    l->busy++;
    if (l->st != ST_DOWN) {
        close_conn(l);
        l->st = ST_DOWN;
        l->gen++;
    }
    fail_pending(l);
    leave(l);
}

bool px_link_is_up(const px_link *l)
{
    return l->up;
}

size_t px_link_pending(const px_link *l)
{
    size_t n = 0;
    for (px_rcmd *c = l->head; c; c = c->next) n++;
    return n;
}

int px_link_argv(px_link *l, long long extra_ms, px_redis_cb *cb, void *priv, int argc,
                 const char **argv, const size_t *lens)
{
    if (l->st != ST_OPEN || !l->up || l->dead) return PX_ERR;
    px_rcmd *c = rcmd_new(l, cb, priv, extra_ms);
    return send_rcmd(l, c, argc, argv, lens);
}

/* Printf-style, for the handshake (hiredis' format). */
static int link_cmd(px_link *l, px_redis_cb *cb, void *priv, const char *fmt, ...)
{
    if (l->st == ST_DOWN) return PX_ERR;
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len < 0) return PX_ERR;
    px_rcmd *c = rcmd_new(l, cb, priv, 0);
    size_t vl = strcspn(fmt, " "); /* the command's name, as in send_rcmd */
    if (vl > sizeof(c->verb) - 1) vl = sizeof(c->verb) - 1;
    for (size_t i = 0; i < vl; i++) c->verb[i] = (char)(fmt[i] | 0x20);
    c->verb[vl] = '\0';
    px_buf_append(&l->out, cmd, (size_t)len);
    free(cmd);
    fifo_push(l, c);
    queue_out(l);
    if (!ev_is_active(&l->deadline)) deadline_rearm(l);
    return PX_OK;
}

int px_link_script(px_link *l, px_script *s, px_redis_cb *cb, void *priv, int nkeys, int argc,
                   const char **argv, const size_t *lens)
{
    if (l->st != ST_OPEN || !l->up || l->dead || argc + 3 > PX_SCRIPT_ARGC_MAX || nkeys < 0 ||
        nkeys > argc)
        return PX_ERR;
    px_rcmd *c = rcmd_new(l, cb, priv, 0);
    c->script = s;
    c->argc = argc + 3;
    /* Kept for a NOSCRIPT retry: the script and its sha outlive the command;
     * numkeys and the arguments are copied into the record's own buffer. */
    if (s->sha[0]) {
        c->argv[0] = "EVALSHA";
        c->lens[0] = 7;
        c->argv[1] = s->sha;
        c->lens[1] = 40;
    } else {
        c->script = NULL;
        c->argv[0] = "EVAL";
        c->lens[0] = 4;
        c->argv[1] = s->body;
        c->lens[1] = strlen(s->body);
    }
    size_t total = 1; /* numkeys: one digit, 0..5 */
    for (int i = 0; i < argc; i++) total += lens[i];
    px_buf_reset(&c->args);
    px_buf_reserve(&c->args, total); /* copies below never move */
    char *p = c->args.data;
    *p = (char)('0' + nkeys);
    c->argv[2] = p++;
    c->lens[2] = 1;
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        c->argv[i + 3] = p;
        c->lens[i + 3] = lens[i];
        p += lens[i];
    }
    *p = '\0'; /* px_buf keeps a NUL at the end */
    c->args.len = total;
    return send_rcmd(l, c, c->argc, c->argv, c->lens);
}
