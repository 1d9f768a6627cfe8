/*
 * proxy.c - moves entries through their life (see proxy.h) and owns the
 * policies: backpressure (max_inflight), busy handling (wait_ms, on_busy),
 * retries with exponential backoff, max_deliveries, bad input
 * (on_missing_key), and the SIGTERM drain.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "claim.h"
#include "commit.h"
#include "decide.h"
#include "deliver.h"
#include "event.h"
#include "hooks.h"
#include "log.h"
#include "metrics.h"
#include "reader.h"
#include "reply.h"
#include "trace.h"

#define PX_ERROR_PAUSE_MS 200

/* --- timers on an entry ---------------------------------------------------------- */

static void entry_timer(px_entry *e, void (*cb)(struct ev_loop *, ev_timer *, int), double ms)
{
    struct ev_loop *loop = e->st->px->loop;
    ev_timer_stop(loop, &e->timer);
    ev_init(&e->timer, cb);
    ev_timer_set(&e->timer, ms / 1000.0, 0.);
    e->timer.data = e;
    ev_timer_start(loop, &e->timer);
}

static double jitter(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(random() % 1000) / 1000.0);
}

static void wait_out_end(px_entry *e)
{
    if (!e->park.waiting_out) return;
    e->park.waiting_out = false;
    e->st->waiting_out--;
    e->st->px->waiting_out--;
}

static void drop_taken(px_entry *e);

static void drop_taken_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    drop_taken(w->data);
}

static void to_claim(px_entry *e)
{
    if (e->delivery.taken) {
        /* Another consumer has it now (px_proxy_taken_over): let go on the
         * next loop turn, not under a caller that walks the stream's list
         * (wake_followers), whose next entry this would free. */
        entry_timer(e, drop_taken_cb, 0);
        return;
    }
    wait_out_end(e);
    if (e->park.claim_since == 0) e->park.claim_since = ev_now(e->st->px->loop);
    px_entry_to(e, PX_E_CLAIM);
    px_queue_push(&e->st->px->claim_q, e);
}

/* 'e' waits undelivered (PARKED, LOCKWAIT): the delivery the read that
 * brought it counted is not charged (reader.c). */
static void wait_undelivered(px_entry *e, px_entry_state next)
{
    px_entry_to(e, next);
    px_reader_waiting(e);
}

static void back_to_claim_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    to_claim(w->data);
}

static void lock_key_again_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_entry *e = w->data;
    px_entry_to(e, PX_E_CLAIM);
    px_claim_lock_key(e);
}

/* --- entries ----------------------------------------------------------------------- */

/* A new entry, built by px_entry_create (entry.c): tracked, counted as read,
 * and given its verdict: bad input, or on to its claim. */
void px_proxy_read(px_entry *e)
{
    px_stream *st = e->st;
    /* Track it: the stream's list and the global count (backpressure). */
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    st->tracked++;
    st->px->tracked++;
    st->c.entries_read++;
    if (st->px->trace) px_trace_entry_begin(st->px->trace, e);

    char why[512];
    if (e->wide) {
        snprintf(why, sizeof(why), "entry has %zu field names and values, more than max_entry_bytes %lld allows",
                 e->bytes, st->px->conf->max_entry_bytes);
        px_proxy_bad_entry(e, why);
        return;
    }
    if (e->oversized) {
        snprintf(why, sizeof(why), "entry is %zu bytes, over max_entry_bytes %lld", e->bytes,
                 st->px->conf->max_entry_bytes);
        px_proxy_bad_entry(e, why);
        return;
    }
    if (px_event_prepare(e, st->conf, st->px->conf->max_entry_bytes, why, sizeof(why)) != PX_OK) {
        e->oversized = (long long)e->bytes > st->px->conf->max_entry_bytes;
        px_proxy_bad_entry(e, why);
        return;
    }
    size_t size = px_deliver_size(st->px, e);
    if ((long long)size > st->px->conf->max_entry_bytes) {
        snprintf(why, sizeof(why), "its Delivery encodes to %zu bytes, over max_entry_bytes %lld",
                 size, st->px->conf->max_entry_bytes);
        e->oversized = true;
        px_proxy_bad_entry(e, why);
        return;
    }
    px_log_entry(PX_LOG_DEBUG, e, "read");
    to_claim(e);
}

/* The entry of this instance working on 'e's key (claiming, delivered, being
 * committed), if any: a copy waiting on it is woken when it leaves or lets
 * go, rather than after a whole lease. */
