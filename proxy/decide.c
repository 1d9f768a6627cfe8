/*
 * decide.c - see decide.h. No I/O, no state: every rule of the dedup
 * protocol that can be written as a function of what Redis and the app said.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "decide.h"

#define PX_DECIDE_BACKOFF_CAP_MS 30000

px_lock_reply px_decide_lock_reply(const char *old, size_t oldlen, const char *mine)
{
    if (old == NULL || (oldlen == strlen(mine) && memcmp(old, mine, oldlen) == 0))
        return PX_LOCK_TAKEN;
    if (oldlen > 0 && old[0] == 'D') return PX_LOCK_DONE; /* single layout's done mark */
    return PX_LOCK_BUSY;
}

px_claim_outcome px_decide_claim(px_lock_reply lock, bool done, bool examined)
{
    if (lock == PX_LOCK_DONE || (lock == PX_LOCK_NONE && done))
        return examined ? PX_CLAIM_DUP_AFTER_LOCK : PX_CLAIM_DUP_BEFORE_LOCK;
    if (lock == PX_LOCK_TAKEN)
        return done ? PX_CLAIM_DUP_RELEASE : PX_CLAIM_CLAIMED; /* the double check */
    if (done)
        return PX_CLAIM_DUP_AFTER_LOCK; /* busy, but done by now */
    return PX_CLAIM_BUSY;
}

px_answer_next px_decide_answer(px_ack_status status, uint32_t attempt, int max_deliveries)
{
    if (status == PX_ACK_ACK) return PX_NEXT_COMMIT_DONE;
    if (status == PX_ACK_DROP) return PX_NEXT_DEAD_LETTER_DONE;
    /* RETRY, a bad reply or none: once max_deliveries is reached, no instance delivers it again. */
    if ((long long)attempt >= max_deliveries) return PX_NEXT_DEAD_LETTER_DONE;
    return PX_NEXT_RETRY;
}

long long px_decide_backoff_ms(long long base_ms, uint32_t attempt)
{
    long long ms = base_ms;
    for (uint32_t i = 1; i < attempt && ms < PX_DECIDE_BACKOFF_CAP_MS; i++) ms *= 2;
    return ms > PX_DECIDE_BACKOFF_CAP_MS ? PX_DECIDE_BACKOFF_CAP_MS : ms;
}

long long px_decide_retry_ms(long long backoff_ms, uint32_t retry_after_ms)
{
    if (retry_after_ms == 0) return backoff_ms;
    return retry_after_ms > PX_DECIDE_RETRY_AFTER_CAP_MS ? PX_DECIDE_RETRY_AFTER_CAP_MS : retry_after_ms;
}

px_window_next px_decide_window(double l, double lmin, double ack_s)
{
    if (l > ack_s / 3) return PX_WINDOW_SHRINK; /* three times the wait: room for a stall */
    if (l + lmin <= ack_s / 4) return PX_WINDOW_GROW;
    return PX_WINDOW_KEEP;
}

bool px_decide_lease_held(uint64_t now_ms, uint64_t held_ms, long long lease_ms, long long timeout_ms)
{
    if (held_ms == 0) return false;     /* never confirmed: a claim whose reply was lost */
    if (now_ms <= held_ms) return true; /* confirmed by a command sent this very millisecond */
    return (long long)(now_ms - held_ms) < lease_ms - timeout_ms;
}

px_busy_next px_decide_busy(uint64_t now_ms, uint64_t wait_until_ms, bool lock_key_busy,
                            px_on_busy on_busy)
{
    if (now_ms < wait_until_ms) return PX_BUSY_WAIT;
    /* A busy dedup lock is a copy being handled elsewhere: always looked at again. */
    if (lock_key_busy && on_busy == PX_BUSY_DEAD_LETTER) return PX_BUSY_REFUSE;
    return PX_BUSY_PARK;
}

px_attempt px_decide_attempt(const px_count_view *v)
{
    if (v->count == 0) return (px_attempt){ 0, 0 };
    uint32_t lost = v->reads_lost + v->reclaims_lost + (v->reclaim_out ? 1u : 0u) + v->rereads +
                    v->history_lost + (v->history_out_past ? 1u : 0u);
    uint32_t extra = lost < v->count - 1 ? lost : v->count - 1;
    return (px_attempt){ v->count - 1 - extra, v->count - extra };
}

size_t px_decide_reserve(size_t max_inflight, size_t nstreams)
{
    return nstreams < 2 ? 0 : max_inflight / (2 * nstreams);
}

long long px_decide_batch_wait(const px_batch_view *v)
{
    if (v->got == 0 || v->got >= v->asked) return 0; /* nothing came, or more is waiting */
    if (v->linger_ms > 0) return v->linger_ms;       /* a fixed wait */
    if (v->batch_ms <= 0 || v->gap_ms < 0 || v->gap_ms > PX_BATCH_QUIET_MS) return 0;
    /* got entries in gap_ms: another due within batch_ms? */
    if ((double)v->got * (double)v->batch_ms < v->gap_ms) return 0;
    /* Yes. Redis ends the window up to a millisecond late (it keeps a blocked
     * command's time in whole ms): when a millisecond less still gathers
     * PX_BATCH_PAGE more entries at that rate, ask a millisecond less. */
    if (v->batch_ms >= 2 && (double)v->got * (double)(v->batch_ms - 1) >= PX_BATCH_PAGE * v->gap_ms)
        return v->batch_ms - 1;
    return v->batch_ms;
}

