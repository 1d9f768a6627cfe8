/*
 * trace.c - spans of the sidecar and their export (see trace.h).
 *
 * A finished, sampled span is written at once as OTLP JSON into the body of
 * the batch being filled (up to PX_TRACE_BATCH spans; a partial one goes after
 * PX_TRACE_EVERY_S), and each batch is POSTed to {otlp_endpoint}/v1/traces by
 * libcurl's multi interface, whose sockets and timer are libev watchers. One
 * POST at a time: while it is out, batches queue, PX_TRACE_QUEUE spans at
 * most; past that a new span is dropped, and a POST that fails (no answer in
 * PX_TRACE_TIMEOUT_MS, an error status) drops its batch. Both are counted;
 * neither ever waits, so tracing never slows the dedup. The buffers are kept
 * and reused: no allocation per span.
 */
#include "trace.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "proxy.h"

#define PX_TRACE_QUEUE      4096 /* spans waiting for export, at most */
#define PX_TRACE_BATCH      512  /* spans per POST, at most */
#define PX_TRACE_EVERY_S    1.0  /* a partial batch waits at most this long */
#define PX_TRACE_TIMEOUT_MS 5000 /* a POST not answered by then is dropped */
#define PX_TRACE_RECENT     1024 /* acked deliveries remembered for duplicates' links */

unsigned long long px_spans_exported, px_spans_dropped, px_traceparents_invalid;

/* --- W3C traceparent --------------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1; /* upper case is invalid too (W3C trace-context 3.2.2) */
}

static bool hex_bytes(const char *s, uint8_t *out, size_t n)
{
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out[i] = (uint8_t)(hi << 4 | lo);
        any |= out[i];
    }
    return any != 0 || n == 1; /* ids all zero are invalid; flags 00 are not */
}

bool px_trace_parse(const char *s, size_t len, px_trace_ctx *out)
{
    px_trace_ctx c;
    if (s == NULL || len != PX_TRACEPARENT_LEN || s[0] != '0' || s[1] != '0' || s[2] != '-' ||
        s[35] != '-' || s[52] != '-')
        return false;
    if (!hex_bytes(s + 3, c.trace_id, 16) || !hex_bytes(s + 36, c.span_id, 8) ||
        !hex_bytes(s + 53, &c.flags, 1))
        return false;
    *out = c;
    return true;
}

static void hex_out(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
}

void px_trace_format(const px_trace_ctx *c, char out[PX_TRACEPARENT_LEN + 1])
{
    memcpy(out, "00-", 3);
    hex_out(c->trace_id, 16, out + 3);
    out[35] = '-';
    hex_out(c->span_id, 8, out + 36);
    out[52] = '-';
    hex_out(&c->flags, 1, out + 53);
    out[55] = '\0';
}

void px_trace_fields(const px_entry *e, const char *trace_field, const char **tp, const char **ts)
{
    *tp = *ts = NULL;
    for (size_t i = 0; i < e->nfields; i++) {
        const px_field *f = &e->fields[i];
        if (*tp == NULL && strcmp(f->name, trace_field) == 0) *tp = f->value;
        else if (*ts == NULL && strcmp(f->name, "tracestate") == 0) *ts = f->value;
    }
}

/* --- state ------------------------------------------------------------------- */

/* A finished span, as it is written (refs, valid for the call). */
typedef struct px_span {
    px_trace_ctx ctx;
    const uint8_t *parent; /* 8 bytes, or NULL: a root */
    bool producer;         /* a delivery ("send"); else the entry ("process") */
    bool error;
    const px_entry *e;
    const char *tracestate; /* or NULL */
    const char *result;     /* the outcome, or the worker's answer */
    uint64_t start_ns, end_ns;
    const px_trace_ctx *link; /* the delivery that did the work, or NULL */
} px_span;

/* An entry's spans in progress (px_entry.trace). */
struct px_trace_entry {
    px_trace_ctx ctx;       /* the entry span; flags bit 0: sampled */
    uint8_t parent[8];      /* the producer's span */
    bool has_parent;        /* a valid trace_field */
    const char *tracestate; /* (ref) the entry's tracestate field, with a valid parent */
    uint64_t start_ns;
    px_trace_ctx dctx; /* the current delivery's span */
    uint64_t dstart_ns;
    uint32_t dattempt; /* delivery.attempt before it: unchanged, it never went out */
    bool dopen;
    char tp[PX_TRACEPARENT_LEN + 1]; /* dctx as sent to the worker */
};

