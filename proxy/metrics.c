/*
 * metrics.c - /metrics (Prometheus text), /healthz and /readyz
 * (docs/operations.md), served by libmicrohttpd on our libev loop: MHD runs
 * without a thread of its own (MHD_USE_EPOLL), we watch its epoll fd and call
 * MHD_run when it is readable or when MHD's own timeout comes. Everything is
 * read on the loop's thread, so counters need no locks.
 *
 * Every counter is declared once, in proxy.h's PX_STREAM_COUNTERS, and
 * exported from the start at 0 for every configured stream block.
 *
 * A stream block's series carry two labels, stream and group, because one
 * stream may be read by several blocks with different groups (config.c
 * rejects two with the same pair): without the group their series would be
 * identical, and Prometheus rejects a scrape with a duplicate series whole. A
 * group-less block exports group="" - not a made-up name such as "none", which
 * could be a real group's: Prometheus stores a label with an empty value as no
 * label at all, so a group-less block's series are the same in queries as
 * before the label existed.
 *
 * With metrics on, a timer asks Redis every PX_GROUP_INFO_S for XINFO GROUPS
 * of each stream that a block reads with a group (one command per stream,
 * asynchronous on the command link, never one per entry), for the
 * idemproxy_group_lag and idemproxy_group_pending gauges.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "addr.h"
#include "deliver.h"
#include "sp.h"
#include "log.h"
#include "metrics.h"
#include "reader.h"
#include "replies.h"
#include "trace.h"

#ifndef PX_COMMIT
#include "git_commit.h" /* PX_COMMIT: the git commit built, "" when unknown (Makefile) */
#endif

#define PX_GROUP_INFO_S 5.0 /* seconds between two XINFO GROUPS of a stream */

/*
 * The metrics server shares the process's file descriptors with Redis and the
 * workers, and in a pod it listens on every interface, so what any client may
 * hold is bounded: at most PX_METRICS_MAX_CONNECTIONS connections at once, at
 * most PX_METRICS_MAX_PER_IP of them from one address (MHD closes the ones over
 * a limit at once), each closed after PX_METRICS_IDLE_TIMEOUT_S seconds without
 * traffic, and each closed when a request has taken PX_METRICS_REQUEST_S
 * seconds in all (a client that sends one header byte a second is never idle,
 * but never finishes either). PX_METRICS_PROBE_SLOTS of the connections are
 * kept for loopback (127.0.0.1, ::1), where `idemproxy health` comes from: no
 * other pod can fill them, so a liveness probe that runs it in the container
 * answers whatever the network sends.
 */
#define PX_METRICS_MAX_CONNECTIONS 64
#define PX_METRICS_MAX_PER_IP      16
#define PX_METRICS_IDLE_TIMEOUT_S  10
#define PX_METRICS_REQUEST_S       5.0
#define PX_METRICS_PROBE_SLOTS     8

/* Upper bounds, in seconds. */
const double px_ack_latency_bounds[PX_HIST_BUCKETS] = {
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30
};
const double px_lock_wait_bounds[PX_HIST_BUCKETS] = {
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30
};
/* Up to the default done_ttl_ms (600 s) closely, and beyond it for longer
 * windows: copies near the window's end mean it is too short. */
const double px_dup_age_bounds[PX_HIST_BUCKETS] = {
    0.1, 1, 5, 15, 30, 60, 120, 300, 450, 540, 600, 900, 1800, 3600
};
const double px_loop_busy_bounds[PX_HIST_BUCKETS] = {
    0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.1, 1
};

/* One open connection of the metrics server, from MHD's connect notice to its
 * close notice (owner: metrics.c). */
typedef struct px_mconn {
    struct px_mconn *prev, *next;
    int fd;
    bool probe;      /* from loopback: counted apart from the others */
    bool cut;        /* shut down for taking too long; MHD closes it next */
    ev_tstamp since; /* when it connected, or its last request ended */
} px_mconn;

