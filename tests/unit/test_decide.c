/*
 * test_decide.c - the dedup protocol's decisions (proxy/decide.c), by table.
 */
#include <math.h>
#include <string.h>

#include "decide.h"
#include "test.h"

static void test_lock_reply(void)
{
    test_cond("nil: taken", px_decide_lock_reply(NULL, 0, "L:abc") == PX_LOCK_TAKEN);
    test_cond("our own value: taken (a lost reply)", px_decide_lock_reply("L:abc", 5, "L:abc") == PX_LOCK_TAKEN);
    test_cond("another token: busy", px_decide_lock_reply("L:xyz", 5, "L:abc") == PX_LOCK_BUSY);
    test_cond("done mark: done", px_decide_lock_reply("D", 1, "L:abc") == PX_LOCK_DONE);
    test_cond("split token: taken", px_decide_lock_reply("tok1", 4, "tok1") == PX_LOCK_TAKEN);
    test_cond("split other: busy", px_decide_lock_reply("tok2", 4, "tok1") == PX_LOCK_BUSY);
    /* The whole value is compared: our value and then more is someone else's. */
    test_cond("our value, a NUL, more: busy", px_decide_lock_reply("tok1\0x", 6, "tok1") == PX_LOCK_BUSY);
    test_cond("a prefix of our value: busy", px_decide_lock_reply("tok", 3, "tok1") == PX_LOCK_BUSY);
    test_cond("empty: busy", px_decide_lock_reply("", 0, "tok1") == PX_LOCK_BUSY);
}