/* The last acked delivery of a key, for a copy's link: a direct-mapped table. */
typedef struct {
    uint64_t hash; /* of stream and key; 0: empty */
    px_trace_ctx ctx;
} px_recent;

typedef struct {
    ev_io io;
    curl_socket_t fd;
} px_sock;

/* Spans wait written out, in batches of up to PX_TRACE_BATCH: each buffer is
 * a request body under way (the prefix, then spans separated by commas). */
#define PX_TRACE_BATCHES (PX_TRACE_QUEUE / PX_TRACE_BATCH)

struct px_trace {
    struct ev_loop *loop;  /* (ref) */
    const px_config *conf; /* (ref) */
    double ratio;
    char *url; /* {otlp_endpoint}/v1/traces */
    CURLM *multi;
    ev_timer curl_timer; /* CURLMOPT_TIMERFUNCTION's */
    ev_timer tick;       /* sends a partial batch; runs only while spans wait */
    CURL *easy;          /* the POST in flight (of batch[head]), or NULL */
    struct curl_slist *headers;
    px_buf prefix; /* a body's start: the resource, the scope, "spans":[ */
    px_buf batch[PX_TRACE_BATCHES];
    size_t count[PX_TRACE_BATCHES]; /* spans in each */
    size_t head, nbatch;            /* the oldest batch; batches in use */
    px_recent recent[PX_TRACE_RECENT];
    uint8_t pool[4096]; /* getrandom bytes not yet used */
    size_t pool_left;
};

/* --- ids and clocks ---------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void random_bytes(px_trace *t, uint8_t *out, size_t n)
{
    if (t->pool_left < n) {
        size_t got = 0;
        while (got < sizeof(t->pool)) {
            ssize_t r = getrandom(t->pool + got, sizeof(t->pool) - got, 0);
            if (r > 0) got += (size_t)r;
            else if (errno != EINTR) break;
        }
        /* No getrandom (ENOSYS): ids must still differ, if not unguessably. */
        for (uint64_t x = (now_ns() ^ (uint64_t)getpid() << 32) | 1; got < sizeof(t->pool); got++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            t->pool[got] = (uint8_t)(x >> 24);
        }
        t->pool_left = sizeof(t->pool);
    }
    t->pool_left -= n;
    memcpy(out, t->pool + t->pool_left, n);
}

static bool all_zero(const uint8_t *b, size_t n)
{
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++) any |= b[i];
    return any == 0;
}

static void new_span_id(px_trace *t, uint8_t id[8])
{
    do random_bytes(t, id, 8);
    while (all_zero(id, 8));
}


static uint64_t key_hash(const px_entry *e)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a of the stream, a NUL, the key */
    for (const char *p = e->st->conf->stream; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211u;
    h *= 1099511628211u;
    for (const char *p = e->key; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211u;
    return h ? h : 1;
}

/* --- OTLP JSON ----------------------------------------------------------------- */

/* Written straight into the request body (opentelemetry-proto's JSON mapping,
 * as OTLP/HTTP specifies it: ids in hex, enums as numbers, 64-bit integers as
 * strings). Strings go through px_buf_escape, so a body is valid JSON and
 * UTF-8 whatever bytes a key holds. */

/* The inside of a JSON string: printable ASCII as it is (stream names, ids and
 * most keys), anything else through px_buf_escape. */
static void json_text(px_buf *b, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
            px_buf_escape(b, s, n, PX_ESC_JSON);
            return;
        }
    }
    px_buf_append(b, s, n);
}

static void json_hex(px_buf *b, const char *sep, const char *name, const uint8_t *id, size_t n)
{
    char hex[32];
    hex_out(id, n, hex);
    px_buf_appends(b, sep);
    px_buf_appends(b, "\"");
    px_buf_appends(b, name);
    px_buf_appends(b, "\":\"");
    px_buf_append(b, hex, 2 * n);
    px_buf_appends(b, "\"");
}