static px_entry *local_holder(px_entry *e)
{
    for (px_entry *h = e->st->head; h; h = h->next)
        if (h != e && h->state != PX_E_PARKED && h->key && strcmp(h->key, e->key) == 0) return h;
    return NULL;
}

/* 'e' gives up its dedup lock (done, released or gone): copies parked behind
 * it look again at once. */
static void wake_followers(px_entry *e)
{
    if (!e->park.has_followers) return;
    e->park.has_followers = false;
    /* Draining: the copies are released and freed too, not claimed again
     * (waking one queued an entry the drain was about to free). */
    if (e->st->px->stopping) return;
    for (px_entry *f = e->st->head; f; f = f->next)
        if (f != e && f->state == PX_E_PARKED && f->key && strcmp(f->key, e->key) == 0) {
            ev_timer_stop(e->st->px->loop, &f->timer);
            to_claim(f);
        }
}

void px_entry_finish(px_entry *e, px_outcome outcome)
{
    px_stream *st = e->st;
    px_entry_to(e, PX_E_GONE);
    if (e->trace) px_trace_entry_end(st->px->trace, e, outcome);
    wake_followers(e);
    switch (outcome) {
    case PX_OUT_ACKED: st->c.acked++; break;
    case PX_OUT_DUPLICATE: st->c.duplicate++; break;
    case PX_OUT_DEAD_LETTERED: st->c.dead_lettered++; break;
    case PX_OUT_SKIPPED: st->c.skipped++; break;
    case PX_OUT_NONE: break; /* released at shutdown: still pending in Redis */
    }
    ev_timer_stop(st->px->loop, &e->timer);
    wait_out_end(e);
    if (e->state == PX_E_XACK) {
        st->leaving--;
        st->px->leaving--;
    }
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    st->tracked--;
    st->px->tracked--;
    if (e->step.io == 0) px_entry_free(e);
}

px_entry *px_proxy_find(px_stream *st, const char *id)
{
    /* Linear: only XAUTOCLAIM and history replays ask, a batch at a time. */
    for (px_entry *e = st->head; e; e = e->next)
        if (strcmp(e->id, id) == 0) return e;
    return NULL;
}

/* max_inflight bounds the entries being claimed, with a worker or being
 * written (docs/configuration.md: claimed entries not yet committed). Two kinds
 * of tracked entry are not in it: copies parked behind another holder's lock
 * (for up to a lease), or a few busy keys across instances would stall reading;
 * and entries already committed (or found to be copies) that only await their
 * XACK, or that last round trip would hold up the next read. Together they
 * are bounded apart, to PX_WAITING_OUT_MAX times max_inflight. */
#define PX_WAITING_OUT_MAX 4

size_t px_proxy_room(px_proxy *px)
{
    size_t max = (size_t)px->conf->max_inflight, cap = max * (1 + PX_WAITING_OUT_MAX);
    size_t active = px->tracked - px->waiting_out - px->leaving;
    if (active >= max || px->tracked >= cap) return 0;
    return max - active < cap - px->tracked ? max - active : cap - px->tracked;
}

/* The room of one stream: px_proxy_room, less what the other streams are
 * still owed of their reserve (px_decide_reserve) for their next reads. A
 * stream whose worker never answers holds at most max_inflight minus the
 * others' reserves, and the others keep being read (issue 37). */
size_t px_proxy_room_for(px_stream *st)
{
    px_proxy *px = st->px;
    size_t room = px_proxy_room(px);
    size_t reserve = px_decide_reserve((size_t)px->conf->max_inflight, px->nstreams), owed = 0;
    for (size_t s = 0; s < px->nstreams && reserve; s++) {
        px_stream *o = &px->streams[s];
        size_t active = o->tracked - o->waiting_out - o->leaving;
        if (o != st && active < reserve) owed += reserve - active;
    }
    return room > owed ? room - owed : 0;
}

/* The entry leaves: XACK first in group mode, then it is gone. Its key's
 * state in Redis is final now (done, or its locks released), so copies parked
 * behind it look again now, not after the XACK, which may wait for a ride
 * (claim.c). */
static void leave(px_entry *e, px_outcome outcome)
{
    wake_followers(e);
    e->outcome = outcome;
    if (e->st->conf->group) {
        px_entry_to(e, PX_E_XACK);
        e->st->leaving++;
        e->st->px->leaving++;
        px_queue_push(&e->st->px->xack_q, e);
    } else {
        px_entry_finish(e, outcome);
    }
}

