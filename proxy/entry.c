/*
 * entry.c - an entry's memory (made from its stream reply, freed once its
 * replies are in), the queues it waits in, its state changes, checked against
 * the table of legal transitions (debug and sanitizer builds), and log lines
 * about an entry.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "proxy.h"
#include "reply.h"
#include "trace.h"

/* --- the entry's states -------------------------------------------------------
 * Every change of an entry's state goes through px_entry_to, which checks it
 * against this table in debug and sanitizer builds. A new entry starts in
 * CLAIM (or goes straight to COMMIT, XACK or GONE as bad input). GONE is
 * where an entry goes, never a state it is in: px_entry_to(e, PX_E_GONE)
 * marks it 'gone' and leaves 'state' as it was (px_entry_finish reads it).
 *
 *   from      to        event                                          who
 *   CLAIM     CLAIM     queued again (a new entry, a re-look)           proxy.c
 *   CLAIM     SEND      claimed: every lock held, not done              claim.c -> proxy.c
 *   CLAIM     PARKED    busy (dedup lock, or lock_key past wait_ms with
 *                       on_busy: retry), or the claim failed            proxy.c
 *   CLAIM     LOCKWAIT  lock_key busy, within wait_ms                   proxy.c
 *   CLAIM     COMMIT    refused (on_busy: dead_letter), max_deliveries
 *                       reached at claim, a Redis error that stays,
 *                       bad input                                       proxy.c
 *   CLAIM     XACK      duplicate, skipped, dead-lettered already       proxy.c
 *   CLAIM     GONE      the same, group-less; released while draining   proxy.c
 *   PARKED    CLAIM     its timer, or its local holder let go           proxy.c
 *   PARKED    GONE      released while draining                         proxy.c
 *   LOCKWAIT  CLAIM     its timer: lock_key tried again                 proxy.c
 *   LOCKWAIT  GONE      released while draining                         proxy.c
 *   SEND      SENT      sent to a worker (its ack timer starts)         deliver.c
 *   SEND      CLAIM     its lease, no longer known held, found lost by
 *                       an extension before it was sent: claimed again  deliver.c -> proxy.c
 *   SEND      GONE      released while draining                         proxy.c
 *   SENT      COMMIT    ACK; DROP; RETRY or timeout at max_deliveries   deliver.c -> proxy.c
 *   SENT      BACKOFF   RETRY, invalid reply or timeout: locks released proxy.c
 *   SENT      GONE      unanswered when the drain's grace ends          proxy.c
 *   BACKOFF   CLAIM     its timer                                       proxy.c
 *   BACKOFF   GONE      released while draining                         proxy.c
 *   COMMIT    COMMIT    written again after an error                    proxy.c
 *   COMMIT    XACK      written (group mode)                            proxy.c
 *   COMMIT    GONE      written (group-less)                            proxy.c
 *   XACK      XACK      XACK sent again after an error                  proxy.c
 *   XACK      GONE      XACKed                                          commit.c -> proxy.c
 */
#define T(from, to) [PX_E_##from][PX_E_##to] = true
static const bool legal[PX_E_GONE + 1][PX_E_GONE + 1] = {
    T(CLAIM, CLAIM),
    T(CLAIM, SEND),
    T(CLAIM, PARKED),
    T(CLAIM, LOCKWAIT),
    T(CLAIM, COMMIT),
    T(CLAIM, XACK),
    T(CLAIM, GONE),
    T(PARKED, CLAIM),
    T(PARKED, GONE),
    T(LOCKWAIT, CLAIM),
    T(LOCKWAIT, GONE),
    T(SEND, SENT),
    T(SEND, CLAIM),
    T(SEND, GONE),
    T(SENT, COMMIT),
    T(SENT, BACKOFF),
    T(SENT, GONE),
    T(BACKOFF, CLAIM),
    T(BACKOFF, GONE),
    T(COMMIT, COMMIT),
    T(COMMIT, XACK),
    T(COMMIT, GONE),
    T(XACK, XACK),
    T(XACK, GONE),
};
#undef T

void px_entry_to(px_entry *e, px_entry_state next)
{
    PX_ASSERT(!e->gone);
    PX_ASSERT(legal[e->state][next]);
    (void)legal;
    if (next == PX_E_GONE) {
        e->gone = true; /* 'state' stays the last one */
        return;
    }
    /* Sent only while it holds its dedup lock (claim.c's send rule). */
    if (next == PX_E_SENT) PX_ENSURE(e->claim.has_dedup);
    e->state = next;
}

/* --- queues ------------------------------------------------------------------ */

