/*
 * idemproxy_client.c - a worker's side of idemproxy: an NN_REP socket that
 * receives idemproxy.v1.Delivery messages and answers each with an Ack.
 *
 * A cooked REP socket does the routing for us: nanomsg keeps the request's
 * backtrace (the request id idemproxy put in the SP header) from nn_recv and
 * puts it on the next nn_send, so a reply needs no header here. What we add is
 * the protobuf coding (protoc-c output, generated at build time), a copy of the
 * Delivery into plain C types, and a check that each delivery is answered once.
 */
#include "idemproxy_client.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "idemproxy/v1/idemproxy.pb-c.h"

_Static_assert((int) IDEMPROXY_STATUS_ACK == (int) IDEMPROXY__V1__ACK__STATUS__ACK &&
               (int) IDEMPROXY_STATUS_RETRY == (int) IDEMPROXY__V1__ACK__STATUS__RETRY &&
               (int) IDEMPROXY_STATUS_DROP == (int) IDEMPROXY__V1__ACK__STATUS__DROP,
               "idemproxy_status must be idemproxy.v1.Ack.Status");

/* Records an error on 'c' (a printf-style description and an errno value)
 * and returns IDEMPROXY_CLIENT_ERR, so callers can write 'return set_error(...)'. */
static int set_error(idemproxy_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_error(idemproxy_client *c, int err, const char *fmt, ...)
{
    va_list ap;

    c->err = err;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof(c->errstr), fmt, ap);
    va_end(ap);
    return IDEMPROXY_CLIENT_ERR;
}

/* Opens the REP socket and dials c->endpoint. nn_connect only checks the
 * address: the dialing happens in nanomsg's threads, again every
 * NN_RECONNECT_IVL (100 ms) until idemproxy is up. */
static void dial(idemproxy_client *c)
{
    c->sock = nn_socket(AF_SP, NN_REP);
    if (c->sock < 0) {
        set_error(c, errno, "nn_socket: %s", nn_strerror(errno));
        return;
    }
    nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &c->rcvmax, sizeof(c->rcvmax));
    if (nn_connect(c->sock, c->endpoint) < 0) {
        set_error(c, errno, "nn_connect %s: %s", c->endpoint, nn_strerror(errno));
        nn_close(c->sock);
        c->sock = -1;
    }
}

/* The watchdog of idemproxy_client_recv. nanomsg 1.1.5's ipc dialer can get stuck
 * after idemproxy dies with deliveries in flight (kill -9): it connects and
 * breaks again and again, ten times a second, and never delivers (tests/fault
 * scenario 1; NNG- and mangos-based workers recover). A fresh socket dials
 * cleanly, so after IDEMPROXY_CLIENT_REDIAL_MS of receive timeouts without a current
 * connection the socket is closed and opened again. Nothing is lost: what
 * was not answered is idemproxy's to deliver again. */
#define IDEMPROXY_CLIENT_REDIAL_MS 2000

static long long mono_ms(void);

static void watchdog(idemproxy_client *c, int waited_ms)
{
    long long now = mono_ms();

    if (nn_get_statistic(c->sock, NN_STAT_CURRENT_CONNECTIONS) > 0) {
        c->unconnected_ms = 0;
        c->unconnected_since_ms = 0;
        return;
    }
    /* No connection: say so now and then, or a wrong endpoint dials in silence. */
    if (c->unconnected_since_ms == 0) {
        c->unconnected_since_ms = now;
        c->dial_log_next_ms = now + c->dial_log_ms;
    }
    if (now >= c->dial_log_next_ms) {
        c->dial_log_next_ms = now + 6LL * c->dial_log_ms;
        set_error(c, ENOTCONN, "still dialing %s: no connection to idemproxy for %lld s "
                  "(is idemproxy running, and is this its app.endpoint?)", c->endpoint,
                  (now - c->unconnected_since_ms + 500) / 1000);
    }
    c->unconnected_ms += waited_ms > 0 ? waited_ms : 100;
    if (c->unconnected_ms < IDEMPROXY_CLIENT_REDIAL_MS)
        return;
    c->unconnected_ms = 0;
    while (nn_close(c->sock) < 0 && errno == EINTR)
        ;
    c->sock = -1;
    dial(c);
}