typedef struct px_metrics {
    struct MHD_Daemon *mhd;
    px_mconn *conns; /* every open connection */
    unsigned others; /* of them, how many are not from loopback */
    ev_io io;        /* MHD's epoll fd */
    ev_timer timer;  /* MHD's connection timeouts */
    ev_timer groups; /* XINFO GROUPS every PX_GROUP_INFO_S */
} px_metrics;

typedef struct counter_def {
    const char *family, *label, *value, *help; /* help: NULL after a family's first */
    size_t offset;                             /* in px_stream.c */
} counter_def;

#define PX_COUNTER_DEF(n, family, label, value, help) \
    { family, label, value, help, offsetof(__typeof__(((px_stream *)0)->c), n) },
static const counter_def counters[] = { PX_STREAM_COUNTERS(PX_COUNTER_DEF) };
#undef PX_COUNTER_DEF

void px_metrics_observe(const double *bounds, px_hist *h, double seconds)
{
    size_t i = 0;
    while (i < PX_HIST_BUCKETS && seconds > bounds[i]) i++;
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

/* A label value with \, " and newline escaped. */
static void label(px_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            px_buf_append(b, "\\", 1);
            px_buf_append(b, s, 1);
        } else if (*s == '\n') px_buf_appends(b, "\\n");
        else px_buf_append(b, s, 1);
    }
}

/* "family{stream="...",group="..." (the caller closes the braces). */
static void series(px_buf *b, const char *family, const px_stream *st)
{
    px_buf_printf(b, "%s{stream=\"", family);
    label(b, st->conf->stream);
    px_buf_appends(b, "\",group=\"");
    label(b, st->conf->group ? st->conf->group : "");
}

/* A histogram of the whole process: no labels. */
static void hist_process(px_buf *b, const char *name, const char *help, const px_hist *h,
                         const double *bounds)
{
    px_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (size_t i = 0; i <= PX_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        if (i < PX_HIST_BUCKETS) px_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
        else px_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
    }
    px_buf_printf(b, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, h->count);
}

static void hist(px_buf *b, px_proxy *px, const char *name, const char *help, size_t offset,
                 const double *bounds)
{
    px_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        const px_hist *h = (const px_hist *)((const char *)st + offset);
        unsigned long long cum = 0;
        for (size_t i = 0; i <= PX_HIST_BUCKETS; i++) {
            cum += h->counts[i];
            char sub[128];
            snprintf(sub, sizeof(sub), "%s_bucket", name);
            series(b, sub, st);
            if (i < PX_HIST_BUCKETS) px_buf_printf(b, "\",le=\"%g\"} %llu\n", bounds[i], cum);
            else px_buf_printf(b, "\",le=\"+Inf\"} %llu\n", cum);
        }
        char sub[128];
        snprintf(sub, sizeof(sub), "%s_sum", name);
        series(b, sub, st);
        px_buf_printf(b, "\"} %.6f\n", h->sum);
        snprintf(sub, sizeof(sub), "%s_count", name);
        series(b, sub, st);
        px_buf_printf(b, "\"} %llu\n", h->count);
    }
}

static void gauge(px_buf *b, const char *name, const char *type, const char *help, double v)
{
    px_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* --- process metrics, as the Prometheus client libraries export them -------- */

/* /proc/stat's btime: the boot time in seconds since the epoch, or -1. */
static double boot_time(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL) return -1;
    char line[256];
    double bt = -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "btime ", 6) == 0) {
            bt = strtod(line + 6, NULL);
            break;
        }
    fclose(f);
    return bt;
}

/* process_* from /proc/self (Linux): a sample is left out when its source
 * cannot be read. */