static void commit(px_entry *e, px_outcome outcome, bool mark_done, const char *reason)
{
    e->outcome = outcome;
    e->mark_done = mark_done;
    if (reason) {
        free(e->reason);
        e->reason = px_strdup(reason);
    }
    px_entry_to(e, PX_E_COMMIT);
    px_queue_push(&e->st->px->commit_q, e);
}

/* --- claim outcomes (from claim.c) ---------------------------------------------- */

void px_proxy_claimed(px_entry *e)
{
    px_stream_conf *sc = e->st->conf;
    e->park.wait_until_ms = 0;
    if (e->delivery.taken) { /* taken over while its claim was out */
        drop_taken(e);
        return;
    }
    if ((long long)e->delivery.attempt >= sc->max_deliveries) {
        /* Delivered that often already (Redis' delivery count, across restarts
         * and consumers): a poison entry. No one delivers it again. */
        char why[128];
        snprintf(why, sizeof(why), "max_deliveries (%d) reached: delivery count %u",
                 sc->max_deliveries, e->delivery.attempt);
        px_log_entry(PX_LOG_WARN, e, "%s", why);
        commit(e, PX_OUT_DEAD_LETTERED, true, why);
        return;
    }
    px_metrics_observe(px_lock_wait_bounds, &e->st->lock_wait, ev_now(e->st->px->loop) - e->park.claim_since);
    e->park.claim_since = 0;
    if (e->st->px->stopping) { /* claimed while draining: give it back at once */
        px_claim_release(e);
        px_entry_finish(e, PX_OUT_NONE);
        return;
    }
    px_entry_to(e, PX_E_SEND);
    px_queue_push(&e->st->px->send_q, e);
}

/* A copy met its key's done mark with another fingerprint (docs/guarantee.md):
 * never delivered, no done mark of its own; dead-lettered with both
 * fingerprints in the reason (idemproxy's own four fields stay last: ops.c
 * reads them by position), or with on_conflict: skip counted and logged, a
 * duplicate. */
static void conflict(px_entry *e)
{
    static px_log_limit limit;
    char mine[17], theirs[17], why[96];
    px_hash64_hex(e->fp, mine);
    px_hash64_hex(e->claim.found.fp, theirs);
    snprintf(why, sizeof(why), "conflict: fingerprint %s differs from the done mark's %s", mine,
             theirs);
    e->st->c.conflicts++;
    bool skip = e->st->conf->on_conflict == PX_CONFLICT_SKIP;
    px_log_entry_limited(&limit, 1.0, PX_LOG_WARN, e, "%s; %s", why,
                         skip ? "skipped (on_conflict: skip)" : "dead-lettered");
    if (skip) leave(e, PX_OUT_DUPLICATE);
    else commit(e, PX_OUT_DEAD_LETTERED, false, why);
}

void px_proxy_duplicate(px_entry *e, bool after_lock)
{
    const px_done_mark *m = &e->claim.found;
    if (m->has_ms) { /* the mark's writer's clock: a skew ahead reads as 0 */
        uint64_t now = px_now_ms();
        px_metrics_observe(px_dup_age_bounds, &e->st->dup_age,
                           now > m->ms ? (double)(now - m->ms) / 1000.0 : 0.0);
    }
    if (px_decide_conflict(&e->claim.found, e->has_fp, e->fp)) {
        conflict(e);
        return;
    }
    if (after_lock) e->st->c.dup_after_lock++;
    else e->st->c.dup_before_lock++;
    px_log_entry(PX_LOG_DEBUG, e, "duplicate (%s)", after_lock ? "after_lock" : "before_lock");
    leave(e, PX_OUT_DUPLICATE);
}