idemproxy_client *idemproxy_client_connect(const char *endpoint)
{
    idemproxy_client *c = calloc(1, sizeof(*c));
    const char *env;

    if (c == NULL)
        return NULL;
    if (endpoint == NULL)
        endpoint = IDEMPROXY_CLIENT_DEFAULT_ENDPOINT;

    snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
    c->rcvmax = IDEMPROXY_CLIENT_DEFAULT_MAX_ENTRY_BYTES + IDEMPROXY_CLIENT_SP_HEADER_BYTES;
    env = getenv("IDEMPROXY_DIAL_LOG_MS");
    c->dial_log_ms = env != NULL && atoi(env) > 0 ? atoi(env) : 5000;
    c->unconnected_since_ms = mono_ms();
    c->dial_log_next_ms = c->unconnected_since_ms + c->dial_log_ms;
    dial(c);
    return c;
}

int idemproxy_client_set_max_entry_bytes(idemproxy_client *c, int bytes)
{
    if (bytes < -1 || bytes == 0 || bytes > INT_MAX - IDEMPROXY_CLIENT_SP_HEADER_BYTES)
        return set_error(c, EINVAL, "max entry bytes %d: must be positive, or -1 for no limit", bytes);
    c->rcvmax = bytes < 0 ? -1 : bytes + IDEMPROXY_CLIENT_SP_HEADER_BYTES;
    if (c->sock >= 0 &&
        nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &c->rcvmax, sizeof(c->rcvmax)) < 0)
        return set_error(c, errno, "NN_RCVMAXSIZE: %s", nn_strerror(errno));
    return IDEMPROXY_CLIENT_OK;
}

