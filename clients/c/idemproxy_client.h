/*
 * idemproxy_client.h - the C client for idemproxy workers.
 *
 * idemproxy binds an endpoint with a raw NN_REQ socket and sends one
 * idemproxy.v1.Delivery per stream entry; a worker connects a plain NN_REP
 * socket and loops: idemproxy_client_recv(), handle the delivery, answer it
 * with idemproxy_client_ack(), idemproxy_client_retry() or
 * idemproxy_client_drop(), then idemproxy_delivery_free().
 *
 * Installed (make install PREFIX=...): libidemproxy_client.so, this header and
 * idemproxy-client.pc; build with `pkg-config --cflags --libs idemproxy-client`.
 * Every public name starts with idemproxy_ or IDEMPROXY_; the library exports
 * nothing else (its protobuf-c code is hidden), so a program may generate and
 * link its own idemproxy.v1 code next to it.
 *
 *     idemproxy_client *c = idemproxy_client_connect("ipc:///tmp/idemproxy.sock");
 *     if (c == NULL || c->err) { ...c ? c->errstr : "out of memory"... }
 *     for (;;) {
 *         idemproxy_delivery *d;
 *         int rc = idemproxy_client_recv(c, -1, &d);
 *         if (rc == IDEMPROXY_CLIENT_EAGAIN) {            (timeout or signal)
 *             if (c->err) ...log c->errstr...;         (still dialing, a late delivery)
 *             continue;
 *         }
 *         if (rc != IDEMPROXY_CLIENT_OK) { ...c->errstr...; continue; }
 *         ...handle d->key, d->payload, d->fields...
 *         idemproxy_client_ack(c, d);
 *         idemproxy_delivery_free(d);
 *     }
 *
 * Answer every delivery exactly once, before receiving the next: a REP socket
 * holds one request at a time, so receiving again without answering abandons
 * the unanswered delivery, which idemproxy redelivers after ack_timeout_ms
 * with attempt + 1 (that is also the way to "not answer" on purpose). A reply
 * is routed back by nanomsg and dropped silently if idemproxy went away in the
 * meantime: IDEMPROXY_CLIENT_OK means "handed to nanomsg", and idemproxy's ack
 * timeout covers the rest. d->fencing_token (for the lock d->lock) lets your
 * database refuse stale work: idemproxy_inbox.h, a separate library, does that
 * in your PostgreSQL transaction (docs/database.md).
 *
 * Deadline: d->deadline_unix_ms is the delivery's ack deadline. An answer after
 * it is ignored and the entry is delivered again (attempt + 1), so a handler
 * should finish well inside it. idemproxy paces deliveries per worker, so the
 * ack timer measures the handler's own work, not a queue in front of it. A
 * delivery that arrives already past its deadline is answered RETRY by
 * idemproxy_client_recv() ("deadline passed before the handler ran") and never
 * returned: no stale work runs. idemproxy_delivery_remaining_ms(d) is the time
 * left; C cannot stop a handler, so one that may run long should check it and
 * give up (a late answer is ignored, and attempt + 1 may already run elsewhere).
 *
 * Retry later: idemproxy_client_retry_after(c, d, 30000, "rate limited")
 * answers RETRY with Ack.retry_after_ms (protocol 1.1): idemproxy redelivers
 * no earlier than that (at most an hour) instead of its backoff, and the
 * attempt counts toward max_deliveries. d->traceparent and d->tracestate carry
 * the W3C trace context of idemproxy's delivery span (strings only; "" when
 * absent), to parent the handler's span in your tracer.
 *
 * nanomsg re-dials by itself, so a worker may start before idemproxy and
 * survives its restarts. Without a connection for 5 s (the environment
 * variable IDEMPROXY_DIAL_LOG_MS, in ms), idemproxy_client_recv() returns
 * IDEMPROXY_CLIENT_EAGAIN with c->err = ENOTCONN and c->errstr "still dialing
 * <endpoint>: ...", then again every six times as long (30 s) until connected
 * (a receive without a timeout, -1, returns for it too): log it, and a wrong
 * endpoint shows; a peer that sends no SP header within 1 s (nanomsg's
 * fixed handshake timeout; the other clients wait 10 s) is hung up on.
 * Receive limit: a Delivery of up to app.max_entry_bytes (1 MiB by default)
 * is accepted, plus IDEMPROXY_CLIENT_SP_HEADER_BYTES of SP header (nanomsg's
 * NN_RCVMAXSIZE counts those too); a bigger message makes nanomsg drop the
 * connection. If you raise app.max_entry_bytes, call
 * idemproxy_client_set_max_entry_bytes() with the same number.
 *
 * The library never prints or aborts: functions return IDEMPROXY_CLIENT_OK,
 * IDEMPROXY_CLIENT_ERR (with c->err and c->errstr filled, as hiredis does) or
 * IDEMPROXY_CLIENT_EAGAIN. One idemproxy_client belongs to one thread at a time.
 * Known limit: libnanomsg (1.1.5) itself asserts, and so aborts the process,
 * on a malformed frame from the peer (an ipc frame whose type byte is not 1),
 * as the daemon's Known limits say of its own socket: only trusted peers (an
 * idemproxy) may reach the endpoint; keep the ipc socket's directory private.
 */