/* A decimal number, quoted (64-bit integers are strings in OTLP JSON). */
static void json_u64(px_buf *b, uint64_t v)
{
    char num[22], *p = num + sizeof(num);
    *--p = '"';
    do *--p = (char)('0' + v % 10);
    while (v /= 10);
    *--p = '"';
    px_buf_append(b, p, (size_t)(num + sizeof(num) - p));
}

static void attr_str(px_buf *b, bool first, const char *k, const char *v)
{
    px_buf_appends(b, first ? "{\"key\":\"" : ",{\"key\":\"");
    px_buf_appends(b, k);
    px_buf_appends(b, "\",\"value\":{\"stringValue\":\"");
    json_text(b, v);
    px_buf_appends(b, "\"}}");
}

static void span_write(px_buf *b, const px_span *s)
{
    const px_stream_conf *sc = s->e->st->conf;
    const char *op = s->producer ? "send" : "process";
    px_buf_appends(b, "{\"name\":\"");
    px_buf_appends(b, op);
    px_buf_appends(b, " ");
    json_text(b, sc->stream);
    px_buf_appends(b, "\"");
    json_hex(b, ",", "traceId", s->ctx.trace_id, 16);
    json_hex(b, ",", "spanId", s->ctx.span_id, 8);
    if (s->parent) json_hex(b, ",", "parentSpanId", s->parent, 8);
    if (s->tracestate) {
        px_buf_appends(b, ",\"traceState\":\"");
        json_text(b, s->tracestate);
        px_buf_appends(b, "\"");
    }
    /* SPAN_KIND_PRODUCER (4), SPAN_KIND_CONSUMER (5) */
    px_buf_appends(b, s->producer ? ",\"kind\":4" : ",\"kind\":5");
    px_buf_appends(b, ",\"startTimeUnixNano\":");
    json_u64(b, s->start_ns);
    px_buf_appends(b, ",\"endTimeUnixNano\":");
    json_u64(b, s->end_ns);
    px_buf_appends(b, ",\"attributes\":[");
    attr_str(b, true, "messaging.system", "redis_streams");
    attr_str(b, false, "messaging.operation.type", op);
    attr_str(b, false, "messaging.operation.name", op);
    attr_str(b, false, "messaging.destination.name", sc->stream);
    attr_str(b, false, "messaging.message.id", s->e->id);
    if (sc->group) attr_str(b, false, "messaging.consumer.group.name", sc->group);
    if (s->e->key) attr_str(b, false, "idemproxy.key", s->e->key);
    if (s->producer) {
        px_buf_appends(b, ",{\"key\":\"idemproxy.attempt\",\"value\":{\"intValue\":");
        json_u64(b, s->e->delivery.attempt);
        px_buf_appends(b, "}}");
        attr_str(b, false, "idemproxy.answer", s->result);
    } else {
        attr_str(b, false, "idemproxy.outcome", s->result);
    }
    px_buf_appends(b, "]");
    if (s->link) {
        px_buf_appends(b, ",\"links\":[{");
        json_hex(b, "", "traceId", s->link->trace_id, 16);
        json_hex(b, ",", "spanId", s->link->span_id, 8);
        px_buf_appends(b, "}]");
    }
    /* STATUS_CODE_ERROR (2), or UNSET (0) */
    px_buf_appends(b, s->error ? ",\"status\":{\"code\":2}}" : ",\"status\":{\"code\":0}}");
}

/* One resource (service.instance.id: the first stream block's consumer, the
 * process's name in its group) and one scope per body. */