void px_proxy_busy(px_entry *e, bool lock_key_busy)
{
    px_stream_conf *sc = e->st->conf;
    uint64_t now = px_now_ms();
    e->st->c.lock_busy++;
    if (e->st->px->stopping) {
        px_claim_release(e);
        px_entry_finish(e, PX_OUT_NONE);
        return;
    }
    if (e->park.wait_until_ms == 0) e->park.wait_until_ms = now + (uint64_t)sc->wait_ms;
    switch (px_decide_busy(now, e->park.wait_until_ms, lock_key_busy, sc->on_busy)) {
    case PX_BUSY_WAIT:
        /* Within wait_ms: look again in 10-50 ms, on the loop, never blocking. */
        wait_undelivered(e, lock_key_busy ? PX_E_LOCKWAIT : PX_E_PARKED);
        entry_timer(e, lock_key_busy ? lock_key_again_cb : back_to_claim_cb, jitter(10, 50));
        return;
    case PX_BUSY_REFUSE:
        /* Refused at once, as the write-ups' services answer 409: dead-lettered, not done. */
        e->park.wait_until_ms = 0;
        px_log_entry(PX_LOG_INFO, e, "busy: lock %s held elsewhere; dead-lettered", e->lock_key);
        commit(e, PX_OUT_DEAD_LETTERED, false, "busy");
        return;
    case PX_BUSY_PARK: {
        /* Look again until the holder's lease could have ended; never lost. A
         * local holder wakes its copies when it leaves; a holder elsewhere
         * (another instance) usually finishes in a few ms, so the copy looks
         * again after 20 ms, doubling up to lease_ms: a few SETs instead of a
         * whole lease of waiting. */
        e->park.wait_until_ms = 0;
        px_claim_release(e);
        wait_undelivered(e, PX_E_PARKED);
        px_entry *h = lock_key_busy ? NULL : local_holder(e);
        if (h) h->park.has_followers = true; /* woken when h leaves; the timer is a fallback */
        double ms = (double)sc->lease_ms;
        if (h == NULL && !lock_key_busy && e->park.busy_looks < 16 &&
            (double)(20u << e->park.busy_looks) < ms)
            ms = (double)(20u << e->park.busy_looks);
        e->park.busy_looks++;
        px_log_entry(PX_LOG_DEBUG, e, "busy: looking again in %.0f ms", ms);
        if (!e->park.waiting_out) {
            e->park.waiting_out = true;
            e->st->waiting_out++;
            e->st->px->waiting_out++;
        }
        entry_timer(e, back_to_claim_cb, ms + jitter(0, ms < 100 ? 10 : 50));
        return;
    }
    }
}

/* The pause before trying again after the entry's n-th error that does not
 * pass: 200 ms, doubling, at most 30 s. */
static double error_pause_ms(unsigned n)
{
    double ms = PX_ERROR_PAUSE_MS * (double)(1u << (n < 8 ? n : 8));
    return ms < 30000 ? ms : 30000;
}

void px_proxy_claim_failed(px_entry *e)
{
    if (e->st->px->stopping) {
        px_claim_release(e);
        px_entry_finish(e, PX_OUT_NONE);
        return;
    }
    double ms = PX_ERROR_PAUSE_MS;
    if (e->step.hard) {
        /* An error that retrying does not cure (WRONGTYPE on a rendered key,
         * NOPERM): a few tries with backoff, then the dead letter with the
         * error as its reason, not marked done, so it never holds a slot of
         * max_inflight for ever (docs/guarantee.md). */
        static px_log_limit limit;
        e->step.redis_errors++;
        px_log_entry_limited(&limit, 1.0, PX_LOG_WARN, e, "%s (try %u of %d)", e->step.redis_error,
                             e->step.redis_errors, PX_MAX_REDIS_ERRORS);
        if (e->step.redis_errors >= PX_MAX_REDIS_ERRORS) {
            char why[300];
            snprintf(why, sizeof(why), "redis error: %s", e->step.redis_error);
            px_claim_release(e);
            commit(e, PX_OUT_DEAD_LETTERED, false, why);
            return;
        }
        ms = error_pause_ms(e->step.redis_errors);
    }
    /* Redis is down or refused: try again shortly (the flush waits for the link). */
    wait_undelivered(e, PX_E_PARKED);
    entry_timer(e, back_to_claim_cb, ms);
}

/* Another reader (or we, before a restart; in a group, the instance that took
 * it over while we stalled) dead-lettered this entry for good (a busy
 * refusal); it is never delivered. */
void px_proxy_already_dead(px_entry *e)
{
    px_log_entry(PX_LOG_DEBUG, e, "dead-lettered already");
    leave(e, PX_OUT_DEAD_LETTERED);
}

/* Its lease ran out while it waited for the socket (found by an extension
 * after a Redis outage longer than lease_ms): another holder may have the key
 * now, with a higher fencing token, and may have finished it. It is not
 * delivered on the old lock: it gives back what may still be its own and is
 * claimed afresh, with a new token (chaos seed 492 delivered it with a token
 * lower than the one a second instance had used meanwhile). */
void px_proxy_reclaim_unsent(px_entry *e)
{
    px_log_entry(PX_LOG_INFO, e, "lease lost before delivery; claiming again");
    px_claim_release(e);
    e->claim.has_dedup = false;
    e->claim.has_lock = false;
    to_claim(e);
}

