/*
 * decide.h - the decisions of the dedup protocol as pure functions: what a
 * lock reply means, what a claim round trip's replies add up to, what an
 * answer from the app leads to, and what a busy lock leads to. claim.c and
 * proxy.c do the I/O around them; tests/unit/test_decide.c checks them with
 * tables.
 */
#ifndef PX_DECIDE_H
#define PX_DECIDE_H

#include "codec.h"
#include "config.h"

/* What `SET lock value NX PX lease GET` answered. */
typedef enum {
    PX_LOCK_NONE = 0, /* no reply yet / not asked */
    PX_LOCK_TAKEN,    /* nil, or our own value (a reply lost in a reconnect) */
    PX_LOCK_BUSY,     /* someone else's lock */
    PX_LOCK_DONE,     /* single layout: the key holds the done mark */
} px_lock_reply;

/* 'old' is the previous value ('oldlen' bytes, compared whole; NULL for nil),
 * 'mine' the value we set. */
px_lock_reply px_decide_lock_reply(const char *old, size_t oldlen, const char *mine);

typedef enum {
    PX_CLAIM_CLAIMED,         /* deliver it */
    PX_CLAIM_DUP_BEFORE_LOCK, /* done at the first look */
    PX_CLAIM_DUP_AFTER_LOCK,  /* done, seen by the check after the lock or a later look */
    PX_CLAIM_DUP_RELEASE,     /* done, seen under our own lock: release it, after_lock */
    PX_CLAIM_BUSY,            /* held elsewhere and not done: look again later */
} px_claim_outcome;

/*
 * One claim round trip: 'lock' is what the lock said (PX_LOCK_NONE when the
 * split layout's first done check already said done and no lock was tried),
 * 'done' whether a done check said done, 'examined' whether this entry was
 * claimed before (then a duplicate counts as after_lock).
 */
px_claim_outcome px_decide_claim(px_lock_reply lock, bool done, bool examined);

typedef enum {
    PX_NEXT_COMMIT_DONE,      /* ACK: done mark, release, XACK */
    PX_NEXT_DEAD_LETTER_DONE, /* DROP or exhausted: dead letter, done mark, XACK */
    PX_NEXT_RETRY,            /* release, back off, deliver again */
} px_answer_next;

/* What the app's answer leads to, after 'attempt' deliveries (1-based). */
px_answer_next px_decide_answer(px_ack_status status, uint32_t attempt, int max_deliveries);

/* The wait before the delivery after 'attempt': base doubling, capped at 30 s. */
long long px_decide_backoff_ms(long long base_ms, uint32_t attempt);

/*
 * Whether a lock is known to be ours at 'now_ms' (docs/guarantee.md): 'held_ms'
 * is when the command whose reply last confirmed it (the SET that took it, or
 * an extension) was sent, 0 when no reply has; both on one clock that never
 * steps (px_mono_ms). Redis gave it lease_ms from no earlier than that send.
 * It is known held while less than lease_ms - timeout_ms has passed: an
 * entry sent then still has timeout_ms of lease, time for the extension due
 * by then to reach Redis. Past that it may have run out, and another holder
 * may have the key.
 */
bool px_decide_lease_held(uint64_t now_ms, uint64_t held_ms, long long lease_ms, long long timeout_ms);

typedef enum {
    PX_WINDOW_KEEP,   /* in between */
    PX_WINDOW_GROW,   /* one more queued behind would answer within a quarter of ack_timeout */
    PX_WINDOW_SHRINK, /* answered later than a third of ack_timeout */
} px_window_next;

/* Flow control (deliver.c): an answer 'l' s after its delivery, 'lmin' the
 * quickest recent answer (one handler's time), ack_timeout 'ack_s' s. */
px_window_next px_decide_window(double l, double lmin, double ack_s);

/* The wait before a redelivery: the worker's Ack.retry_after_ms when it set
 * one (protocol 1.1: it knows when it can succeed, a rate limit's reset, a
 * Retry-After), at most PX_DECIDE_RETRY_AFTER_CAP_MS (1 h); else the
 * exponential 'backoff_ms'. */
#define PX_DECIDE_RETRY_AFTER_CAP_MS 3600000LL
long long px_decide_retry_ms(long long backoff_ms, uint32_t retry_after_ms);

typedef enum {
    PX_BUSY_WAIT,   /* within wait_ms: look again in 10-50 ms */
    PX_BUSY_PARK,   /* release, look again after the holder's lease */
    PX_BUSY_REFUSE, /* lock_key busy with on_busy: dead_letter */
} px_busy_next;

px_busy_next px_decide_busy(uint64_t now_ms, uint64_t wait_until_ms, bool lock_key_busy,
                            px_on_busy on_busy);

/*
 * Group mode: what the reader knows when XPENDING tells the delivery count of
 * an entry it replayed from its history or reclaimed (docs/guarantee.md). Redis
 * counts one delivery per read that hands an entry out, so the count includes
 * the read that brought it (the delivery about to go out) and any read of ours
 * whose reply was lost, or is still out, after Redis applied it: deliveries
 * no worker saw, which are not charged.
 */