static void prefix_write(px_trace *t)
{
    const char *consumer = t->conf->streams[0].consumer;
    px_buf *b = &t->prefix;
    px_buf_appends(b, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    attr_str(b, true, "service.name", t->conf->trace_service_name);
    attr_str(b, false, "service.version", PX_VERSION);
    attr_str(b, false, "service.instance.id", consumer ? consumer : "");
    px_buf_appends(b, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"idemproxy\",\"version\":\"" PX_VERSION
                      "\"},\"spans\":[");
}

/* --- export ------------------------------------------------------------------ */

static void send_batch(px_trace *t);

/* A partial batch goes out PX_TRACE_EVERY_S after its first span. (Set each
 * time: a one-shot timer that ran restarts at once, libev keeping its 'at'
 * relative to when it stopped: every span had a POST of its own.) */
static void tick_arm(px_trace *t)
{
    if (ev_is_active(&t->tick)) return;
    ev_timer_set(&t->tick, PX_TRACE_EVERY_S, 0.);
    ev_timer_start(t->loop, &t->tick);
}

static void post_done(px_trace *t, bool ok)
{
    if (ok) px_spans_exported += t->count[t->head];
    else px_spans_dropped += t->count[t->head];
    curl_multi_remove_handle(t->multi, t->easy);
    curl_easy_cleanup(t->easy);
    t->easy = NULL;
    t->count[t->head] = 0;
    t->head = (t->head + 1) % PX_TRACE_BATCHES;
    t->nbatch--;
    if (t->nbatch > 0 && t->count[t->head] == PX_TRACE_BATCH) send_batch(t);
    else if (t->nbatch > 0) tick_arm(t);
}

static void check_done(px_trace *t)
{
    static px_log_limit lim;
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(t->multi, &left)))
        if (m->msg == CURLMSG_DONE && m->easy_handle == t->easy) {
            long code = 0;
            curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &code);
            bool ok = m->data.result == CURLE_OK && code >= 200 && code < 300;
            if (!ok && m->data.result != CURLE_OK)
                px_log_limited(&lim, 10.0, PX_LOG_WARN, "tracing: POST %s failed: %s; %zu spans dropped",
                               t->url, curl_easy_strerror(m->data.result), t->count[t->head]);
            else if (!ok)
                px_log_limited(&lim, 10.0, PX_LOG_WARN, "tracing: POST %s answered %ld; %zu spans dropped",
                               t->url, code, t->count[t->head]);
            post_done(t, ok);
            return; /* post_done may have started another, with its own messages */
        }
}

static size_t discard(char *p, size_t size, size_t n, void *u)
{
    (void)p;
    (void)u;
    return size * n;
}

/* POST the oldest batch, if it has spans and none is out. */
static void send_batch(px_trace *t)
{
    if (t->easy || t->nbatch == 0 || t->count[t->head] == 0) return;
    px_buf *b = &t->batch[t->head];
    px_buf_appends(b, "]}]}]}");
    t->easy = curl_easy_init();
    if (t->easy == NULL) {
        post_done(t, false);
        return;
    }
    curl_easy_setopt(t->easy, CURLOPT_URL, t->url);
    curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, b->data);
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE, (long)b->len);
    curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, (long)PX_TRACE_TIMEOUT_MS);
    curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(t->easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_multi_add_handle(t->multi, t->easy);
}

static void push(px_trace *t, const px_span *s)
{
    size_t tail = (t->head + t->nbatch + PX_TRACE_BATCHES - 1) % PX_TRACE_BATCHES;
    bool sending = t->easy && t->nbatch == 1; /* the tail is the POST in flight */
    if (t->nbatch == 0 || t->count[tail] == PX_TRACE_BATCH || sending) {
        if (t->nbatch == PX_TRACE_BATCHES) { /* the collector is behind: this span is lost */
            px_spans_dropped++;
            return;
        }
        tail = (t->head + t->nbatch) % PX_TRACE_BATCHES;
        t->nbatch++;
        px_buf_reset(&t->batch[tail]);
        px_buf_append(&t->batch[tail], t->prefix.data, t->prefix.len);
    }
    px_buf *b = &t->batch[tail];
    if (t->count[tail]++) px_buf_appends(b, ",");
    else tick_arm(t); /* only while spans wait: an idle daemon is not woken */
    span_write(b, s);
    if (t->count[tail] == PX_TRACE_BATCH) send_batch(t);
}

/* --- libcurl on the loop ----------------------------------------------------- */

static void curl_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    px_trace *t = w->data;
    px_sock *s = (px_sock *)w;
    int running, flags = (revents & EV_READ ? CURL_CSELECT_IN : 0) | (revents & EV_WRITE ? CURL_CSELECT_OUT : 0);
    curl_multi_socket_action(t->multi, s->fd, flags, &running);
    check_done(t);
}