/* Its locks given back, it leaves this instance, still pending for the
 * consumer that took it over. */
static void drop_taken(px_entry *e)
{
    px_claim_release(e);
    px_entry_finish(e, PX_OUT_NONE);
}

static void queue_remove(px_queue *q, px_entry *e)
{
    px_queue keep = { 0 };
    px_entry *x;
    while ((x = px_queue_pop(q)) != NULL)
        if (x != e) px_queue_push(&keep, x);
    *q = keep;
}

/* Another consumer of the group took 'e' over (our refreshes were lost long
 * enough for its XAUTOCLAIM; reader.c saw it in that consumer's pending
 * list): it is never delivered from here again (docs/guarantee.md). Waiting
 * (parked, for lock_key, in backoff, for a worker's window): dropped now, its
 * locks given back. Being claimed: dropped when the claim is decided (to_claim,
 * px_proxy_claimed). With a worker: the answer still counts (an ACK's done
 * mark, a DROP's or the last attempt's dead letter, each then XACKed: an XACK
 * after the done mark or dead letter finishes the entry for the whole group,
 * and the new owner finds the key done), but a RETRY or a timeout is left to
 * the new owner, which counts it. Being finished: as it was. */
void px_proxy_taken_over(px_entry *e)
{
    if (e->delivery.taken) return;
    e->delivery.taken = true;
    px_log_entry(PX_LOG_INFO, e, "taken over by another consumer; not delivered from here");
    if (e->state == PX_E_SEND) queue_remove(&e->st->px->send_q, e);
    if (e->state == PX_E_SEND || e->state == PX_E_PARKED || e->state == PX_E_LOCKWAIT ||
        e->state == PX_E_BACKOFF)
        drop_taken(e);
}

/* --- answers from workers (from deliver.c) -------------------------------------------- */

static void backoff_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_entry *e = w->data;
    e->claim.examined = true;
    to_claim(e);
}

void px_proxy_on_answer(px_entry *e, px_ack_status status, const char *reason)
{
    px_stream *st = e->st;
    px_stream_conf *sc = st->conf;
    px_metrics_observe(px_ack_latency_bounds, &st->ack_latency, ev_now(st->px->loop) - e->delivery.sent_at);
    if (e->trace) px_trace_delivery_end(st->px->trace, e, status);
    switch (status) {
    case PX_ACK_ACK: st->c.acks_ack++; break;
    case PX_ACK_RETRY: st->c.acks_retry++; break;
    case PX_ACK_DROP: st->c.acks_drop++; break;
    case PX_ACK_TIMEOUT: st->c.acks_timeout++; break;
    case PX_ACK_INVALID: st->c.acks_invalid++; break;
    }
    switch (px_decide_answer(status, e->delivery.attempt, sc->max_deliveries)) {
    case PX_NEXT_COMMIT_DONE:
        commit(e, PX_OUT_ACKED, true, NULL);
        return;
    case PX_NEXT_DEAD_LETTER_DONE:
        if (status == PX_ACK_DROP) {
            px_log_entry(PX_LOG_INFO, e, "drop: %s", reason);
            commit(e, PX_OUT_DEAD_LETTERED, true, reason[0] ? reason : "dropped");
        } else {
            char why[600];
            snprintf(why, sizeof(why), "max_deliveries (%d) reached: %s", sc->max_deliveries,
                     reason[0] ? reason : "retry");
            px_log_entry(PX_LOG_WARN, e, "%s", why);
            commit(e, PX_OUT_DEAD_LETTERED, true, why);
        }
        return;
    case PX_NEXT_RETRY:
        break;
    }
    px_claim_release(e);
    wake_followers(e);
    if (st->px->stopping || e->delivery.taken) { /* released, or left to its new owner */
        px_entry_finish(e, PX_OUT_NONE);
        return;
    }
    long long ms = px_decide_retry_ms(px_decide_backoff_ms(sc->retry_backoff_ms, e->delivery.attempt),
                                      status == PX_ACK_RETRY ? e->delivery.retry_after_ms : 0);
    e->delivery.retry_after_ms = 0;
    px_entry_to(e, PX_E_BACKOFF);
    /* The worker's reason, at most once a second: a handler failing every
     * entry must not flood the log (the count of the rest is in the next line
     * and in idemproxy_acks_total). */
    static px_log_limit retry_limit;
    px_log_entry_limited(&retry_limit, 1.0, PX_LOG_INFO, e, "retry in %lld ms: %s", ms,
                         reason[0] ? reason : "no reason given");
    entry_timer(e, backoff_cb, (double)ms);
}