#ifndef IDEMPROXY_CLIENT_H
#define IDEMPROXY_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#define IDEMPROXY_CLIENT_OK      0
#define IDEMPROXY_CLIENT_ERR    -1
#define IDEMPROXY_CLIENT_EAGAIN -2   /* nothing arrived in time, or a signal interrupted the wait */

#define IDEMPROXY_CLIENT_DEFAULT_ENDPOINT "ipc:///tmp/idemproxy.sock"
/* idemproxy's default app.max_entry_bytes: the largest Delivery it sends. */
#define IDEMPROXY_CLIENT_DEFAULT_MAX_ENTRY_BYTES 1048576
/* Room for the SP header in front of a Delivery: up to 8 backtrace words of 4
 * bytes (NNG's maximum hop count); idemproxy itself sends one. */
#define IDEMPROXY_CLIENT_SP_HEADER_BYTES 32
/* idemproxy caps a retry-after at an hour; idemproxy_client_retry_after() sends no more. */
#define IDEMPROXY_CLIENT_MAX_RETRY_AFTER_MS 3600000u
/* How long idemproxy_client_free() gives the last answer to leave. */
#define IDEMPROXY_CLIENT_LINGER_MS 100

/* The answers a worker can give; the values are idemproxy.v1.Ack.Status. */
typedef enum idemproxy_status {
    IDEMPROXY_STATUS_ACK   = 1,  /* done: idemproxy marks the key done and acks the entry */
    IDEMPROXY_STATUS_RETRY = 2,  /* not now: delivered again later with attempt + 1 */
    IDEMPROXY_STATUS_DROP  = 3   /* never: dead-lettered with the reason */
} idemproxy_status;

/* A connection to idemproxy. Read the fields, never write them. The layouts of
 * these structs are part of the ABI: a change to one bumps the soname. */
typedef struct idemproxy_client {
    int      err;          /* 0, or the errno of the last failure (reset by each receive) */
    char     errstr[512];  /* what the last failure was, for people (512 in soname 1: the endpoint and more) */
    int      sock;         /* the nanomsg NN_REP socket, -1 when none */
    int      pending;      /* 1 while a received delivery awaits its answer */
    uint64_t seq;          /* number of the last delivery received */
    char     endpoint[256];/* what the socket dials */
    int      unconnected_ms; /* receive timeouts in a row with no connection */
    int      rcvmax;       /* NN_RCVMAXSIZE, set again after a redial (-1: no limit) */
    long long last_send_ms; /* CLOCK_MONOTONIC ms of the last answer sent (0: none) */
    /* Appended in 0.1 (the library allocates the struct: older programs are unaffected). */
    long long unconnected_since_ms; /* CLOCK_MONOTONIC ms since no connection (0: connected) */
    long long dial_log_next_ms;     /* when "still dialing" is due next */
    int       dial_log_ms;          /* the first after this long (IDEMPROXY_DIAL_LOG_MS, 5000) */
} idemproxy_client;

/* One stream field: a UTF-8 name and a binary value (not NUL-terminated). */
typedef struct idemproxy_field {
    const char    *name;
    const uint8_t *value;
    size_t         value_len;
} idemproxy_field;

/* One delivery. Every pointer points into memory the delivery owns: all of it
 * stays valid until idemproxy_delivery_free(), independently of the client.
 * The library allocates deliveries, so fields are only ever appended (a program
 * built against an older header keeps working: same soname). */