static void process_metrics(px_buf *b)
{
    static double btime = -2;
    if (btime == -2) btime = boot_time(); /* fixed while the machine runs */
    double ticks = (double)sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);

    /* /proc/self/stat: "pid (comm) state ..." - fields counted from state (3)
     * after the last ')', since comm may hold spaces and parentheses. */
    char buf[1024];
    size_t n = 0;
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long long field[22] = { 0 }; /* [k]: field k + 3 of proc(5) */
    int got = 0;
    if (p) {
        p++;
        for (got = 0; got < 22; got++) {
            while (*p == ' ') p++;
            if (*p == '\0') break;
            field[got] = strtoull(p, &p, 10);
            if (got == 0)
                while (*p && *p != ' ') p++; /* state is a letter */
        }
    }
    if (got == 22 && ticks > 0) {
        gauge(b, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
              (double)(field[11] + field[12]) / ticks); /* utime (14) + stime (15) */
        gauge(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
              (double)field[21] * (double)page); /* rss (24), in pages */
        if (btime >= 0)
            gauge(b, "process_start_time_seconds", "gauge",
                  "Start time of the process since unix epoch in seconds.",
                  btime + (double)field[19] / ticks); /* starttime (22), in ticks */
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        size_t fds = 0;
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (de->d_name[0] != '.') fds++;
        closedir(d);
        gauge(b, "process_open_fds", "gauge", "Number of open file descriptors.", (double)fds);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        gauge(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
              rl.rlim_cur == RLIM_INFINITY ? INFINITY : (double)rl.rlim_cur);
}

void px_metrics_render(px_proxy *px, px_buf *b)
{
    const char *prev = NULL;
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
        const counter_def *d = &counters[i];
        if (prev == NULL || strcmp(prev, d->family) != 0)
            px_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", d->family, d->help, d->family);
        prev = d->family;
        for (size_t s = 0; s < px->nstreams; s++) {
            px_stream *st = &px->streams[s];
            unsigned long long v = *(const unsigned long long *)((const char *)&st->c + d->offset);
            series(b, d->family, st);
            if (d->label) px_buf_printf(b, "\",%s=\"%s", d->label, d->value);
            px_buf_printf(b, "\"} %llu\n", v);
        }
    }
    gauge(b, "idemproxy_redis_errors_total", "counter",
          "Redis commands that failed: error replies, timeouts, lost links.", (double)px_redis_errors);
    px_buf_printf(b, "# HELP idemproxy_redis_redirects_total Redis Cluster redirects followed, by kind "
                     "(moved: the slot map changed; ask: a slot in migration).\n"
                     "# TYPE idemproxy_redis_redirects_total counter\n"
                     "idemproxy_redis_redirects_total{kind=\"moved\"} %llu\n"
                     "idemproxy_redis_redirects_total{kind=\"ask\"} %llu\n",
                  px_redis_redirects[0], px_redis_redirects[1]);
    gauge(b, "idemproxy_protocol_errors_total", "counter",
          "Worker replies that did not decode, were unspecified or echoed the wrong ids, and "
          "worker connections closed for breaking the SP wire.",
          (double)(px_protocol_errors + px_sp_wire_errors));
    gauge(b, "idemproxy_spans_exported_total", "counter",
          "Spans the OTLP collector accepted (tracing).", (double)px_spans_exported);
    gauge(b, "idemproxy_spans_dropped_total", "counter",
          "Spans lost: the export queue was full, or the collector failed or did not answer.",
          (double)px_spans_dropped);
    gauge(b, "idemproxy_traceparents_invalid_total", "counter",
          "Entries whose trace_field held a malformed W3C traceparent (ignored: a new root).",
          (double)px_traceparents_invalid);

    size_t inflight = 0;
    px_buf_appends(b, "# HELP idemproxy_entries_pending Entries read and not yet left, per stream.\n"
                      "# TYPE idemproxy_entries_pending gauge\n");
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        for (px_entry *e = st->head; e; e = e->next)
            if (e->state == PX_E_SEND || e->state == PX_E_SENT || e->state == PX_E_COMMIT ||
                e->state == PX_E_LOCKWAIT) inflight++;
        series(b, "idemproxy_entries_pending", st);
        px_buf_printf(b, "\"} %zu\n", st->tracked);
    }
    gauge(b, "idemproxy_delivery_window", "gauge",
          "Unanswered deliveries allowed now, over all workers (flow control: docs/protocol.md).",
          (double)px_deliver_window(px));
    gauge(b, "idemproxy_inflight", "gauge",
          "Claimed entries not yet committed (with a worker or being written).", (double)inflight);
    gauge(b, "idemproxy_redis_up", "gauge", "1 while Redis is reachable and every stream is read.",
          px_metrics_ready(px) ? 1 : 0);
    gauge(b, "idemproxy_workers_connected", "gauge", "Worker connections on the app socket.",
          (double)px_deliver_workers(px));
    /* Unknown numbers are left out, not exported as NaN: a NaN would make
     * sum() and max() over pods NaN too, and what scales on this gauge (KEDA,
     * an HPA) cannot act on it either way. */
    px_buf_appends(b, "# HELP idemproxy_group_lag Entries of the stream not yet delivered to the "
                      "group (XINFO GROUPS lag); absent while Redis cannot tell.\n"
                      "# TYPE idemproxy_group_lag gauge\n");
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        if (!st->conf->group || !st->info.lag_known) continue;
        series(b, "idemproxy_group_lag", st);
        px_buf_printf(b, "\"} %lld\n", st->info.lag);
    }
    px_buf_appends(b, "# HELP idemproxy_group_pending Entries delivered to a consumer of the group "
                      "and not acked (XINFO GROUPS pending), all replicas'.\n"
                      "# TYPE idemproxy_group_pending gauge\n");
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        if (!st->conf->group || !st->info.known) continue;
        series(b, "idemproxy_group_pending", st);
        px_buf_printf(b, "\"} %lld\n", st->info.pending);
    }
    px_buf_appends(b, "# HELP idemproxy_build_info The version and git commit built; always 1.\n"
                      "# TYPE idemproxy_build_info gauge\nidemproxy_build_info{version=\"");
    label(b, PX_VERSION);
    px_buf_appends(b, "\",commit=\"");
    label(b, PX_COMMIT);
    px_buf_appends(b, "\"} 1\n");
    process_metrics(b);
    hist(b, px, "idemproxy_ack_latency_seconds", "From a delivery to the worker's answer.",
         offsetof(px_stream, ack_latency), px_ack_latency_bounds);
    hist(b, px, "idemproxy_lock_wait_seconds", "From the first claim attempt to the locks held.",
         offsetof(px_stream, lock_wait), px_lock_wait_bounds);
    hist(b, px, "idemproxy_duplicate_age_seconds",
         "For each copy found done, how long ago its done mark was written (by the mark's time).",
         offsetof(px_stream, dup_age), px_dup_age_bounds);
    hist_process(b, "idemproxy_loop_busy_seconds",
                 "Per event-loop iteration, the time from waking up to waiting again.",
                 &px->loop_busy, px_loop_busy_bounds);
}