/* --- commits (from commit.c) ---------------------------------------------------------- */

static void commit_again_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_entry *e = w->data;
    px_entry_to(e, PX_E_COMMIT);
    px_queue_push(&e->st->px->commit_q, e);
}

void px_proxy_committed(px_entry *e, bool ok)
{
    if (!ok) {
        /* Kept until written: the app's answer is never forgotten. An error
         * that retrying does not cure is tried again less and less often. */
        double ms = PX_ERROR_PAUSE_MS;
        if (e->step.hard) {
            static px_log_limit limit;
            ms = error_pause_ms(++e->step.redis_errors);
            px_log_entry_limited(&limit, 1.0, PX_LOG_WARN, e,
                                 "writing its outcome failed: %s; again in %.0f ms", e->step.redis_error,
                                 ms);
        }
        entry_timer(e, commit_again_cb, ms);
        return;
    }
    if (e->outcome == PX_OUT_DEAD_LETTERED && !e->claim.dl_other) e->st->c.dead_letters++;
    leave(e, e->outcome);
}

static void xack_again_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_entry *e = w->data;
    px_entry_to(e, PX_E_XACK);
    px_queue_push(&e->st->px->xack_q, e);
}

/* The XACK was refused or lost: sent again after a pause, not every loop
 * iteration (an error reply would otherwise spin the loop). */
void px_proxy_xack_failed(px_entry *e)
{
    entry_timer(e, xack_again_cb, PX_ERROR_PAUSE_MS);
}

void px_proxy_bad_entry(px_entry *e, const char *why)
{
    px_stream_conf *sc = e->st->conf;
    px_log_entry(PX_LOG_WARN, e, "bad entry: %s (%s)", why,
                 sc->on_missing_key == PX_MISSING_SKIP ? "skipped" : "dead-lettered");
    if (sc->on_missing_key == PX_MISSING_SKIP) {
        leave(e, PX_OUT_SKIPPED);
        return;
    }
    e->outcome = PX_OUT_DEAD_LETTERED;
    e->mark_done = false;
    px_entry_to(e, PX_E_COMMIT);
    if (sc->dead_letter == NULL) {
        e->st->c.dead_letters++;
        leave(e, PX_OUT_DEAD_LETTERED);
        return;
    }
    free(e->reason);
    e->reason = px_strdup(why);
    e->bad = true;
    px_queue_push(&e->st->px->commit_q, e);
}

/* A pending entry deleted from the stream: counted and acked away ('ack' is
 * false when XAUTOCLAIM already removed it from the pending list). */
void px_proxy_trimmed(px_stream *st, const char *id, bool ack)
{
    st->c.trimmed++;
    px_log_info("stream %s: pending entry %s was trimmed or deleted; acked away", st->conf->stream, id);
    if (ack) {
        const char *argv[] = { "XACK", st->conf->stream, st->conf->group, id };
        px_redis_strv(st->px->redis, st->conf->stream, NULL, NULL, 4, argv);
    }
}

/* --- the loop ------------------------------------------------------------------------ */

static bool drained(px_proxy *px)
{
    for (size_t s = 0; s < px->nstreams; s++)
        if (px->streams[s].tracked) return false;
    return px_redis_pending(px->redis) == 0;
}

/* Once per loop iteration: pipeline whatever each step has queued. */
static void flush_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)revents;
    px_proxy *px = w->data;
    /* With claims to write, the done marks go first in the write (they ride
     * with the claims: px_commit_flush): a copy in the page then meets its key
     * done, not its original's lock (counted busy, parked, claimed again). */
    bool claims = px->claim_q.n > 0;
    size_t carriers = claims ? px_commit_flush(px, true) : 0;
    carriers += px_claim_flush(px);
    if (!claims) carriers += px_commit_flush(px, false);
    px_commit_xack_flush(px, carriers > 0);
    px_deliver_flush(px);
    for (size_t s = 0; s < px->nstreams; s++) px_reader_kick(&px->streams[s]);
    if (px->stopping && drained(px)) ev_break(loop, EVBREAK_ALL);
}

/* The loop's busy time per iteration (idemproxy_loop_busy_seconds, issue 18):
 * from its return from epoll_wait (a check watcher of the highest priority,
 * so before any callback) to the last prepare watcher before it waits again
 * (the lowest priority: after flush_cb and the links' writes). What stalls
 * the loop (a scan, a long flush, a burst of timers) shows in the tail. Two
 * clock_gettime per iteration (vDSO, no system call); ev_now is the wall
 * clock, which may step. */