static long long mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void idemproxy_client_free(idemproxy_client *c)
{
    if (c == NULL)
        return;
    if (c->sock >= 0) {
        /* nn_send only queued the last answer for nanomsg's I/O thread, and
         * nn_close drops what is queued (1.1.5 ignores NN_LINGER): give it
         * the time it needs to leave, a few microseconds when all is well. */
        long long left = c->last_send_ms ? c->last_send_ms + IDEMPROXY_CLIENT_LINGER_MS - mono_ms() : 0;
        struct timespec ts = { left / 1000, (left % 1000) * 1000000L };

        while (left > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        while (nn_close(c->sock) < 0 && errno == EINTR)
            ;
    }
    free(c);
}

/* Packs an Ack and hands it to nanomsg, which routes it to the request the
 * socket received last. Empty strings are simply left out of the encoding. */
static int send_ack(idemproxy_client *c, idemproxy_status status, const char *reason,
                    const char *stream, const char *entry_id, uint32_t retry_after_ms)
{
    Idemproxy__V1__Ack ack = IDEMPROXY__V1__ACK__INIT;
    uint8_t *buf;
    size_t len;
    int rc;

    ack.status = (Idemproxy__V1__Ack__Status) status;
    if (reason != NULL)
        ack.reason = (char *) reason;
    if (stream != NULL)
        ack.stream = (char *) stream;
    if (entry_id != NULL)
        ack.entry_id = (char *) entry_id;
    ack.retry_after_ms = retry_after_ms;

    len = idemproxy__v1__ack__get_packed_size(&ack);
    buf = malloc(len);
    if (buf == NULL)
        return set_error(c, ENOMEM, "out of memory packing an Ack of %zu bytes", len);
    idemproxy__v1__ack__pack(&ack, buf);
    rc = nn_send(c->sock, buf, len, 0);
    free(buf);
    if (rc < 0)
        return set_error(c, errno, "nn_send: %s", nn_strerror(errno));
    c->pending = 0;
    c->last_send_ms = mono_ms();
    return IDEMPROXY_CLIENT_OK;
}

/* True when 's' is well-formed UTF-8 (no overlong forms, surrogates or code
 * points over U+10FFFF), as proto3 requires of a string field. protobuf-c
 * does not check it; the other clients' protobuf libraries refuse such input,
 * and so do we, so the application never gets a key it cannot store. */
static int utf8_valid(const char *str)
{
    const unsigned char *s = (const unsigned char *) str;

    while (*s) {
        unsigned cp;
        int n, i;

        if (*s < 0x80) {
            s++;
            continue;
        }
        if (*s >= 0xc2 && *s <= 0xdf)
            n = 1, cp = *s & 0x1f;
        else if (*s >= 0xe0 && *s <= 0xef)
            n = 2, cp = *s & 0x0f;
        else if (*s >= 0xf0 && *s <= 0xf4)
            n = 3, cp = *s & 0x07;
        else
            return 0;
        for (i = 1; i <= n; i++) {
            if ((s[i] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i] & 0x3f);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        s += n + 1;
    }
    return 1;
}

static int strings_valid(const Idemproxy__V1__Delivery *msg)
{
    size_t i;

    if (!utf8_valid(msg->stream) || !utf8_valid(msg->entry_id) || !utf8_valid(msg->key) ||
        !utf8_valid(msg->traceparent) || !utf8_valid(msg->tracestate) || !utf8_valid(msg->lock))
        return 0;
    for (i = 0; i < msg->n_fields; i++) {
        if (!utf8_valid(msg->fields[i]->name))
            return 0;
    }
    return 1;
}

/* Copies what the unpacked message holds into a idemproxy_delivery that points into
 * it; returns NULL when out of memory. */
static idemproxy_delivery *delivery_create(Idemproxy__V1__Delivery *msg)
{
    idemproxy_delivery *d = calloc(1, sizeof(*d));
    idemproxy_field *fields = calloc(msg->n_fields ? msg->n_fields : 1, sizeof(*fields));
    size_t i;

    if (d == NULL || fields == NULL) {
        free(d);
        free(fields);
        return NULL;
    }
    for (i = 0; i < msg->n_fields; i++) {
        fields[i].name = msg->fields[i]->name;
        fields[i].value = msg->fields[i]->value.data;
        fields[i].value_len = msg->fields[i]->value.len;
    }
    d->stream = msg->stream;
    d->entry_id = msg->entry_id;
    d->key = msg->key;
    d->fields = fields;
    d->nfields = msg->n_fields;
    d->payload = msg->payload.data;
    d->payload_len = msg->payload.len;
    d->attempt = msg->attempt;
    d->fencing_token = msg->fencing_token;
    d->deadline_unix_ms = msg->deadline_unix_ms;
    d->msg = msg;
    d->traceparent = msg->traceparent;
    d->tracestate = msg->tracestate;
    d->lock = msg->lock;
    return d;
}

int idemproxy_client_recv(idemproxy_client *c, int timeout_ms,
                          idemproxy_delivery **out)
{
    Idemproxy__V1__Delivery *msg;
    void *buf = NULL;
    int n;

    *out = NULL;
    c->err = 0;
    c->errstr[0] = '\0';
    if (c->sock < 0)
        return set_error(c, EBADF, "not connected");
    /* Receiving abandons an unanswered delivery (REP holds one request). */
    c->pending = 0;
    /* In slices of at most 1 s, so the watchdog runs even without a timeout. */
    for (;;) {
        int slice = timeout_ms < 0 || timeout_ms > 1000 ? 1000 : timeout_ms;

        if (nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &slice, sizeof(slice)) < 0)
            return set_error(c, errno, "NN_RCVTIMEO: %s", nn_strerror(errno));
        n = nn_recv(c->sock, &buf, NN_MSG, 0);
        if (n >= 0)
            break;
        if (errno == EINTR)
            return IDEMPROXY_CLIENT_EAGAIN;
        if (errno != ETIMEDOUT && errno != EAGAIN)
            return set_error(c, errno, "nn_recv: %s", nn_strerror(errno));
        watchdog(c, slice);
        if (c->err != 0 || c->sock < 0) /* a line to log, or the redial failed */
            return IDEMPROXY_CLIENT_EAGAIN;
        if (timeout_ms >= 0 && (timeout_ms -= slice) <= 0)
            return IDEMPROXY_CLIENT_EAGAIN;
    }
    c->pending = 1;
    c->seq++;
    c->unconnected_ms = 0;
    c->unconnected_since_ms = 0;

    /* protobuf-c returns NULL both for bad input and for a failed malloc. */
    msg = idemproxy__v1__delivery__unpack(NULL, (size_t) n, buf);
    nn_freemsg(buf);
    if (msg != NULL && !strings_valid(msg)) {
        idemproxy__v1__delivery__free_unpacked(msg, NULL);
        send_ack(c, IDEMPROXY_STATUS_RETRY, "undecodable delivery: a string field is not UTF-8", NULL, NULL, 0);
        return set_error(c, EPROTO, "a Delivery of %d bytes has a string field that is "
                         "not UTF-8; answered RETRY", n);
    }
    if (msg != NULL && (*out = delivery_create(msg)) == NULL)
        idemproxy__v1__delivery__free_unpacked(msg, NULL);
    if (*out == NULL) {
        /* The application has nothing to answer, so answer for it: a RETRY
         * lets idemproxy count the attempt and dead-letter it in the end. */
        send_ack(c, IDEMPROXY_STATUS_RETRY, "undecodable delivery (or out of memory)", NULL, NULL, 0);
        return set_error(c, EPROTO, "cannot decode a Delivery of %d bytes (a wrong wire "
                         "type, a truncated field) or out of memory; answered RETRY", n);
    }
    (*out)->seq = c->seq;
    if ((*out)->deadline_unix_ms != 0 && unix_ms() > (long long) (*out)->deadline_unix_ms) {
        /* idemproxy has stopped waiting for this answer and will deliver the
         * entry again: running the handler now would be stale work. */
        set_error(c, ETIMEDOUT, "%s %s key=%s: deadline passed before the handler ran; "
                  "answered RETRY", (*out)->stream, (*out)->entry_id, (*out)->key);
        send_ack(c, IDEMPROXY_STATUS_RETRY, "deadline passed before the handler ran",
                 (*out)->stream, (*out)->entry_id, 0);
        idemproxy_delivery_free(*out);
        *out = NULL;
        return IDEMPROXY_CLIENT_EAGAIN;
    }
    return IDEMPROXY_CLIENT_OK;
}

static int reply(idemproxy_client *c, const idemproxy_delivery *d, idemproxy_status status,
                 const char *reason, uint32_t retry_after_ms)
{
    if (status != IDEMPROXY_STATUS_ACK && status != IDEMPROXY_STATUS_RETRY && status != IDEMPROXY_STATUS_DROP)
        return set_error(c, EINVAL, "unknown status %d", (int) status);
    if (!c->pending || d->seq != c->seq)
        return set_error(c, EINVAL, "delivery %s is not awaiting an answer (answer "
                         "each delivery once, before receiving the next)", d->entry_id);
    return send_ack(c, status, reason, d->stream, d->entry_id, retry_after_ms);
}

int idemproxy_client_reply(idemproxy_client *c, const idemproxy_delivery *d,
                           idemproxy_status status, const char *reason)
{
    return reply(c, d, status, reason, 0);
}

int idemproxy_client_retry_after(idemproxy_client *c, const idemproxy_delivery *d,
                                 uint32_t ms, const char *reason)
{
    return reply(c, d, IDEMPROXY_STATUS_RETRY, reason,
                 ms > IDEMPROXY_CLIENT_MAX_RETRY_AFTER_MS ? IDEMPROXY_CLIENT_MAX_RETRY_AFTER_MS : ms);
}

long long idemproxy_delivery_remaining_ms(const idemproxy_delivery *d)
{
    long long left;

    if (d->deadline_unix_ms == 0)
        return -1;
    if (d->deadline_unix_ms > (uint64_t) LLONG_MAX)
        return LLONG_MAX;
    left = (long long) d->deadline_unix_ms - unix_ms();
    return left > 0 ? left : 0;
}

int idemproxy_client_ack(idemproxy_client *c, const idemproxy_delivery *d)
{
    return idemproxy_client_reply(c, d, IDEMPROXY_STATUS_ACK, NULL);
}

int idemproxy_client_retry(idemproxy_client *c, const idemproxy_delivery *d, const char *reason)
{
    return idemproxy_client_reply(c, d, IDEMPROXY_STATUS_RETRY, reason);
}

int idemproxy_client_drop(idemproxy_client *c, const idemproxy_delivery *d, const char *reason)
{
    return idemproxy_client_reply(c, d, IDEMPROXY_STATUS_DROP, reason);
}

void idemproxy_delivery_free(idemproxy_delivery *d)
{
    if (d == NULL)
        return;
    idemproxy__v1__delivery__free_unpacked(d->msg, NULL);
    free((void *) d->fields);
    free(d);
}