typedef struct idemproxy_delivery {
    const char     *stream;            /* stream key */
    const char     *entry_id;          /* Redis entry id, "1700000000000-0" */
    const char     *key;               /* the rendered dedup key */
    const idemproxy_field *fields;     /* the entry's fields in stream order, minus the payload */
    size_t          nfields;
    const uint8_t  *payload;           /* the payload field's value, or empty */
    size_t          payload_len;
    uint32_t        attempt;           /* 1 on the first delivery */
    uint64_t        fencing_token;     /* strictly increasing per lock; 0 when fencing is off */
    uint64_t        deadline_unix_ms;  /* an answer after this is too late */
    uint64_t        seq;               /* private: which receive this was */
    void           *msg;               /* private: the unpacked protobuf message */
    const char     *traceparent;       /* W3C trace context of idemproxy's delivery span, or "" */
    const char     *tracestate;        /* W3C tracestate that goes with it, or "" */
    /* Appended in 0.1 (protocol field 11). */
    const char     *lock;              /* the lock fencing_token is for: lock_key's rendered text,
                                          else the key; empty when fencing is off */
} idemproxy_delivery;

/* Creates an NN_REP socket and connects it to 'endpoint' (NULL means
 * IDEMPROXY_CLIENT_DEFAULT_ENDPOINT). Returns NULL only when out of memory;
 * otherwise check c->err (bad endpoint, no sockets left). Free with
 * idemproxy_client_free(). */
idemproxy_client *idemproxy_client_connect(const char *endpoint);

/* Closes the socket and frees 'c'; NULL is fine. Deliveries stay valid.
 * nanomsg 1.1.5 has no linger (nn_close drops what its I/O thread has not
 * written yet), so when an answer was sent less than IDEMPROXY_CLIENT_LINGER_MS
 * ago this first waits out the rest of that time: the last answer leaves. */
void idemproxy_client_free(idemproxy_client *c);

/* Accepts Deliveries of up to 'bytes' (app.max_entry_bytes), or any size when
 * 'bytes' is -1. Returns IDEMPROXY_CLIENT_OK or IDEMPROXY_CLIENT_ERR (EINVAL). */
int idemproxy_client_set_max_entry_bytes(idemproxy_client *c, int bytes);

/* Waits up to 'timeout_ms' (-1: forever) for the next delivery and stores it
 * in '*out', which the caller frees with idemproxy_delivery_free(). Returns
 * IDEMPROXY_CLIENT_OK, IDEMPROXY_CLIENT_EAGAIN on timeout or EINTR, or
 * IDEMPROXY_CLIENT_ERR. A delivery that does not decode (a wrong wire type, a
 * string that is not UTF-8) is answered RETRY here and reported as
 * IDEMPROXY_CLIENT_ERR with c->err EPROTO. A delivery already past its
 * deadline is answered RETRY here and reported as IDEMPROXY_CLIENT_EAGAIN with
 * c->err ETIMEDOUT and c->errstr saying which entry it was. */
int idemproxy_client_recv(idemproxy_client *c, int timeout_ms,
                          idemproxy_delivery **out);

/* Answers 'd', which must be the last delivery received and not yet answered.
 * 'reason' (NULL for none) is logged by idemproxy and kept in dead letters.
 * The Ack echoes d's stream and entry id, so idemproxy can tell a mix-up. */
int idemproxy_client_reply(idemproxy_client *c, const idemproxy_delivery *d,
                           idemproxy_status status, const char *reason);
int idemproxy_client_ack(idemproxy_client *c, const idemproxy_delivery *d);
int idemproxy_client_retry(idemproxy_client *c, const idemproxy_delivery *d,
                           const char *reason);
int idemproxy_client_drop(idemproxy_client *c, const idemproxy_delivery *d,
                          const char *reason);
/* RETRY, redelivered no earlier than 'ms' from now instead of idemproxy's backoff
 * (more than IDEMPROXY_CLIENT_MAX_RETRY_AFTER_MS is sent as that). */
int idemproxy_client_retry_after(idemproxy_client *c, const idemproxy_delivery *d,
                                 uint32_t ms, const char *reason);

/* Milliseconds left until d's deadline: 0 once it has passed, -1 when it has none. */
long long idemproxy_delivery_remaining_ms(const idemproxy_delivery *d);

/* Frees a delivery from idemproxy_client_recv(); NULL is fine. */
void idemproxy_delivery_free(idemproxy_delivery *d);

#endif