static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void woke_cb(struct ev_loop *loop, ev_check *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    px->woke_at = mono_now();
}

static void sleeps_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    if (px->woke_at > 0) px_metrics_observe(px_loop_busy_bounds, &px->loop_busy, mono_now() - px->woke_at);
}

static void lease_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_claim_extend(w->data);
}

/* Entries the drain gives back: not delivered yet (or, once the grace is
 * over, 'all' of those with a worker too), and no claim in flight. */
static bool undelivered(const px_entry *e, bool all)
{
    switch (e->state) {
    case PX_E_PARKED:
    case PX_E_LOCKWAIT:
    case PX_E_BACKOFF:
    case PX_E_SEND: return true;
    case PX_E_CLAIM: return !e->claim.in_io;
    case PX_E_SENT: return all;
    default: return false;
    }
}

/* Give back what was not delivered, so another instance can take it at once.
 * The queues are rebuilt without those entries first: the entries are freed
 * as they finish, and a queue must never name a freed entry. */
static void release_undelivered(px_proxy *px, bool all)
{
    px_queue *qs[] = { &px->claim_q, &px->send_q };
    for (size_t i = 0; i < 2; i++) {
        px_queue keep = { 0 };
        px_entry *e;
        while ((e = px_queue_pop(qs[i])) != NULL)
            if (!undelivered(e, all)) px_queue_push(&keep, e);
        *qs[i] = keep;
    }
    for (size_t s = 0; s < px->nstreams; s++) {
        px_entry *e = px->streams[s].head, *next;
        for (; e; e = next) {
            next = e->next;
            if (!undelivered(e, all)) continue;
            if (e->state == PX_E_SENT) px_deliver_forget(px, e);
            px_claim_release(e);
            px_entry_finish(e, PX_OUT_NONE);
        }
    }
}

static void final_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    px_log_warn("shutdown: Redis did not confirm every write in time");
    ev_break(loop, EVBREAK_ALL);
}

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    px_log_warn("shutdown grace over: releasing deliveries still unanswered");
    release_undelivered(px, true);
    /* What is left (commits and acks being written) gets one more timeout. */
    ev_timer_init(w, final_cb, (double)px->conf->timeout_ms / 1000.0, 0.);
    ev_timer_start(loop, w);
}

static void signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)revents;
    px_proxy *px = w->data;
    if (px->stopping) return;
    px_log_info("signal %d: draining (up to %lld ms)", w->signum, px->conf->shutdown_grace_ms);
    px->stopping = true;
    for (size_t s = 0; s < px->nstreams; s++) {
        px_reader_stop(&px->streams[s]);
        ev_timer_stop(loop, &px->streams[s].lease);
        ev_timer_start(loop, &px->streams[s].lease);
    }
    release_undelivered(px, false);
    ev_timer_init(&px->grace, grace_cb, (double)px->conf->shutdown_grace_ms / 1000.0, 0.);
    px->grace.data = px;
    ev_timer_start(loop, &px->grace);
}

static void command_link_cb(px_redis *r, bool up, void *udata)
{
    (void)r;
    /* While a command is refused (NOPERM) each reconnect would say it again:
     * the refusal's own line is enough. */
    if (px_redis_refused()) px_log_debug("redis: %s", up ? "connected" : "not ready");
    else px_log_info("redis: %s", up ? "ready" : "not ready: not reading until Redis is back");
    /* Before the claims this loop turn flushes: the refresh's answer comes
     * first on the link, so an entry taken over meanwhile is not sent again. */
    px_proxy *px = udata;
    if (up)
        for (size_t s = 0; s < px->nstreams; s++) px_reader_refresh_now(&px->streams[s]);
}