bool px_metrics_ready(px_proxy *px)
{
    if (px->stopping || !px_redis_is_up(px->redis) || px_redis_refused()) return false;
    for (size_t s = 0; s < px->nstreams; s++)
        if (!px_reader_live(&px->streams[s])) return false;
    return true;
}

/* --- XINFO GROUPS ------------------------------------------------------------ */

static bool same_stream(const px_stream *a, const px_stream *b)
{
    return strcmp(a->conf->stream, b->conf->stream) == 0;
}

/* The answer for one stream fills in every group block on it; a group the
 * answer lacks (or a lost link, an error) is unknown until the next one. */
static void groups_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_stream *from = priv;
    px_proxy *px = from->px;
    from->info.busy = false;
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        if (!st->conf->group || !same_stream(st, from)) continue;
        st->info.known = st->info.lag_known = false;
        /* Each number only from an integer (replies.c; lag: nil when Redis cannot tell). */
        px_rp_xinfo_group(reply, st->conf->group, &st->info.pending, &st->info.known, &st->info.lag,
                          &st->info.lag_known);
    }
}

static void groups_unknown(px_proxy *px, const px_stream *from)
{
    for (size_t s = 0; s < px->nstreams; s++)
        if (same_stream(&px->streams[s], from))
            px->streams[s].info.known = px->streams[s].info.lag_known = false;
}