static int curl_sock_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    (void)easy;
    px_trace *t = userp;
    px_sock *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            ev_io_stop(t->loop, &s->io);
            free(s);
            curl_multi_assign(t->multi, fd, NULL);
        }
        return 0;
    }
    if (s == NULL) {
        s = px_calloc(1, sizeof(*s));
        s->fd = fd;
        curl_multi_assign(t->multi, fd, s);
    } else {
        ev_io_stop(t->loop, &s->io);
    }
    int ev = (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);
    ev_io_init(&s->io, curl_io_cb, fd, ev);
    s->io.data = t;
    ev_io_start(t->loop, &s->io);
    return 0;
}

static void curl_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_trace *t = w->data;
    int running;
    curl_multi_socket_action(t->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(t);
}

static int curl_timerfn(CURLM *multi, long ms, void *userp)
{
    (void)multi;
    px_trace *t = userp;
    ev_timer_stop(t->loop, &t->curl_timer);
    if (ms >= 0) {
        ev_timer_set(&t->curl_timer, (double)ms / 1000.0, 0.);
        ev_timer_start(t->loop, &t->curl_timer);
    }
    return 0;
}

static void tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    send_batch(w->data);
}

px_trace *px_trace_create(struct ev_loop *loop, const px_config *conf)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        px_log_error("tracing: libcurl did not initialise; tracing is off");
        return NULL;
    }
    px_trace *t = px_calloc(1, sizeof(*t));
    t->loop = loop;
    t->conf = conf;
    t->ratio = conf->sample_ratio;
    size_t n = strlen(conf->otlp_endpoint);
    while (n > 0 && conf->otlp_endpoint[n - 1] == '/') n--;
    t->url = px_malloc(n + sizeof("/v1/traces"));
    memcpy(t->url, conf->otlp_endpoint, n);
    memcpy(t->url + n, "/v1/traces", sizeof("/v1/traces"));
    t->headers = curl_slist_append(NULL, "Content-Type: application/json");
    prefix_write(t);
    t->multi = curl_multi_init();
    curl_multi_setopt(t->multi, CURLMOPT_SOCKETFUNCTION, curl_sock_cb);
    curl_multi_setopt(t->multi, CURLMOPT_SOCKETDATA, t);
    curl_multi_setopt(t->multi, CURLMOPT_TIMERFUNCTION, curl_timerfn);
    curl_multi_setopt(t->multi, CURLMOPT_TIMERDATA, t);
    ev_init(&t->curl_timer, curl_timer_cb);
    t->curl_timer.data = t;
    ev_timer_init(&t->tick, tick_cb, PX_TRACE_EVERY_S, 0.);
    t->tick.data = t;
    px_log_info("tracing: spans to %s (OTLP JSON), sample_ratio %g", t->url, t->ratio);
    return t;
}

void px_trace_destroy(px_trace *t)
{
    if (t == NULL) return;
    /* What is queued gets one last chance, a second at most, off the loop. */
    for (double end = ev_time() + 1.0; t->nbatch > 0 && ev_time() < end;) {
        send_batch(t);
        int running;
        curl_multi_perform(t->multi, &running);
        check_done(t);
        if (t->easy) curl_multi_poll(t->multi, NULL, 0, 50, NULL);
    }
    while (t->easy) post_done(t, false); /* which starts the next full batch, if any */
    for (; t->nbatch > 0; t->nbatch--, t->head = (t->head + 1) % PX_TRACE_BATCHES)
        px_spans_dropped += t->count[t->head];
    for (size_t i = 0; i < PX_TRACE_BATCHES; i++) px_buf_deinit(&t->batch[i]);
    px_buf_deinit(&t->prefix);
    ev_timer_stop(t->loop, &t->tick);
    ev_timer_stop(t->loop, &t->curl_timer);
    curl_multi_cleanup(t->multi);
    curl_slist_free_all(t->headers);
    curl_global_cleanup();
    free(t->url);
    free(t);
}

/* --- the hooks --------------------------------------------------------------- */