px_proxy *px_proxy_create(struct ev_loop *loop, px_config *conf, const char *password)
{
    px_proxy *px = px_calloc(1, sizeof(*px));
    px->loop = loop;
    px->conf = conf;
    px->password = px_strdup(password);
    px_hooks_init();
    px_claim_init();
    px_reader_init();
    if (px_deliver_init(px) != PX_OK || px_metrics_start(px) != PX_OK) {
        px_proxy_destroy(px);
        return NULL;
    }
    if (conf->otlp_endpoint) px->trace = px_trace_create(loop, conf);
    px_redis_opts o; /* max_array_bytes: XAUTOCLAIM's entries */
    px_config_redis_opts(conf, "commands", px->password, &o);
    px->redis = px_redis_create(loop, &o, command_link_cb, px);

    px->nstreams = conf->nstreams;
    px->streams = px_calloc(conf->nstreams, sizeof(px_stream));
    for (size_t s = 0; s < conf->nstreams; s++) {
        px_stream *st = &px->streams[s];
        st->px = px;
        st->conf = &conf->streams[s];
        st->index = s;
        snprintf(st->lease_s, sizeof(st->lease_s), "%lld", st->conf->lease_ms);
        snprintf(st->ttl_s, sizeof(st->ttl_s), "%lld", st->conf->done_ttl_ms);
        /* Leases are extended every lease_ms / 3 each, not all at once: a
         * timer ticks PX_LEASE_TICKS times in that time and extends the due
         * ones, at most lease_budget a tick. The budget is 4 x the average
         * need even if every slot of max_inflight is held, so a backlog (all
         * due at once) drains within a quarter of lease_every: an extension
         * goes out at most (1 + 1/4 + 1/16) / 3 < 0.44 of the lease after the
         * last, and lands within timeout_ms <= lease_ms / 2 (config.c) of
         * that, before the lease ends. */
        st->lease_every = (double)st->conf->lease_ms / 3000.0;
        st->lease_budget = (4 * (size_t)conf->max_inflight + PX_LEASE_TICKS - 1) / PX_LEASE_TICKS;
        if (st->lease_budget < 64) st->lease_budget = 64;
        double tick = st->lease_every / PX_LEASE_TICKS;
        ev_timer_init(&st->lease, lease_cb, tick, tick);
        st->lease.data = st;
        ev_timer_start(loop, &st->lease);
        px_reader_start(st);
    }
    /* Every link has its own copy now, for its reconnects: this one would
     * only keep a password a rotated Secret has replaced. */
    px_free_secret(px->password);
    px->password = NULL;
    ev_init(&px->xack_wait, px_commit_xack_wait_cb);
    px->xack_wait.data = px;
    ev_init(&px->commit_wait, px_commit_wait_cb);
    px->commit_wait.data = px;
    ev_prepare_init(&px->flush, flush_cb);
    px->flush.data = px;
    ev_prepare_start(loop, &px->flush);
    ev_check_init(&px->woke, woke_cb);
    px->woke.data = px;
    ev_set_priority(&px->woke, EV_MAXPRI);
    ev_check_start(loop, &px->woke);
    ev_prepare_init(&px->sleeps, sleeps_cb);
    px->sleeps.data = px;
    ev_set_priority(&px->sleeps, EV_MINPRI); /* the links' writes are EV_MINPRI + 1 */
    ev_prepare_start(loop, &px->sleeps);
    ev_signal_init(&px->sigterm, signal_cb, SIGTERM);
    px->sigterm.data = px;
    ev_signal_start(loop, &px->sigterm);
    ev_signal_init(&px->sigint, signal_cb, SIGINT);
    px->sigint.data = px;
    ev_signal_start(loop, &px->sigint);
    return px;
}

void px_proxy_destroy(px_proxy *px)
{
    if (px == NULL) return;
    px->stopping = true; /* finishing entries below wakes and queues nothing */
    /* Nothing is flushed any more: the queues let go of their entries first,
     * as a queue never names a freed entry (px_entry_free checks it). */
    px_queue *qs[] = { &px->claim_q, &px->send_q, &px->commit_q, &px->xack_q };
    for (size_t i = 0; i < 4; i++)
        while (px_queue_pop(qs[i]) != NULL) continue;
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        px_reader_stop(st);
        ev_timer_stop(px->loop, &st->lease);
        while (st->head) {
            px_entry *e = st->head;
            px_entry_finish(e, PX_OUT_NONE);
        }
    }
    ev_prepare_stop(px->loop, &px->flush);
    ev_timer_stop(px->loop, &px->xack_wait);
    ev_timer_stop(px->loop, &px->commit_wait);
    ev_check_stop(px->loop, &px->woke);
    ev_prepare_stop(px->loop, &px->sleeps);
    ev_signal_stop(px->loop, &px->sigterm);
    ev_signal_stop(px->loop, &px->sigint);
    ev_timer_stop(px->loop, &px->grace);
    px_trace_destroy(px->trace);
    px_metrics_stop(px);
    px_redis_destroy(px->redis);
    for (size_t s = 0; s < px->nstreams; s++) px_reader_free(&px->streams[s]);
    px_deliver_deinit(px);
    free(px->streams);
    px_free_secret(px->password);
    free(px);
}