static void test_claim(void)
{
    static const struct {
        px_lock_reply lock; bool done; bool examined; px_claim_outcome want; const char *name;
    } cases[] = {
        { PX_LOCK_TAKEN, false, false, PX_CLAIM_CLAIMED, "lock taken, not done" },
        { PX_LOCK_TAKEN, false, true,  PX_CLAIM_CLAIMED, "lock taken on a later look" },
        { PX_LOCK_TAKEN, true,  false, PX_CLAIM_DUP_RELEASE, "the double check: done under our lock" },
        { PX_LOCK_TAKEN, true,  true,  PX_CLAIM_DUP_RELEASE, "done under our lock, later look" },
        { PX_LOCK_DONE,  false, false, PX_CLAIM_DUP_BEFORE_LOCK, "single: done at first look" },
        { PX_LOCK_DONE,  false, true,  PX_CLAIM_DUP_AFTER_LOCK, "single: done after a busy wait" },
        { PX_LOCK_NONE,  true,  false, PX_CLAIM_DUP_BEFORE_LOCK, "split: fast path done" },
        { PX_LOCK_NONE,  true,  true,  PX_CLAIM_DUP_AFTER_LOCK, "split: fast path done on a re-look" },
        { PX_LOCK_BUSY,  true,  false, PX_CLAIM_DUP_AFTER_LOCK, "busy, done by the second check" },
        { PX_LOCK_BUSY,  false, false, PX_CLAIM_BUSY, "busy, not done" },
        { PX_LOCK_BUSY,  false, true,  PX_CLAIM_BUSY, "busy again" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        test_cond(cases[i].name,
                  px_decide_claim(cases[i].lock, cases[i].done, cases[i].examined) == cases[i].want);
}

static void test_answer(void)
{
    test_cond("ack commits", px_decide_answer(PX_ACK_ACK, 1, 5) == PX_NEXT_COMMIT_DONE);
    test_cond("ack at the last attempt commits", px_decide_answer(PX_ACK_ACK, 5, 5) == PX_NEXT_COMMIT_DONE);
    test_cond("drop dead-letters", px_decide_answer(PX_ACK_DROP, 1, 5) == PX_NEXT_DEAD_LETTER_DONE);
    test_cond("retry retries", px_decide_answer(PX_ACK_RETRY, 1, 5) == PX_NEXT_RETRY);
    test_cond("retry at 4 of 5 retries", px_decide_answer(PX_ACK_RETRY, 4, 5) == PX_NEXT_RETRY);
    test_cond("retry at 5 of 5 dead-letters", px_decide_answer(PX_ACK_RETRY, 5, 5) == PX_NEXT_DEAD_LETTER_DONE);
    test_cond("timeout retries", px_decide_answer(PX_ACK_TIMEOUT, 1, 2) == PX_NEXT_RETRY);
    test_cond("timeout exhausted", px_decide_answer(PX_ACK_TIMEOUT, 2, 2) == PX_NEXT_DEAD_LETTER_DONE);
    test_cond("invalid reply retries", px_decide_answer(PX_ACK_INVALID, 1, 5) == PX_NEXT_RETRY);
    test_cond("max_deliveries 1: first failure is final", px_decide_answer(PX_ACK_RETRY, 1, 1) == PX_NEXT_DEAD_LETTER_DONE);
}

static void test_backoff(void)
{
    test_cond("first retry waits the base", px_decide_backoff_ms(100, 1) == 100);
    test_cond("doubles", px_decide_backoff_ms(100, 2) == 200);
    test_cond("doubles again", px_decide_backoff_ms(100, 4) == 800);
    test_cond("capped at 30 s", px_decide_backoff_ms(100, 20) == 30000);
    test_cond("huge attempt stays capped", px_decide_backoff_ms(100, 4000000000u) == 30000);
    test_cond("base above the cap is capped", px_decide_backoff_ms(60000, 1) == 30000);
}

/* Protocol 1.1: the worker's retry_after_ms, capped at an hour; else the backoff. */
static void test_retry_after(void)
{
    test_cond("no retry_after: the backoff", px_decide_retry_ms(400, 0) == 400);
    test_cond("retry_after over the backoff", px_decide_retry_ms(400, 30000) == 30000);
    test_cond("retry_after under the backoff: the worker knows", px_decide_retry_ms(400, 50) == 50);
    test_cond("at the cap", px_decide_retry_ms(400, 3600000) == 3600000);
    test_cond("over the cap: an hour", px_decide_retry_ms(400, 3600001) == 3600000);
    test_cond("the largest: an hour", px_decide_retry_ms(400, UINT32_MAX) == 3600000);
}

static void test_window(void)
{
    /* ack_timeout 3 s: a quarter is 0.75 s, a third 1 s (binary fractions: exact sums). */
    static const struct {
        double l, lmin; px_window_next want; const char *name;
    } cases[] = {
        { 0.015625, 0.015625, PX_WINDOW_GROW, "quick answers: grow" },
        { 0.5, 0.25, PX_WINDOW_GROW, "one more queued would answer at a quarter of ack_timeout: grow" },
        { 0.53125, 0.25, PX_WINDOW_KEEP, "one more queued would answer past a quarter: keep" },
        { 0.75, 0.015625, PX_WINDOW_KEEP, "a quarter: keep" },
        { 1.0, 0.015625, PX_WINDOW_KEEP, "a third: keep" },
        { 1.03125, 0.015625, PX_WINDOW_SHRINK, "over a third: shrink" },
        { 2.5, 2.5, PX_WINDOW_SHRINK, "slow handlers: shrink" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        test_cond(cases[i].name, px_decide_window(cases[i].l, cases[i].lmin, 3.0) == cases[i].want);
}

static void test_busy(void)
{
    test_cond("within wait_ms: wait", px_decide_busy(100, 200, false, PX_BUSY_RETRY) == PX_BUSY_WAIT);
    test_cond("lock_key within wait_ms: wait even with dead_letter",
              px_decide_busy(100, 200, true, PX_BUSY_DEAD_LETTER) == PX_BUSY_WAIT);
    test_cond("wait over, dedup busy: park", px_decide_busy(200, 200, false, PX_BUSY_RETRY) == PX_BUSY_PARK);
    test_cond("dedup busy is never refused", px_decide_busy(300, 200, false, PX_BUSY_DEAD_LETTER) == PX_BUSY_PARK);
    test_cond("lock_key busy, retry: park", px_decide_busy(300, 200, true, PX_BUSY_RETRY) == PX_BUSY_PARK);
    test_cond("lock_key busy, dead_letter: refuse", px_decide_busy(300, 200, true, PX_BUSY_DEAD_LETTER) == PX_BUSY_REFUSE);
    test_cond("wait_ms 0 refuses at once", px_decide_busy(100, 100, true, PX_BUSY_DEAD_LETTER) == PX_BUSY_REFUSE);
}

static void test_lease_held(void)
{
    /* lease_ms 1000, timeout_ms 300: known held while less than 700 ms has
     * passed since the confirming command was sent. */
    static const struct {
        uint64_t now, held; long long lease, timeout; bool want; const char *name;
    } cases[] = {
        { 5000, 0,    1000, 300, false, "never confirmed (a claim whose reply was lost)" },
        { 5000, 5000, 1000, 300, true,  "confirmed by a command sent just now" },
        { 5000, 5001, 1000, 300, true,  "sent a millisecond after now (rounding): held" },
        { 5699, 5000, 1000, 300, true,  "699 ms old: held" },
        { 5700, 5000, 1000, 300, false, "700 ms old: lease_ms - timeout_ms, may be too little left" },
        { 5999, 5000, 1000, 300, false, "999 ms old: maybe still there, not known" },
        { 9000, 5000, 1000, 300, false, "long cut off: may have run out" },
        { 6000, 5000, 2000, 1000, false, "timeout_ms half the lease: 1000 ms is too old" },
        { 5999, 5000, 2000, 1000, true,  "timeout_ms half the lease: 999 ms is held" },
        { 30000, 2000, 30000, 1000, true, "a long lease, 28 s old" },
        { 31000, 2000, 30000, 1000, false, "a long lease, 29 s old" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        test_cond(cases[i].name, px_decide_lease_held(cases[i].now, cases[i].held, cases[i].lease,
                                                      cases[i].timeout) == cases[i].want);
}

static void test_errors(void)
{
    test_cond("BUSYGROUP is expected", px_decide_error_expected("BUSYGROUP Consumer Group name already exists"));
    test_cond("BUSY is not expected", !px_decide_error_expected("BUSY Redis is busy running a script"));
    test_cond("BUSYGROUPX is not expected", !px_decide_error_expected("BUSYGROUPX"));
    test_cond("a lost reply is not expected", !px_decide_error_expected(NULL));
    test_cond("lost reply passes", px_decide_error_passes(NULL));
    test_cond("LOADING passes", px_decide_error_passes("LOADING Redis is loading the dataset in memory"));
    test_cond("BUSY passes", px_decide_error_passes("BUSY Redis is busy running a script"));
    test_cond("READONLY passes (failover)", px_decide_error_passes("READONLY You can't write against a read only replica."));
    test_cond("OOM passes", px_decide_error_passes("OOM command not allowed when used memory > 'maxmemory'."));
    test_cond("CLUSTERDOWN passes", px_decide_error_passes("CLUSTERDOWN The cluster is down"));
    test_cond("WRONGTYPE stays", !px_decide_error_passes("WRONGTYPE Operation against a key holding the wrong kind of value"));
    test_cond("NOPERM stays", !px_decide_error_passes("NOPERM this user has no permissions to run the 'set' command"));
    test_cond("ERR stays", !px_decide_error_passes("ERR syntax error"));
    test_cond("BUSYGROUP is not BUSY", !px_decide_error_passes("BUSYGROUP Consumer Group name already exists"));
}

/* Group mode: an entry's attempt from the delivery count XPENDING reports
 * (reader.c, counts_reply_cb). Each past bug of this arithmetic is a row
 * (its commit in the comment): the situation, the count Redis reports, the
 * attempt (deliveries before the one about to go out) and Redis' count as it
 * should be set back. */
static void test_attempt(void)
{
    static const struct {
        const char *name;
        px_count_view v;
        uint32_t attempt, count;
    } rows[] = {
        { "replayed after a restart, never delivered", { .count = 1 }, 0, 1 },
        { "delivered twice before, then reclaimed", { .count = 3 }, 2, 3 },
        { "count 0 (never read, or set back and not read since)", { .count = 0 }, 0, 0 },
        /* 72d906f: a read applied by Redis, its reply lost; the replay counts again */
        { "a history read lost, then the replay", { .count = 2, .reads_lost = 1 }, 0, 1 },
        { "two reads lost, one of them counted it: errs low",
          { .count = 2, .reads_lost = 2 }, 0, 1 },
        { "a read lost, delivered twice before", { .count = 4, .reads_lost = 1 }, 2, 3 },
        /* 433e514: a reclaim applied, its reply lost; the replay brings it back */
        { "a reclaim lost, then the replay", { .count = 2, .reclaims_lost = 1 }, 0, 1 },
        /* 8a1f8a7: a history page read while a reclaim is still out */
        { "a reclaim out while its history page was read", { .count = 2, .reclaim_out = true }, 0, 1 },
        /* 6c33754: reclaimed (count 2), then read again by a replay before its count came */
        { "read again by a replay while its count was asked", { .count = 3, .rereads = 1 }, 1, 2 },
        /* 14150f2: a replay's read of it, lost after Redis applied it, before XPENDING answered */
        { "a history read lost since its count was asked", { .count = 3, .history_lost = 1 }, 1, 2 },
        { "a history read still out past its id", { .count = 3, .history_out_past = true }, 1, 2 },
        { "every kind at once never goes below 0",
          { .count = 3, .reads_lost = 1, .reclaims_lost = 1, .reclaim_out = true, .rereads = 1,
            .history_lost = 1, .history_out_past = true },
          0, 1 },
        /* issue 30, finding 2: A read it and parked it (busy), its refreshes
         * lost; B's XAUTOCLAIM took it over. A set its count back to 0 when
         * it parked, so B sees 1: first delivery attempt 1 (before: count 2,
         * attempt 1 spent, dead-lettered at max_deliveries 1 undelivered). */
        { "taken over from a replica that parked it undelivered", { .count = 1 }, 0, 1 },
        /* issue 30, finding 3: A delivered it once, its refreshes were lost and
         * B took it over: B charges A's delivery (its next is attempt 2); A,
         * seeing it is B's now, never redelivers it (px_proxy_taken_over). */
        { "taken over from a replica that delivered it once", { .count = 2 }, 1, 2 },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        px_attempt at = px_decide_attempt(&rows[i].v);
        test_cond(rows[i].name, at.attempt == rows[i].attempt && at.count == rows[i].count);
    }
}

/* Done marks (issue 31): what idemproxy writes, what it reads back, and the
 * marks other writers leave (the seeds' "1"), which are plain duplicates. */
static void test_done_mark(void)
{
    char buf[PX_DONE_MARK_MAX];
    size_t n = px_done_mark_write(buf, 'D', 1700000000123ull, false, 0);
    test_cond("write: no fingerprint", strcmp(buf, "D:1700000000123") == 0 && n == strlen(buf));
    n = px_done_mark_write(buf, '1', 5, true, 0x00ab0000000000ffull);
    test_cond("write: with fingerprint", strcmp(buf, "1:5:00ab0000000000ff") == 0 && n == 20);
    px_done_mark m = px_decide_done_mark("D:1700000000123:00ab0000000000ff");
    test_cond("read: time and fingerprint", m.has_ms && m.ms == 1700000000123ull && m.has_fp &&
                                                m.fp == 0x00ab0000000000ffull);
    m = px_decide_done_mark("1:42");
    test_cond("read: time only", m.has_ms && m.ms == 42 && !m.has_fp);
    static const char *const plain[] = { "D", "1", "true", "", "D:", "D:x", "1:12x", "D:5:abc",
                                         "D:5:00ab0000000000fg", "D:5:00ab0000000000ff:", "D:-5",
                                         "D:99999999999999999999999", NULL };
    for (size_t i = 0; plain[i]; i++) {
        m = px_decide_done_mark(plain[i]);
        test_cond("read: another writer's mark is plain", !m.has_fp);
    }
    m = px_decide_done_mark("D:5:abc");
    test_cond("read: a bad fingerprint keeps no time either", !m.has_ms);
    px_done_mark fp1 = { .has_ms = true, .ms = 1, .has_fp = true, .fp = 7 }, none = { 0 },
                 t = { .has_ms = true, .ms = 1 };
    test_cond("conflict: fingerprints differ", px_decide_conflict(&fp1, true, 8));
    test_cond("no conflict: the same fingerprint", !px_decide_conflict(&fp1, true, 7));
    test_cond("no conflict: the copy has none (fingerprint off)", !px_decide_conflict(&fp1, false, 0));
    test_cond("no conflict: the mark has none (seeds, older idemproxy)", !px_decide_conflict(&none, true, 8));
    test_cond("no conflict: a mark with a time only", !px_decide_conflict(&t, true, 8));
}

static void test_reserve(void)
{
    static const struct {
        size_t max, n, want;
        const char *what;
    } rows[] = {
        { 256, 1, 0, "one stream: no reserve, it may hold everything" },
        { 256, 2, 64, "two streams: a quarter each, half of max_inflight" },
        { 256, 3, 42, "three: half split evenly, rounded down" },
        { 256, 200, 0, "more streams than half of max_inflight: none" },
        { 1, 2, 0, "max_inflight 1: nothing to split" },
        { 4, 2, 1, "max_inflight 4, two streams: one each" },
        { 1 << 20, 2, 1 << 18, "the largest max_inflight" },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        test_cond(rows[i].what, px_decide_reserve(rows[i].max, rows[i].n) == rows[i].want);
}

static void test_batch_wait(void)
{
    static const struct {
        const char *name;
        px_batch_view v;
        long long want;
    } rows[] = {
        /* the adaptive window, batch_ms 2 (linger_ms 0, the default) */
        { "a lone entry, the first page ever: read at once", { 1, 16, -1, 0, 2 }, 0 },
        { "a lone entry after 60 ms of quiet: read at once", { 1, 16, 60, 0, 2 }, 0 },
        { "just past the quiet bound, even with many entries", { 200, 256, 50.5, 0, 100 }, 0 },
        { "1k/s: one entry 1 ms after the last page: wait", { 1, 16, 1, 0, 2 }, 2 },
        { "1k/s batched: 2 entries in 2.2 ms: wait", { 2, 32, 2.2, 0, 2 }, 2 },
        { "5k/s: 11 entries in 2.2 ms: wait 1 ms (3 more by then)", { 11, 64, 2.2, 0, 2 }, 1 },
        { "3k/s: 3 entries in 1 ms: wait 1 ms", { 3, 64, 1, 0, 2 }, 1 },
        { "2k/s: 4 entries in 2 ms: wait 2 ms", { 4, 64, 2, 0, 2 }, 2 },
        { "2.5k/s, batch_ms 100: a millisecond less, 99", { 5, 64, 2, 0, 100 }, 99 },
        { "two pages in the same ms: wait 1 ms", { 2, 64, 0, 0, 2 }, 1 },
        { "1k/s, batch_ms 100: 99", { 3, 64, 3, 0, 100 }, 99 },
        { "22/s, batch_ms 100: the whole window, 3 more do not come in 99 ms", { 1, 64, 45, 0, 100 }, 100 },
        { "one entry per 2 ms: one due within the window: wait", { 1, 16, 2, 0, 2 }, 2 },
        { "one entry per 3 ms: none due within 2 ms: read at once", { 1, 16, 3, 0, 2 }, 0 },
        { "20 ms apart with batch_ms 2: read at once", { 1, 16, 20, 0, 2 }, 0 },
        { "20 ms apart with batch_ms 30: wait 30", { 1, 16, 20, 0, 30 }, 30 },
        { "a full page: more is waiting, read at once", { 16, 16, 1, 0, 2 }, 0 },
        { "more than asked (cannot happen): read at once", { 17, 16, 1, 0, 2 }, 0 },
        { "an empty page: read at once", { 0, 16, 1, 0, 2 }, 0 },
        { "batch_ms 0: never wait", { 5, 16, 1, 0, 0 }, 0 },
        /* linger_ms over 0: a fixed wait after every short page, batch_ms aside */
        { "linger_ms 5 with batch_ms 0: wait", { 1, 16, 1, 5, 0 }, 5 },
        { "linger_ms 5: wait after a short page", { 1, 16, 1, 5, 2 }, 5 },
        { "linger_ms 5: wait after quiet too (its old meaning)", { 1, 16, -1, 5, 2 }, 5 },
        { "linger_ms 5: not after a full page", { 16, 16, 1, 5, 2 }, 0 },
        { "linger_ms 5: not after an empty page", { 0, 16, 1, 5, 0 }, 0 },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        test_cond(rows[i].name, px_decide_batch_wait(&rows[i].v) == rows[i].want);
}

static void test_window_ask(void)
{
    /* Redis ends a BLPOP of n ms run at T + f at T + n + 1: asked n - 1 while
     * f < PX_WINDOW_PHASE, a window of n lasts n - PX_WINDOW_PHASE .. n + 1 - PX_WINDOW_PHASE. */
    test_cond("2 ms early in Redis's ms: ask 1 (ends in 1.9)", px_decide_window_ask(2, 0.1) == 1);
    test_cond("2 ms at 0.49 of its ms: ask 1 (ends in 1.51)", px_decide_window_ask(2, 0.49) == 1);
    test_cond("2 ms at 0.5 of its ms: ask 2 (ends in 2.5)", px_decide_window_ask(2, 0.5) == 2);
    test_cond("2 ms late in its ms: ask 2 (ends in 2.1)", px_decide_window_ask(2, 0.9) == 2);
    test_cond("2 ms, Redis's clock not known: ask 2", px_decide_window_ask(2, -1) == 2);
    test_cond("1 ms early in its ms: ask 1 (a BLPOP of 0 never ends)", px_decide_window_ask(1, 0.1) == 1);
    test_cond("100 ms early in its ms: ask 99", px_decide_window_ask(100, 0.2) == 99);
    for (double f = 0; f < 1; f += 0.01) {
        long long ask = px_decide_window_ask(2, f);
        double lasts = (double)ask + 1 - f;
        if (!(lasts > 2 - PX_WINDOW_PHASE - 1e-9 && lasts <= 3 - PX_WINDOW_PHASE + 1e-9)) {
            test_cond("a window of 2 ms lasts 1.5 .. 2.5 ms at every fraction", false);
            return;
        }
    }
    test_cond("a window of 2 ms lasts 1.5 .. 2.5 ms at every fraction", true);
}

static void test_redis_clock(void)
{
    px_redis_clock c;
    memset(&c, 0, sizeof(c));
    test_cond("no sample: not known", px_redis_clock_frac(&c, 1e12) < 0);
    /* Redis's clock 0.25 ms ahead of ours; entries reach us 0.05 ms after they
     * are added, at every tenth of Redis's ms: the least sample is the one
     * added at the start of its ms, and says Redis's clock is 0.2 ms ahead
     * (the way here is not seen). */
    const double t0 = 1700000000000.0;
    double ahead = 0.25, now = t0;
    for (int i = 0; i < 200; i++) {
        double added = t0 + i + (i % 10) * 0.1; /* their clock */
        now = added - ahead + 0.05;
        px_redis_clock_sample(&c, now, floor(added));
    }
    now = floor(now) + 1;
    double f = px_redis_clock_frac(&c, now); /* their clock reads now + 0.25 */
    test_cond("Redis's fraction of a ms, less the way here", f >= 0.19 && f <= 0.21);
    test_cond("an id from the future (a producer's) is not taken",
              (px_redis_clock_sample(&c, now, now + 5000), px_redis_clock_frac(&c, now) == f));
    test_cond("an id from the past neither",
              (px_redis_clock_sample(&c, now, now - 5000), px_redis_clock_frac(&c, now) == f));
    test_cond("NaN neither", (px_redis_clock_sample(&c, now, NAN), px_redis_clock_frac(&c, now) == f));
    test_cond("two seconds without a sample: not known", px_redis_clock_frac(&c, now + 2100) < 0);
    /* Their clock stepped: 0.85 ms ahead now. Within two seconds of samples
     * the old least is forgotten. */
    ahead = 0.85;
    double t1 = floor(now) + 10;
    for (int i = 0; i < 2200; i++) {
        double added = t1 + i + (i % 10) * 0.1;
        now = added - ahead + 0.05;
        px_redis_clock_sample(&c, now, floor(added));
    }
    now = floor(now) + 1;
    f = px_redis_clock_frac(&c, now);
    test_cond("a clock that stepped is followed within two seconds", f >= 0.79 && f <= 0.81);
    test_cond("our clock stepped back: not known", px_redis_clock_frac(&c, now - 5000) < 0);
}

/* Pages every ms for 'ms' ms from our 't', Redis's clock 'ahead' of ours, the
 * way here 'back': one entry added at every hundredth of Redis's ms in turn.
 * Returns our clock after the last. */
static double pages(px_redis_clock *c, double t, int ms, double ahead, double back)
{
    double now = t;
    for (int i = 0; i < ms; i++) {
        double added = t + ahead + i + (i % 100) * 0.01; /* their clock */
        now = added - ahead + back;
        px_redis_clock_sample(c, now, floor(added));
    }
    return now;
}

static void test_redis_clock_ways(void)
{
    const double t0 = 1700000000000.0;
    px_redis_clock c;
    memset(&c, 0, sizeof(c));
    /* Their clock 0.25 ms ahead, 0.05 ms each way: the ids alone read it
     * 0.05 early at our end, and a command runs there 0.05 later still. */
    double now = floor(pages(&c, t0, 500, 0.25, 0.05)) + 1;
    double f = px_redis_clock_frac(&c, now);
    test_cond("the ids alone: early by the ways there and back", f >= 0.19 && f <= 0.21);
    /* Windows of 1 ms sent at every hundredth of their ms, each answered at
     * the ms it ends in Redis (no other wait): (answer - send - 1) is 0.1 +
     * (1 - f), least 0.11. */
    for (int i = 0; i < 300; i++) {
        double sent = now + i * 1.0 + (i % 100) * 0.01, runs = sent + 0.05 + 0.25; /* their clock */
        double answered = floor(runs) + 2 - 0.25 + 0.05;
        px_redis_clock_window(&c, sent, answered, 1);
    }
    now = floor(now) + 301;
    now = floor(pages(&c, now, 10, 0.25, 0.05)) + 1;
    f = px_redis_clock_frac(&c, now); /* it runs there at their now + 0.25 + 0.05 */
    test_cond("with the windows: the fraction as the command runs there", f >= 0.29 && f <= 0.32);
    double before = f;
    px_redis_clock_window(&c, now + 0.5, now, 1); /* -1.5: our clock went back */
    test_cond("a window answered before its time is not taken", px_redis_clock_frac(&c, now) == before);
    memset(&c, 0, sizeof(c));
    now = floor(pages(&c, t0, 500, 0.25, 0.05)) + 1;
    before = px_redis_clock_frac(&c, now);
    px_redis_clock_window(&c, now - 2.05, now, 1); /* 1.05: ended late by something else */
    test_cond("a window a ms late or more is not taken", px_redis_clock_frac(&c, now) == before);

    /* The last second's least is kept: a second of pages, then one late
     * page opens the next second; the estimate is still the first second's. */
    memset(&c, 0, sizeof(c));
    now = pages(&c, t0, 500, 0.25, 0.05);
    now = floor(now) + 600.5;
    px_redis_clock_sample(&c, now, floor(now + 0.25 - 0.3)); /* a page that took 0.55 */
    f = px_redis_clock_frac(&c, floor(now) + 1);
    test_cond("the last second's least is used", f >= 0.19 && f <= 0.21);

    /* Their clock fell back, from 0.85 to 0.25 ahead: the old least (the
     * smaller) is forgotten within two and a half seconds. */
    memset(&c, 0, sizeof(c));
    now = pages(&c, t0, 1500, 0.85, 0.05);
    now = pages(&c, floor(now) + 1, 2500, 0.25, 0.05);
    f = px_redis_clock_frac(&c, floor(now) + 1);
    test_cond("a clock that fell back is followed within 2.5 s", f >= 0.19 && f <= 0.21);
}

static void test_commit_wait(void)
{
    static const struct {
        const char *name;
        px_commit_view v;
        long long want;
    } rows[] = {
        { "acked while the window is open, no claim this turn: wait 5", { false, false, false, 1, 5 }, 5 },
        { "a claim is written this turn: ride it now", { true, false, false, 1, 5 }, 0 },
        { "the wait is over: write now", { false, true, false, 3, 5 }, 0 },
        { "stopping: write now", { false, false, true, 1, 5 }, 0 },
        { "a window shut (or commit_ms 0): write now", { false, false, false, 1, 0 }, 0 },
        { "nothing queued: nothing to wait for", { false, false, false, 0, 5 }, 0 },
        { "255 queued: still waits", { false, false, false, 255, 5 }, 5 },
        { "PX_COMMIT_RIDE_MAX queued: write now", { false, false, false, PX_COMMIT_RIDE_MAX, 5 }, 0 },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        test_cond(rows[i].name, px_decide_commit_wait(&rows[i].v) == rows[i].want);
}

int main(void)
{
    test_reserve();
    test_commit_wait();
    test_lock_reply();
    test_errors();
    test_claim();
    test_answer();
    test_backoff();
    test_window();
    test_retry_after();
    test_busy();
    test_lease_held();
    test_attempt();
    test_done_mark();
    test_batch_wait();
    test_window_ask();
    test_redis_clock();
    test_redis_clock_ways();
    return test_report();
}