/* One XINFO GROUPS per stream read with a group, sent by its first block that
 * is being read (so the stream and its group exist: no error reply), unless
 * the last one has not come back yet. A block not being read, or whose command
 * cannot be sent (link down), exports no numbers: old ones would look current. */
static void groups_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    if (px->stopping) return;
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        if (!px_reader_live(st)) st->info.known = st->info.lag_known = false;
    }
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        if (!st->conf->group || !px_reader_live(st)) continue;
        bool covered = false;
        for (size_t t = 0; t < s && !covered; t++) {
            px_stream *o = &px->streams[t];
            covered = o->conf->group && same_stream(o, st) && (o->info.busy || px_reader_live(o));
        }
        if (covered || st->info.busy) continue;
        const char *argv[] = { "XINFO", "GROUPS", st->conf->stream };
        size_t lens[3] = { 5, 6, strlen(st->conf->stream) };
        if (px_redis_argv(px->redis, st->conf->stream, 0, groups_reply_cb, st, 3, argv, lens) ==
            PX_OK)
            st->info.busy = true;
        else
            groups_unknown(px, st);
    }
}

/* --- HTTP ------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    if (r == NULL) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    px_proxy *px = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "GET only\n", 9);
    if (strcmp(url, "/healthz") == 0) return reply(c, MHD_HTTP_OK, "text/plain", "ok\n", 3);
    if (strcmp(url, "/readyz") == 0) {
        if (px_metrics_ready(px)) return reply(c, MHD_HTTP_OK, "text/plain", "ready\n", 6);
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain",
                     "not ready: Redis unreachable or a stream not being read\n", 56);
    }
    if (strcmp(url, "/metrics") == 0) {
        px_buf b = { 0 };
        px_metrics_render(px, &b);
        enum MHD_Result r = reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                                  b.data, b.len);
        px_buf_deinit(&b);
        return r;
    }
    return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "not found\n", 10);
}

/* --- connections ------------------------------------------------------------ */

static bool from_loopback(const struct sockaddr *a)
{
    if (a == NULL) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(v6)) return true;
        return IN6_IS_ADDR_V4MAPPED(v6) && memcmp(&v6->s6_addr[12], "\x7f\0\0\x01", 4) == 0;
    }
    return false;
}

/* Accept a connection from loopback up to MHD's own limits; any other only
 * while it leaves PX_METRICS_PROBE_SLOTS free. */
static enum MHD_Result accept_cb(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)len;
    px_proxy *px = cls;
    if (from_loopback(addr)) return MHD_YES;
    return px->metrics->others < PX_METRICS_MAX_CONNECTIONS - PX_METRICS_PROBE_SLOTS ? MHD_YES : MHD_NO;
}

static void conn_cb(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_ConnectionNotificationCode toe)
{
    px_proxy *px = cls;
    px_metrics *m = px->metrics;
    px_mconn *k = *ctx;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        k = px_calloc(1, sizeof(*k));
        k->fd = fd ? fd->connect_fd : -1;
        k->probe = addr && from_loopback(addr->client_addr);
        k->since = ev_now(px->loop);
        k->next = m->conns;
        if (m->conns) m->conns->prev = k;
        m->conns = k;
        if (!k->probe) m->others++;
        *ctx = k;
    } else if (k != NULL) {
        if (k->prev) k->prev->next = k->next;
        else m->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        if (!k->probe) m->others--;
        free(k);
        *ctx = NULL;
    }
}

/* A request answered: the connection's clock starts again for the next one. */
static void done_cb(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)con_cls;
    (void)toe;
    px_proxy *px = cls;
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    px_mconn *k = i ? i->socket_context : NULL;
    if (k) k->since = ev_now(px->loop);
}

/* Shut down each connection whose request has taken PX_METRICS_REQUEST_S:
 * MHD sees the end of its stream at its next run and closes it. */
static void cut_slow(px_proxy *px)
{
    ev_tstamp now = ev_now(px->loop);
    for (px_mconn *k = px->metrics->conns; k; k = k->next) {
        if (k->cut || k->fd < 0 || now - k->since < PX_METRICS_REQUEST_S) continue;
        shutdown(k->fd, SHUT_RDWR);
        k->cut = true;
    }
}