/* An entry waits in one queue at a time (its 'qnext' is the only link). */
void px_queue_push(px_queue *q, px_entry *e)
{
    PX_ENSURE(!e->queued);
    e->queued = true;
    e->qnext = NULL;
    if (q->tail) q->tail->qnext = e;
    else q->head = e;
    q->tail = e;
    q->n++;
}

px_entry *px_queue_pop(px_queue *q)
{
    px_entry *e = q->head;
    if (e == NULL) return NULL;
    q->head = e->qnext;
    if (q->head == NULL) q->tail = NULL;
    q->n--;
    e->qnext = NULL;
    e->queued = false;
    return e;
}

/* --- an entry's memory ------------------------------------------------------------ */

px_entry *px_entry_create(px_stream *st, const char *id, redisReply *fields, size_t *page_bytes)
{
    px_stream_conf *sc = st->conf;
    /* More field names and values than any deliverable entry has (reply.c
     * elided the array): its size is at least its count. */
    size_t toomany = fields->type == PX_REPLY_ELIDED ? fields->len : 0;
    size_t nf = toomany ? 0 : fields->elements / 2, bytes = toomany, idlen = strlen(id);
    for (size_t i = 0; i < nf * 2; i++) bytes += fields->element[i]->len + 1;
    *page_bytes += bytes;
    /* Over max_entry_bytes: bad input whose dead letter is a reference, so
     * its bytes are never copied (the link may not even hold them: reply.c
     * elides the strings of an entry past max_entry_bytes). */
    size_t fbytes = toomany ? toomany : bytes - nf * 2;
    bool oversized = toomany || (long long)fbytes > st->px->conf->max_entry_bytes;
    if (oversized) nf = bytes = 0;
    /* One block: the entry, then its fields, then the bytes they point to. */
    px_entry *e = px_malloc(sizeof(*e) + nf * sizeof(px_field) + idlen + 1 + bytes);
    memset(e, 0, sizeof(*e));
    e->st = st;
    e->payload_idx = -1;
    e->fields = (px_field *)(e + 1);
    e->blob = (char *)(e->fields + nf);
    e->nfields = nf;
    char *p = e->blob;
    memcpy(p, id, idlen + 1);
    e->id = p;
    p += idlen + 1;
    for (size_t i = 0; i < nf; i++) {
        redisReply *k = fields->element[2 * i], *v = fields->element[2 * i + 1];
        e->fields[i].name = p;
        e->fields[i].name_len = k->len;
        memcpy(p, k->str ? k->str : "", k->len);
        p[k->len] = '\0';
        p += k->len + 1;
        e->fields[i].value = p;
        e->fields[i].value_len = v->len;
        memcpy(p, v->str ? v->str : "", v->len);
        p[v->len] = '\0';
        p += v->len + 1;
        e->bytes += k->len + v->len;
        if (sc->payload_field && e->payload_idx < 0 && strcmp(e->fields[i].name, sc->payload_field) == 0)
            e->payload_idx = (int)i;
    }
    if (oversized) {
        e->bytes = fbytes;
        e->oversized = true; /* its verdict: px_proxy_read */
        e->wide = toomany > 0;
    }
    px_proxy_read(e);
    return e;
}

/* Freed only with no reply about it to come and in no queue: a reply or a
 * flush would find freed memory. */
void px_entry_free(px_entry *e)
{
    PX_ENSURE(e->step.io == 0);
    PX_ENSURE(!e->queued);
    if (e->trace) px_trace_entry_free(e);
    free(e->key);
    free(e->lock_key);
    free(e->reason);
    free(e->step.redis_error);
    free(e); /* and its fields and blob, in the same block */
}

/* --- lines about an entry ---------------------------------------------------------- */

static px_log_about entry_about(const px_entry *e)
{
    return (px_log_about){ e->st->conf->stream, e->id, e->key, e->delivery.attempt };
}

void px_log_entry(px_log_level level, const px_entry *e, const char *fmt, ...)
{
    if (!px_log_enabled(level)) return;
    px_log_about a = entry_about(e);
    va_list ap;
    va_start(ap, fmt);
    px_log_about_v(level, NULL, 0, &a, fmt, ap);
    va_end(ap);
}

void px_log_entry_limited(px_log_limit *l, double every_s, px_log_level level, const px_entry *e,
                          const char *fmt, ...)
{
    if (!px_log_enabled(level)) return;
    px_log_about a = entry_about(e);
    va_list ap;
    va_start(ap, fmt);
    px_log_about_v(level, l, every_s, &a, fmt, ap);
    va_end(ap);
}