long long px_decide_window_ask(long long wait_ms, double redis_frac)
{
    if (wait_ms < 2 || redis_frac < 0) return wait_ms;
    return redis_frac < PX_WINDOW_PHASE ? wait_ms - 1 : wait_ms;
}

static void least_add(px_least *l, double now_ms, double x)
{
    if (l->second == 0 || now_ms - l->second >= 1000.0 || now_ms < l->second) {
        /* a second passed: this one's least is the last one's (more than a
         * second, or our clock went back: none) */
        bool next = l->second != 0 && now_ms - l->second < 2000.0 && now_ms >= l->second;
        l->v[1] = next ? l->v[0] : NAN;
        l->v[0] = NAN;
        l->second = now_ms;
    }
    if (isnan(l->v[0]) || x < l->v[0]) l->v[0] = x;
}

/* The least of the last one to two seconds; NAN: none, or too old. */
static double least_get(const px_least *l, double now_ms)
{
    if (l->second == 0 || now_ms - l->second >= 2000.0 || now_ms < l->second) return NAN;
    return isnan(l->v[1]) || l->v[0] < l->v[1] ? l->v[0] : l->v[1];
}

void px_redis_clock_sample(px_redis_clock *c, double now_ms, double id_ms)
{
    double s = now_ms - id_ms;
    if (s <= PX_CLOCK_SAMPLE_MAX_MS && s >= -PX_CLOCK_SAMPLE_MAX_MS) least_add(&c->ids, now_ms, s); /* not NaN */
}

void px_redis_clock_window(px_redis_clock *c, double sent_ms, double now_ms, long long asked_ms)
{
    double way = now_ms - sent_ms - (double)asked_ms;
    if (way >= 0 && way < 1.0) least_add(&c->way, now_ms, way); /* more says nothing more */
}

double px_redis_clock_frac(const px_redis_clock *c, double now_ms)
{
    double least = least_get(&c->ids, now_ms), way = least_get(&c->way, now_ms);
    if (isnan(least)) return -1;
    double r = now_ms - least + (isnan(way) ? 0 : way); /* their ms as it runs there */
    double f = r - floor(r);
    return f >= 0 && f < 1 ? f : -1;
}

long long px_decide_commit_wait(const px_commit_view *v)
{
    if (v->carried || v->due || v->stopping || v->queued == 0 || v->queued >= PX_COMMIT_RIDE_MAX) return 0;
    return v->wait_ms > 0 ? v->wait_ms : 0;
}

bool px_decide_error_expected(const char *err)
{
    return err && strncmp(err, "BUSYGROUP", 9) == 0 && (err[9] == ' ' || err[9] == '\0');
}

bool px_decide_error_passes(const char *err)
{
    static const char *const passing[] = {
        "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM",
        "NOREPLICAS", "MOVED", "ASK", "NOSCRIPT", "UNBLOCKED", NULL
    };
    if (err == NULL) return true;
    for (size_t i = 0; passing[i]; i++) {
        size_t n = strlen(passing[i]);
        if (strncmp(err, passing[i], n) == 0 && (err[n] == ' ' || err[n] == '\0')) return true;
    }
    return false;
}

size_t px_done_mark_write(char *buf, char lead, uint64_t ms, bool has_fp, uint64_t fp)
{
    int n = has_fp ? snprintf(buf, PX_DONE_MARK_MAX, "%c:%llu:%016llx", lead, (unsigned long long)ms,
                              (unsigned long long)fp)
                   : snprintf(buf, PX_DONE_MARK_MAX, "%c:%llu", lead, (unsigned long long)ms);
    return (size_t)n;
}

/* Up to 'max' digits of base 'base' at '*p' into '*out'; false if none. */
static bool read_num(const char **p, unsigned base, size_t max, uint64_t *out)
{
    uint64_t v = 0;
    size_t k = 0;
    for (const char *s = *p;; s++, k++) {
        unsigned d;
        if (*s >= '0' && *s <= '9') d = (unsigned)(*s - '0');
        else if (base == 16 && *s >= 'a' && *s <= 'f') d = (unsigned)(*s - 'a' + 10);
        else break;
        if (k == max) return false;
        v = v * base + d;
    }
    if (k == 0) return false;
    *p += k;
    *out = v;
    return true;
}

px_done_mark px_decide_done_mark(const char *v)
{
    px_done_mark m = { 0 };
    uint64_t ms, fp;
    const char *p = v + (v[0] ? 1 : 0);
    /* 19 digits: every ms time until the year 318,857,000 */
    if (v[0] == '\0' || *p++ != ':' || !read_num(&p, 10, 19, &ms)) return m;
    if (*p == '\0') {
        m.has_ms = true;
        m.ms = ms;
        return m;
    }
    const char *f = p + 1;
    if (*p != ':' || !read_num(&f, 16, 16, &fp) || f != p + 17 || *f != '\0') return m;
    m = (px_done_mark){ .has_ms = true, .ms = ms, .has_fp = true, .fp = fp };
    return m;
}

bool px_decide_conflict(const px_done_mark *m, bool has_fp, uint64_t fp)
{
    return has_fp && m->has_fp && m->fp != fp;
}