void px_trace_entry_begin(px_trace *t, px_entry *e)
{
    struct px_trace_entry *te = px_calloc(1, sizeof(*te));
    const char *tp, *ts;
    px_trace_fields(e, t->conf->trace_field, &tp, &ts);
    px_trace_ctx parent;
    if (tp && px_trace_parse(tp, strlen(tp), &parent)) {
        memcpy(te->ctx.trace_id, parent.trace_id, 16);
        memcpy(te->parent, parent.span_id, 8);
        te->has_parent = true;
        te->ctx.flags = parent.flags & 1; /* a sampled parent is always followed */
        te->tracestate = ts;
    } else {
        if (tp) px_traceparents_invalid++;
        do random_bytes(t, te->ctx.trace_id, 16);
        while (all_zero(te->ctx.trace_id, 16));
        uint8_t r[4];
        random_bytes(t, r, 4);
        uint32_t v = (uint32_t)r[0] << 24 | (uint32_t)r[1] << 16 | (uint32_t)r[2] << 8 | r[3];
        te->ctx.flags = (double)v < t->ratio * 4294967296.0 ? 1 : 0;
    }
    new_span_id(t, te->ctx.span_id);
    if (te->ctx.flags & 1) te->start_ns = now_ns(); /* unsampled: no span, no times */
    e->trace = te;
}

/* End the open delivery span of 'e' with 'answer' (unsampled: not exported). */
static void delivery_close(px_trace *t, px_entry *e, const char *answer, bool error)
{
    struct px_trace_entry *te = e->trace;
    if (!te->dopen) return;
    te->dopen = false;
    if (!(te->ctx.flags & 1) || e->delivery.attempt == te->dattempt) return;
    px_span s = { .producer = true, .ctx = te->dctx, .parent = te->ctx.span_id, .e = e, .result = answer, .error = error, .start_ns = te->dstart_ns, .end_ns = now_ns() };
    push(t, &s);
}

void px_trace_delivery_begin(px_trace *t, px_entry *e, const char **tp, const char **ts)
{
    struct px_trace_entry *te = e->trace;
    /* One still open was never sent (the socket had no room): not a delivery. */
    te->dopen = true;
    te->dattempt = e->delivery.attempt;
    te->dctx = te->ctx;
    new_span_id(t, te->dctx.span_id);
    if (te->ctx.flags & 1) te->dstart_ns = now_ns();
    px_trace_format(&te->dctx, te->tp);
    *tp = te->tp;
    *ts = te->tracestate;
}

void px_trace_delivery_end(px_trace *t, px_entry *e, px_ack_status status)
{
    static const char *const names[] = { "invalid", "ack", "retry", "drop", "timeout" };
    struct px_trace_entry *te = e->trace;
    if (!te->dopen) return;
    if (status == PX_ACK_ACK && e->key) { /* a later copy of the key links to it */
        uint64_t h = key_hash(e);
        px_recent *r = &t->recent[h % PX_TRACE_RECENT];
        r->hash = h;
        r->ctx = te->dctx;
    }
    delivery_close(t, e, names[status], status != PX_ACK_ACK && status != PX_ACK_DROP);
}

void px_trace_entry_end(px_trace *t, px_entry *e, px_outcome outcome)
{
    static const char *const names[] = { "released", "acked", "duplicate", "dead_lettered", "skipped" };
    struct px_trace_entry *te = e->trace;
    delivery_close(t, e, "released", false);
    if (te->ctx.flags & 1) {
        px_span s = { .ctx = te->ctx, .parent = te->has_parent ? te->parent : NULL, .e = e, .tracestate = te->tracestate, .result = names[outcome], .error = outcome == PX_OUT_DEAD_LETTERED, .start_ns = te->start_ns, .end_ns = now_ns() };
        if (outcome == PX_OUT_DUPLICATE && e->key) {
            uint64_t h = key_hash(e);
            px_recent *r = &t->recent[h % PX_TRACE_RECENT];
            if (r->hash == h) s.link = &r->ctx;
        }
        push(t, &s);
    }
    px_trace_entry_free(e);
}

void px_trace_entry_free(px_entry *e)
{
    free(e->trace);
    e->trace = NULL;
}