typedef struct px_count_view {
    uint32_t count;         /* XPENDING's delivery count */
    uint32_t reads_lost;    /* history page: reads lost since the last whole replay */
    uint32_t reclaims_lost; /* history page: reclaims lost since then */
    bool reclaim_out;       /* history page: a reclaim was out when it was read */
    uint32_t rereads;       /* history reads of it while its count was asked */
    uint32_t history_lost;  /* history reads lost since its count was asked */
    bool history_out_past;  /* a history read still out reads past its id */
} px_count_view;

typedef struct px_attempt {
    uint32_t attempt; /* deliveries before the one about to go out */
    uint32_t count;   /* Redis' count as it should be: set it back when below v.count */
} px_attempt;

/* Each read that may have counted a delivery no worker saw is taken off, down
 * to no delivery before: erring low costs a delivery more at worst; high, a
 * dead letter no worker ever saw. */
px_attempt px_decide_attempt(const px_count_view *v);

/*
 * A done mark's value (docs/operations.md, "Looking at a key by hand").
 * idemproxy writes "<lead>:<ms>" or, with a fingerprint, "<lead>:<ms>:<fp>":
 * lead 'D' in layout single (the first character is all an older idemproxy
 * reads: done) and '1' in split (where readers ask EXISTS), ms the wall-clock
 * time it was written (ms since the epoch), fp the fingerprint's 64-bit hash as
 * 16 hex digits. Any other value (the write-ups' "1", an older idemproxy's "D")
 * marks the key done too, with no time and no fingerprint: a copy that meets it
 * is a plain duplicate.
 */
typedef struct px_done_mark {
    bool has_ms; /* 'ms' was read */
    bool has_fp; /* 'fp' was read */
    uint64_t ms; /* when the mark was written, ms since the epoch */
    uint64_t fp; /* the fingerprint of the event it marks done */
} px_done_mark;

#define PX_DONE_MARK_MAX 48 /* "D:" 20 digits ":" 16 hex digits, NUL: 40 */

/* Write the mark into 'buf' (PX_DONE_MARK_MAX bytes); returns its length. */
size_t px_done_mark_write(char *buf, char lead, uint64_t ms, bool has_fp, uint64_t fp);

/* Read a done key's value 'v' (NUL-terminated). A value idemproxy did not
 * write reads as a mark with neither time nor fingerprint. */
px_done_mark px_decide_done_mark(const char *v);

/* A copy whose fingerprint is 'fp' ('has_fp': the stream has one) met the
 * done mark 'm': a conflict when both carry fingerprints and they differ;
 * otherwise a duplicate. */
bool px_decide_conflict(const px_done_mark *m, bool has_fp, uint64_t fp);

/* max_inflight's share kept for each of 'nstreams' stream blocks (the room of
 * one stream, px_proxy_room_for): half of max_inflight split evenly, so one
 * stream whose worker is slow cannot hold every slot and stop the others
 * being read, and a busy stream still gets at least half. 0 with one stream,
 * or when max_inflight is too small to split. */
size_t px_decide_reserve(size_t max_inflight, size_t nstreams);

/*
 * The reader's batch window (docs/configuration.md, batch_ms; reader.c): after
 * a live page, how long to wait before reading again, in ms (0: read at once),
 * so entries that arrive close together are read, claimed and committed
 * together. A full page (more is waiting) or an empty one never waits.
 * linger_ms over 0 is a fixed wait after every short page. Otherwise the
 * adaptive window: batch_ms only while entries arrive close together, i.e. the
 * page came within PX_BATCH_QUIET_MS of the one before and its rate (got
 * entries in gap_ms) says another is due within batch_ms; so a page after a
 * quiet spell, and a trickle slower than one entry per batch_ms, are followed
 * by a read at once (and no timer wakes the loop for them). Redis ends a
 * window up to a millisecond late (half a millisecond, once it knows Redis's
 * clock: px_decide_window_ask, which never shortens a window of 1 ms), so
 * when a millisecond less would still gather PX_BATCH_PAGE more entries at
 * that rate, the window is batch_ms - 1:
 * with the default, 1 ms from about 3,000 entries/s, where a page of a few
 * entries already shares the wake-ups (issue 34).
 */
#define PX_BATCH_QUIET_MS 50.0
#define PX_BATCH_PAGE     3.0

typedef struct px_batch_view {
    size_t got;          /* entries the page brought */
    size_t asked;        /* its COUNT */
    double gap_ms;       /* since the page before that brought entries; < 0: none */
    long long linger_ms; /* streams[].linger_ms: 0 none */
    long long batch_ms;  /* streams[].batch_ms: the adaptive window's bound */
} px_batch_view;

long long px_decide_batch_wait(const px_batch_view *v);