static void rearm(px_proxy *px)
{
    px_metrics *m = px->metrics;
    MHD_UNSIGNED_LONG_LONG ms = 1000;
    if (MHD_get_timeout(m->mhd, &ms) != MHD_YES || ms > 1000) ms = 1000;
    ev_timer_stop(px->loop, &m->timer);
    ev_timer_set(&m->timer, (double)ms / 1000.0, 0.);
    ev_timer_start(px->loop, &m->timer);
}

static void mhd_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    cut_slow(px);
    MHD_run(px->metrics->mhd);
    rearm(px);
}

static void mhd_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    cut_slow(px);
    MHD_run(px->metrics->mhd);
    rearm(px);
}

/* metrics.listen as config.c checked it: "host:port", "[v6]:port" or ":port" (every interface). */
int px_metrics_start(px_proxy *px)
{
    const char *where = px->conf->metrics_listen;
    if (where == NULL || where[0] == '\0') return PX_OK;
    char host[PX_ADDR_HOST_MAX], port[8] = "";
    int portno;
    struct addrinfo hints = { 0 }, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    bool split = px_addr_split(where, host, sizeof(host), &portno, PX_ADDR_HOST_OPTIONAL);
    if (split) snprintf(port, sizeof(port), "%d", portno);
    if (!split || getaddrinfo(host[0] ? host : NULL, port, &hints, &res) != 0) {
        px_log_error("metrics: cannot resolve listen address %s", where);
        return PX_ERR;
    }
    /* Bound here, not by MHD, so a failure can say why (address in use). */
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), on = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (fd >= 0 && res->ai_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        px_log_error("metrics: cannot listen on %s: %s (metrics.listen; \"\" disables it)", where,
                     strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return PX_ERR;
    }
    px_metrics *m = px_calloc(1, sizeof(*m));
    px->metrics = m; /* the connection callbacks below may run from the first MHD_run */
    m->mhd = MHD_start_daemon(MHD_USE_EPOLL | (res->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0), 0,
                              accept_cb, px, handler, px, MHD_OPTION_LISTEN_SOCKET, fd,
                              MHD_OPTION_NOTIFY_CONNECTION, conn_cb, px,
                              MHD_OPTION_NOTIFY_COMPLETED, done_cb, px,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PX_METRICS_IDLE_TIMEOUT_S,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)PX_METRICS_MAX_CONNECTIONS,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PX_METRICS_MAX_PER_IP,
                              MHD_OPTION_END);
    freeaddrinfo(res);
    const union MHD_DaemonInfo *info = m->mhd ? MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (info == NULL) {
        px_log_error("metrics: cannot start the HTTP server on %s", where);
        if (m->mhd) MHD_stop_daemon(m->mhd);
        free(m);
        px->metrics = NULL;
        return PX_ERR;
    }
    ev_io_init(&m->io, mhd_io_cb, info->epoll_fd, EV_READ);
    m->io.data = px;
    ev_io_start(px->loop, &m->io);
    ev_timer_init(&m->timer, mhd_timer_cb, 1., 0.);
    m->timer.data = px;
    rearm(px);
    /* The first look soon after the readers are up, then every PX_GROUP_INFO_S. */
    ev_timer_init(&m->groups, groups_cb, 1., PX_GROUP_INFO_S);
    m->groups.data = px;
    ev_timer_start(px->loop, &m->groups);
    px_log_info("metrics on http://%s/metrics", where);
    return PX_OK;
}

void px_metrics_stop(px_proxy *px)
{
    px_metrics *m = px->metrics;
    if (m == NULL) return;
    ev_io_stop(px->loop, &m->io);
    ev_timer_stop(px->loop, &m->timer);
    ev_timer_stop(px->loop, &m->groups);
    MHD_stop_daemon(m->mhd); /* tells conn_cb of each connection it closes */
    while (m->conns) {
        px_mconn *k = m->conns;
        m->conns = k->next;
        free(k);
    }
    free(m);
    px->metrics = NULL;
}