/*
 * Where the window's BLPOP ends. Redis takes its timeout in whole ms: a BLPOP
 * of n ms run when its clock reads T + f (T whole ms, 0 <= f < 1) times out at
 * the first wake-up of its loop from T + n + 1, so it lasts n + 1 - f ms, not n.
 * Knowing f (its clock's fraction of a ms as it runs the command), the reader
 * asks for n - 1 while f < PX_WINDOW_PHASE, so a window of n ms lasts
 * n +- 1/2 ms rather than n to n + 1, plus the wait for Redis's next event
 * (px_redis_clock_frac knows f to about the way to Redis and back: with an
 * f that is wrong, the window lasts n - 1 to n + 1 ms, never longer than
 * before) (issue 34: at 1,000 entries/s the p99 is
 * an entry that waited the longest window; an A/B at 1,000/s of six rounds:
 * p99 over the floor 2.30 -> 1.25 ms, 0.72 -> 0.74 x the guard's CPU).
 * f < 0 (not known) or n < 2 (a BLPOP of 0 never ends): ask n.
 */
#define PX_WINDOW_PHASE 0.5
long long px_decide_window_ask(long long wait_ms, double redis_frac);

/*
 * Redis's clock, seen from ours, without asking it.
 * - From the entries it sends: an entry's id starts with its server's clock
 *   in ms when it was added (truncated), so (our clock as its page is read) -
 *   (its ms) is (its fraction of a ms) + (the way here) - (their clock - ours),
 *   and the least of many is about the shortest way here - (their clock -
 *   ours). A sample more than PX_CLOCK_SAMPLE_MAX_MS away is not Redis's clock
 *   (an id a producer set, or one read long after it was added): not taken.
 *   An id a producer set less than that ahead is taken, and makes the estimate
 *   wrong (the window then lasts n - 1 to n + 1 ms) until it is forgotten.
 * - That reads Redis's clock early by the way here, and a BLPOP runs later
 *   still, by the way there (and the rest of our loop turn). The windows
 *   measure both: a window asked for a ms answers (reply - send) = the ways
 *   there and back + (1 - f) + the wait for Redis's next event, whose least
 *   over many windows is about the ways there and back.
 * Each least is over the last one to two seconds of samples (this second's
 * and the last; up to four when they are sparse), so a clock that drifts or
 * steps, or a producer's id, is forgotten; a reconnect starts over.
 */
#define PX_CLOCK_SAMPLE_MAX_MS 1000.0
typedef struct px_least {
    double v[2];   /* this second's least, the last second's; NAN: none */
    double second; /* our ms when this second began; 0: no sample yet */
} px_least;
typedef struct px_redis_clock {
    px_least ids; /* our ms at a page - its newest id's ms */
    px_least way; /* a window's answer - its send - the ms asked */
} px_redis_clock; /* zeroed: nothing known */

void px_redis_clock_sample(px_redis_clock *c, double now_ms, double id_ms);
/* A window asked for 'asked_ms' at our 'sent_ms' timed out in Redis; its
 * answer came at our 'now_ms'. */
void px_redis_clock_window(px_redis_clock *c, double sent_ms, double now_ms, long long asked_ms);
/* Redis's clock's fraction of a ms as a command sent at our 'now_ms' runs
 * there (0 <= f < 1), or -1: not known. */
double px_redis_clock_frac(const px_redis_clock *c, double now_ms);

/*
 * The done mark's ride (commit.c; docs/configuration.md, commit_ms): how long
 * the commits queued in a loop turn that writes no claim may wait for the next
 * page's claims, so they share one write and their replies one read (0: write
 * them now). Only while the batch window of every queued entry's stream is
 * open (a page is due within batch_ms, whose claims will carry them); never
 * once the wait is over, the proxy stops, or PX_COMMIT_RIDE_MAX are queued.
 */
#define PX_COMMIT_RIDE_MAX 256

typedef struct px_commit_view {
    bool carried;      /* a claim is written in this loop turn */
    bool due;          /* the wait armed before is over */
    bool stopping;     /* SIGTERM: no waiting */
    size_t queued;     /* commits queued */
    long long wait_ms; /* the least commit_ms of their streams; 0 if one's window is shut */
} px_commit_view;

long long px_decide_commit_wait(const px_commit_view *v);

/* An error reply that waiting can cure (a loading, busy, failing-over or
 * full server, a cluster in motion): true. WRONGTYPE, NOPERM, ERR and the
 * rest come back the same however often they are retried: false. */
bool px_decide_error_passes(const char *err);

/* An error reply that is the answer its command expects, not a failure:
 * BUSYGROUP, the reader's XGROUP CREATE finding the group there (at every
 * start and reconnect but a stream's first). Neither logged nor counted in
 * idemproxy_redis_errors_total. */
bool px_decide_error_expected(const char *err);

/* The entry's Redis errors that do not pass: after this many it is
 * dead-lettered with the error as its reason (docs/guarantee.md). */
#define PX_MAX_REDIS_ERRORS 5

#endif
