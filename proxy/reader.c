/*
 * reader.c - reading one stream (docs/guarantee.md), on the stream's own Redis
 * link so a blocking read never holds up claims and commits.
 *
 * Group mode: create the group (MKSTREAM; BUSYGROUP is fine), replay this
 * consumer's own pending entries (XREADGROUP from "0": what a restart with the
 * same consumer name left unfinished), then read new entries with ">". A timer
 * takes over entries pending longer than claim_idle_ms (XAUTOCLAIM), including
 * our own that we no longer track (a read whose reply was lost); entries still
 * tracked are kept fresh, and one another consumer took over (our refreshes
 * lost) is never taken back (keep_script). Deleted or trimmed pending entries are acked away and
 * counted. A janitor removes consumers with nothing pending, idle for an hour.
 *
 * Group-less mode: XREAD from 'start' ("$" is resolved to the last id first, so
 * nothing added between two reads is missed); nothing is acked.
 *
 * The reader asks for at most as many entries as there is room for
 * (max_inflight minus what is tracked), and waits to be kicked otherwise.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "claim.h"
#include "cluster.h"
#include "decide.h"
#include "deliver.h"
#include "hooks.h"
#include "log.h"
#include "reader.h"
#include "replies.h"
#include "reply.h"
#include "step.h"

#define PX_READER_BLOCK_MS 2000
#define PX_READER_BATCH    256
/* A read page adapts to the bytes it returns (docs/guarantee.md): COUNT starts
 * at PX_PAGE_FIRST, doubles after each full page of under half PX_PAGE_BYTES up
 * to PX_READER_BATCH, and after a page over PX_PAGE_BYTES drops to what would
 * have fit (at most half, at least 1). A page's entries are in the reply and
 * then copied once each, so a page of entries near max_entry_bytes (1 MiB)
 * costs a few pages' bytes, not 256 of them; an entry over max_entry_bytes is
 * elided as it is read (reply.h) but counts at its size. */
#define PX_PAGE_FIRST 16
#define PX_PAGE_BYTES (4u << 20)
#define PX_JANITOR_S  300.0
/* The batch window waits in Redis (docs/performance.md): a BLPOP with the
 * window as its timeout, on a key that is never written, ahead of the next
 * read on the reader's link. Redis ends a blocked command's timeout only when
 * its loop next wakes (up to 1/hz s on an idle server), so at the window's end
 * plus PX_WINDOW_WAKE_MS, if the BLPOP has not answered, a PING on the command
 * link wakes it, again every PX_WINDOW_WAKE_MS up to PX_WINDOW_WAKES times.
 * The BLPOP's deadline allows PX_WINDOW_SLACK_MS on top (a server at hz 1). */
#define PX_WINDOW_WAKE_MS    1
#define PX_WINDOW_WAKES      3
#define PX_WINDOW_SLACK_MS   1000
#define PX_WINDOW_HOLD_RATIO 16
#define PX_IDLE_CONSUMER_MS  3600000LL

/* Consumers idle this long with nothing pending are removed; tests shorten it
 * with a hook (hooks.h) instead of waiting an hour. */
static long long idle_consumer_ms = PX_IDLE_CONSUMER_MS;

/* --- the reader's states ------------------------------------------------------
 * One reader per stream block. Every change of its state goes through
 * reader_to, which checks it against this table in every build (PX_ENSURE:
 * the counts it keeps decide how many deliveries an entry is charged). It
 * starts DOWN (px_reader_start).
 *
 *   from      to        event                                          who
 *   DOWN      CREATE    link up: group mode (the group may be gone, our
 *                       history may hold entries whose replies were
 *                       lost), or group-less before its first read      link_state_cb
 *   DOWN      LIVE      link up, group-less: on from its last id         link_state_cb
 *   CREATE    HISTORY   group: XGROUP CREATE answered (BUSYGROUP too):
 *                       replay our pending entries from "0"              create_reply_cb
 *   CREATE    LIVE      group-less: its start found ("$": XREVRANGE)     create_reply_cb, read_next
 *   HISTORY   LIVE      a history page came back empty: read ">"         read_reply_cb
 *   HISTORY   CREATE    group: a read lost while the link stays up (a
 *                       cluster), or NOGROUP: start over                 read_reply_cb
 *   LIVE      CREATE    the same                                         read_reply_cb
 *   LIVE      HISTORY   a reclaim was lost (replay_due) and the command
 *                       link is up: replay what it took                  read_next
 *   any       DOWN      link down                                        link_state_cb
 *   any       STOPPED   SIGTERM or exit                                  px_reader_stop
 *
 * Entering HISTORY starts a replay from "0" (and it is the replay a lost
 * reclaim asked for); HISTORY -> LIVE is a whole replay: the reads and
 * reclaims lost before it are forgotten, unless a reclaim was lost during it.
 * Beside the state: one read at a time ('reading', 'reading_history' when it
 * is a history read), one XAUTOCLAIM at a time ('reclaiming', LIVE only, and
 * none while a replay is due), and the XPENDING asks of replayed and
 * reclaimed batches (counts_ask).
 *
 * The batch window (read_reply_cb, px_decide_batch_wait) is beside the state
 * too, LIVE only: after a short page, either a BLPOP ahead of the next read on
 * the link ('window_out', answered by window_reply_cb, woken by 'wake'), or,
 * once Redis refused the BLPOP on this link (NOPERM, an unknown command, a
 * window key of another type: 'window_local' until the link is up again),
 * the 'linger' timer, during which read_next sends nothing. A read queued
 * behind the BLPOP is an ordinary read in flight ('reading'): a link that
 * drops answers both, the BLPOP first. */
typedef enum { R_DOWN = 0,
               R_CREATE,
               R_HISTORY,
               R_LIVE,
               R_STOPPED } r_state;

struct px_reader {
    px_redis *link;                    /* the stream's own link, for blocking reads */
    r_state state;                     /* changed only by reader_to */
    size_t page_count;                 /* COUNT of the next read, adapted to the bytes of the last */
    size_t asked;                      /* COUNT of the read in flight */
    bool reading;                      /* a read (or XGROUP CREATE, XREVRANGE) is in flight */
    bool reading_history;              /* the last read sent is a history read */
    bool reclaiming;                   /* group: an XAUTOCLAIM is out (one at a time) */
    bool replay_due;                   /* group: a reclaim was lost: replay the history next */
    unsigned lost_reads;               /* group: reads lost since the last whole history replay */
    unsigned lost_reclaims;            /* group: reclaims lost since then */
    unsigned history_lost;             /* history reads whose reply was lost, ever */
    struct counts_ask *counts_waiting; /* XPENDING asks on their retry timer */
    char last_id[64];                  /* group-less: last id read; group: history cursor */
    char autoclaim_cursor[64];         /* group: where the next XAUTOCLAIM starts */
    ev_timer autoclaim;                /* group: periodic XAUTOCLAIM */
    ev_timer refresh;                  /* group: tracked entries kept fresh (keep_script) */
    ev_timer janitor;                  /* group: idle consumer removal */
    ev_timer pause;                    /* a short wait after an error reply, then read again */
    ev_timer linger;                   /* the batch window after a short live page (px_decide_batch_wait) */
    ev_timer wake;                     /* the window in Redis past its end: PING the command link */
    unsigned wakes;                    /* PINGs sent for the window out */
    bool window_out;                   /* a BLPOP window is out ahead of the next read */
    long long window_ms;               /* its length */
    long long window_asked;            /* the BLPOP's timeout, ms: window_ms or a ms less (px_decide_window_ask) */
    double window_sent;                /* ev_time in ms when it was sent */
    bool window_holds;                 /* the workers' answers wait for its end (px_deliver_hold) */
    bool window_local;                 /* Redis refused it on this link: the linger timer until it is up again */
    bool window_warned;                /* that refusal was logged */
    char *window_key;                  /* the BLPOP's key: in the stream's cluster slot, never written */
    bool batching;                     /* the last live page opened the window: the next one is due soon */
    double last_page;                  /* ev_now of the last live page that brought entries; 0: none */
    px_redis_clock clock;              /* the link's server's clock, from the ids it sends (the window's end) */
};

#define T(from, to) [R_##from][R_##to] = true
static const bool reader_legal[R_STOPPED + 1][R_STOPPED + 1] = {
    T(DOWN, CREATE),
    T(DOWN, LIVE),
    T(CREATE, HISTORY),
    T(CREATE, LIVE),
    T(HISTORY, LIVE),
    T(HISTORY, CREATE),
    T(LIVE, CREATE),
    T(LIVE, HISTORY),
    T(DOWN, DOWN),
    /* the link said up again with no down between (a cluster's link is up
     * again once its map is refreshed): the reader starts over as it would */
    T(CREATE, CREATE),
    T(LIVE, LIVE),
    /* a group's XGROUP CREATE answered again while its replay runs (on a
     * cluster, after the link said up again): the replay starts over from 0 */
    T(HISTORY, HISTORY),
    T(CREATE, DOWN),
    T(HISTORY, DOWN),
    T(LIVE, DOWN),
    T(DOWN, STOPPED),
    T(CREATE, STOPPED),
    T(HISTORY, STOPPED),
    T(LIVE, STOPPED),
    T(STOPPED, STOPPED),
};
#undef T

/* A history read in flight is a read of the history state: what is charged
 * for a history read lost or still out (counts_reply_cb) relies on it. A stop
 * leaves the read it abandons as it was. */
static bool history_ok(const px_reader *rd)
{
    return !(rd->reading && rd->reading_history) || rd->state == R_HISTORY || rd->state == R_STOPPED;
}

/* Every change of the reader's state (the table above). */
static void reader_to(px_stream *st, r_state next)
{
    px_reader *rd = st->reader;
    static const char *const name[] = { "DOWN", "CREATE", "HISTORY", "LIVE", "STOPPED" };
    if (!reader_legal[rd->state][next])
        px_log_error("stream %s: the reader cannot go from %s to %s", st->conf->stream, name[rd->state],
                     name[next]);
    PX_ENSURE(reader_legal[rd->state][next]);
    rd->batching = false;    /* a page read in the new state opens the window again */
    if (next == R_HISTORY) { /* a replay from the start, with nothing in flight */
        PX_ENSURE(st->conf->group && !rd->reading);
        strcpy(rd->last_id, "0");
        rd->replay_due = false; /* this replay brings back what a lost reclaim took */
    } else if (rd->state == R_HISTORY && next == R_LIVE) {
        /* Whatever the lost reads and reclaims took has been replayed, unless a
         * reclaim was lost meanwhile: then read_next replays once more, with
         * the count. */
        if (!rd->replay_due) rd->lost_reads = rd->lost_reclaims = 0;
    }
    rd->state = next;
    PX_ENSURE(history_ok(rd));
}

static void read_next(px_stream *st);
static bool window_in_redis(px_stream *st, long long wait_ms);

static size_t batch_size(px_stream *st)
{
    px_reader *rd = st->reader;
    size_t room = px_proxy_room_for(st);
    return room < rd->page_count ? room : rd->page_count;
}

/* A page of 'n' entries with 'bytes' of fields came back: the next COUNT. */
static void page_seen(px_stream *st, size_t n, size_t bytes)
{
    px_reader *rd = st->reader;
    size_t c = rd->page_count;
    if (bytes > PX_PAGE_BYTES) {
        size_t fit = (size_t)((double)n * PX_PAGE_BYTES / (double)bytes);
        c = fit < c / 2 ? fit : c / 2;
        if (c == 0) c = 1;
        if (c < rd->page_count)
            px_log_debug("stream %s: a page of %zu entries held %zu bytes; reading %zu at a time",
                         st->conf->stream, n, bytes, c);
    } else if (n >= c && bytes <= PX_PAGE_BYTES / 2 && c < PX_READER_BATCH) {
        c = 2 * c < PX_READER_BATCH ? 2 * c : PX_READER_BATCH;
    }
    rd->page_count = c;
}

/* Stream id a after b ("ms-seq"; "0" is before every entry). */
static bool id_after(const char *a, const char *b)
{
    char *end;
    unsigned long long ams = strtoull(a, &end, 10), aseq = *end == '-' ? strtoull(end + 1, NULL, 10) : 0;
    unsigned long long bms = strtoull(b, &end, 10), bseq = *end == '-' ? strtoull(end + 1, NULL, 10) : 0;
    return ams > bms || (ams == bms && aseq > bseq);
}

/* A read or reclaim's reply was lost (a deadline, a reset), maybe after
 * Redis applied it: its entries are in our pending list with a delivery
 * counted that no worker saw, which the next history replay does not charge
 * (counts_reply_cb); and a page too large to arrive in time is not asked for
 * again as it was. */
static void page_lost(px_stream *st, bool reclaim)
{
    px_reader *rd = st->reader;
    const char *what = reclaim ? "reclaim" : "read";
    if (st->conf->group && reclaim) rd->lost_reclaims++;
    else if (st->conf->group) rd->lost_reads++;
    if (rd->page_count > 1) {
        rd->page_count /= 2;
        px_log_debug("stream %s: a %s was lost; reading %zu at a time", st->conf->stream, what,
                     rd->page_count);
    }
}

/* XPENDING's answer for a replayed or reclaimed batch: each entry's delivery
 * count becomes its attempt number (docs/protocol.md), so max_deliveries holds
 * across restarts and consumers. It is asked on the command link before the
 * batch's claims: on one server it is in before any of them. On a cluster the
 * claims go to other masters and may be answered, and the entry delivered,
 * first (attempt 1 again, and Redis' count set back to 1): there the batch's
 * claims wait for this reply ('delivery.counts_wait', px_claim_flush).
 * A test hook (hooks.h) can send the XPENDING later. */

typedef struct counts_ask {
    px_stream *st;
    uint32_t seq; /* the batch: its entries' counts_wait */
    size_t n;
    uint32_t reads_lost;     /* history: px_reader.lost_reads when it was made */
    uint32_t reclaims_lost;  /* history: px_reader.lost_reclaims then */
    bool reclaim_out;        /* history: a reclaim was out then */
    unsigned history_lost;   /* px_reader.history_lost when it was made */
    ev_timer delay;          /* the test hook, or a retry */
    struct counts_ask *next; /* in rd->counts_waiting while 'delay' runs */
    char first[64], last[64];
} counts_ask;

static void counts_delay_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* An ask waits on its timer in rd->counts_waiting, so that a stop that ends
 * the loop before the timer fires still answers and frees it. */
static void counts_later(counts_ask *a, double after)
{
    ev_timer_init(&a->delay, counts_delay_cb, after, 0.);
    a->delay.data = a;
    ev_timer_start(a->st->px->loop, &a->delay);
    a->next = a->st->reader->counts_waiting;
    a->st->reader->counts_waiting = a;
}

static void counts_unwait(counts_ask *a)
{
    for (counts_ask **p = &a->st->reader->counts_waiting; *p; p = &(*p)->next)
        if (*p == a) {
            *p = a->next;
            break;
        }
    ev_timer_stop(a->st->px->loop, &a->delay);
}

static void set_count(px_entry *e, uint32_t count);

static void counts_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    counts_ask *a = priv;
    px_stream *st = a->st;
    px_reader *rd = st->reader;
    PX_ENSURE(history_ok(rd));
    if (reply == NULL && !st->px->stopping) {
        /* Not sent (the command link is not up yet: a restart's history
         * read can come first) or lost: asked again shortly, and the batch's
         * claims wait, or they would go out as first deliveries. */
        counts_later(a, 0.1);
        return;
    }
    /* A malformed reply (replies.c: any element of another type) is read as
     * none: no count is known, so attempt errs low (docs/guarantee.md). */
    px_rp_pending *pend = NULL;
    char why[128];
    long n = reply ? px_rp_xpending(reply, &pend, why, sizeof(why)) : 0;
    if (n < 0) px_log_warn("stream %s: XPENDING: malformed reply: %s", st->conf->stream, why);
    for (long i = 0; i < n; i++) {
        px_rp_pending *p = &pend[i];
        px_entry *e = strlen(p->id) == p->id_len ? px_proxy_find(st, p->id) : NULL;
        /* Only the entries this ask is for: one read again meanwhile waits for
         * the ask after that read (take_entries), which sees its count. */
        if (e == NULL || e->delivery.counts_wait != a->seq || e->delivery.attempt != 0 || p->count < 1)
            continue;
        /* Reads of ours that may have counted a delivery no worker saw
         * are not charged (px_decide_attempt), and Redis' count is set
         * back, so it stays the evidence after a restart: reads lost
         * before the ask (or a reclaim still out then), history reads of
         * it since (rereads: one that came took the entry off its first
         * ask, take_entries), a history read since whose reply was lost,
         * or one still out that reads past this entry's id. */
        px_count_view v = {
            .count = p->count > UINT32_MAX ? UINT32_MAX : (uint32_t)p->count,
            .reads_lost = a->reads_lost,
            .reclaims_lost = a->reclaims_lost,
            .reclaim_out = a->reclaim_out,
            .rereads = e->delivery.rereads,
            .history_lost = rd->history_lost - a->history_lost,
            .history_out_past = rd->reading && rd->reading_history && id_after(e->id, rd->last_id),
        };
        px_attempt at = px_decide_attempt(&v);
        e->delivery.rereads = 0;
        e->delivery.redis_count = v.count;
        e->delivery.attempt = at.attempt;
        if (at.count != v.count) set_count(e, at.count);
    }
    free(pend);
    /* Answered or lost, the batch's claims go ahead now. */
    for (px_entry *e = st->head; e; e = e->next)
        if (e->delivery.counts_wait == a->seq) e->delivery.counts_wait = 0;
    free(a);
}

static void counts_send(counts_ask *a)
{
    px_stream *st = a->st;
    char count[24];
    snprintf(count, sizeof(count), "%zu", a->n);
    const char *argv[] = { "XPENDING", st->conf->stream, st->conf->group, a->first, a->last, count,
                           st->conf->consumer };
    size_t lens[7];
    for (int i = 0; i < 7; i++) lens[i] = strlen(argv[i]);
    if (px_redis_argv(st->px->redis, st->conf->stream, 0, counts_reply_cb, a, 7, argv, lens) != PX_OK)
        counts_reply_cb(st->px->redis, NULL, a);
}

static void counts_delay_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    counts_ask *a = w->data;
    counts_unwait(a);
    if (a->st->px->stopping) {
        counts_reply_cb(a->st->px->redis, NULL, a);
        return;
    }
    counts_send(a);
}

/* The counts of the batch first..last (n entries): its number is set as
 * the entries' counts_wait before
 * counts_go sends it, after the entries exist and before their claims. */
static counts_ask *counts_new(px_stream *st, const char *first, const char *last, size_t n,
                              bool history)
{
    px_reader *rd = st->reader;
    static uint32_t seq;
    counts_ask *a = px_calloc(1, sizeof(*a));
    a->st = st;
    a->n = n;
    if (history) { /* reads and reclaims that may have counted a delivery of its entries */
        a->reads_lost = rd->lost_reads;
        a->reclaims_lost = rd->lost_reclaims;
        a->reclaim_out = rd->reclaiming;
    }
    a->history_lost = rd->history_lost;
    if (++seq == 0) seq = 1;
    a->seq = seq; /* claims wait for the counts, on one server too (see counts_reply_cb) */
    snprintf(a->first, sizeof(a->first), "%s", first);
    snprintf(a->last, sizeof(a->last), "%s", last);
    return a;
}

static void counts_go(counts_ask *a)
{
    if (px_hook.counts_delay_ms > 0) {
        counts_later(a, (double)px_hook.counts_delay_ms / 1000.0);
    } else {
        counts_send(a); /* a link down: asked again shortly (counts_reply_cb) */
    }
}

/* --- what this consumer owns -------------------------------------------------
 * Group mode: entries we track are kept fresh (their idle time reset) well
 * inside claim_idle_ms, so no XAUTOCLAIM, ours or another instance's, takes
 * over one we still work on; and Redis' delivery count of an entry is
 * idemproxy's deliveries of it (docs/guarantee.md). Both are written by one
 * script that keeps only what this consumer still owns: for each id, XPENDING
 * says who holds it; ours are claimed again with min-idle 0 and JUSTID (no
 * delivery counted), with RETRYCOUNT when ARGV[3] is a count; an id another
 * consumer holds (it took it over while our refreshes were lost) is returned
 * and left alone: a plain XCLAIM would take it back, and both instances would
 * deliver it. An id pending nowhere (acked) is left alone, as XCLAIM would.
 * KEYS[1] the stream; ARGV: group, consumer, count or "", ids. */
static px_script keep_script = {
    "local a, taken = { KEYS[1], ARGV[1], ARGV[2], '0' }, {} "
    "for i = 4, #ARGV do "
    "local p = redis.call('xpending', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1) "
    "if p[1] == nil or p[1][2] == ARGV[2] then a[#a + 1] = ARGV[i] "
    "else taken[#taken + 1] = ARGV[i] end end "
    "if #a > 4 then "
    "if ARGV[3] ~= '' then a[#a + 1] = 'RETRYCOUNT' a[#a + 1] = ARGV[3] end "
    "a[#a + 1] = 'JUSTID' redis.call('xclaim', unpack(a)) end "
    "return taken",
    ""
};

void px_reader_init(void)
{
    px_script_init(&keep_script);
}

/* The ids of 'reply' (the script's) another consumer holds: not ours. */
static void taken_over(px_stream *st, redisReply *reply)
{
    for (size_t i = 0; reply && reply->type == REDIS_REPLY_ARRAY && i < reply->elements; i++) {
        if (reply->element[i]->type != REDIS_REPLY_STRING) continue;
        px_entry *e = px_proxy_find(st, reply->element[i]->str);
        if (e) px_proxy_taken_over(e);
    }
}

typedef struct count_set {
    px_entry *e; /* held (px_step_io_hold) until the reply */
    uint32_t count;
} count_set;

static void count_set_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    count_set c = *(count_set *)priv;
    free(priv);
    if (!px_step_io_done(c.e)) return;
    /* Lost or refused: Redis' count is not known; the next wait or
     * delivery sends it again, and so does the next refresh (count_again). */
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) c.e->delivery.count_unsure = true;
    else taken_over(c.e->st, reply);
}

/* XREADGROUP counts a delivery as it hands an entry out (the delivery it is
 * read for), and so do a history read and XAUTOCLAIM. A delivery by this
 * process sets the count, and so do a read that returned an entry we already
 * track and an entry that waits undelivered (px_reader_waiting): 0 when
 * never delivered. */
static void set_count(px_entry *e, uint32_t count)
{
    px_stream_conf *sc = e->st->conf;
    char n[16];
    snprintf(n, sizeof(n), "%u", count);
    const char *argv[] = { sc->stream, sc->group, sc->consumer, n, e->id };
    size_t lens[5];
    for (int i = 0; i < 5; i++) lens[i] = strlen(argv[i]);
    count_set *c = px_malloc(sizeof(*c));
    *c = (count_set){ e, count };
    px_step_io_hold(e);
    e->delivery.redis_count = count;
    e->delivery.count_unsure = false;
    if (px_redis_script(e->st->px->redis, &keep_script, count_set_reply_cb, c, 1, 5, argv, lens) != PX_OK)
        count_set_reply_cb(e->st->px->redis, NULL, c); /* not sent: as lost */
}

void px_reader_delivering(px_entry *e)
{
    if (e->st->conf->group && (e->delivery.attempt > e->delivery.redis_count || e->delivery.count_unsure))
        set_count(e, e->delivery.attempt);
}

/* The read (or takeover) that brought 'e' counted the delivery it was read
 * for; it waits instead (busy, its claim failed): not charged
 * (docs/guarantee.md), so another instance that takes it over while it waits
 * (our refreshes lost) counts its real deliveries. Sent when it first waits, or
 * again when that was lost, written with the loop turn's claims. */
void px_reader_waiting(px_entry *e)
{
    if (e->st->conf->group && e->delivery.counts_wait == 0 &&
        (e->delivery.attempt < e->delivery.redis_count || e->delivery.count_unsure))
        set_count(e, e->delivery.attempt);
}

/* A count whose set was lost or refused (count_unsure), sent again as it was
 * meant (redis_count), at each refresh and as the command link comes back: an
 * entry a worker holds may wait long for its next delivery, and if we die or
 * another instance takes it over meanwhile, the read the set took back (a
 * history replay's, as the reader's link came back before the command link)
 * would be charged as a delivery. Not while its count is still asked. */
static void count_again(px_entry *e)
{
    if (e->delivery.count_unsure && e->delivery.counts_wait == 0) set_count(e, e->delivery.redis_count);
}

static void refresh_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    taken_over(priv, reply);
}

/* Every third of claim_idle_ms, every entry we track, PX_REFRESH_BATCH ids a
 * script (EVAL: more arguments than px_redis_script takes). */
#define PX_REFRESH_BATCH 512

static void refresh_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_stream *st = w->data;
    px_stream_conf *sc = st->conf;
    /* On a cluster, the stream's master being up is enough: a failover of
     * another master must not let another instance take over what we hold. */
    if (st->head == NULL || !px_redis_key_up(st->px->redis, sc->stream, strlen(sc->stream))) return;
    const char *argv[7 + PX_REFRESH_BATCH];
    size_t lens[7 + PX_REFRESH_BATCH];
    argv[0] = "EVAL";
    argv[1] = keep_script.body;
    argv[2] = "1";
    argv[3] = sc->stream;
    argv[4] = sc->group;
    argv[5] = sc->consumer;
    argv[6] = "";
    for (int i = 0; i < 7; i++) lens[i] = strlen(argv[i]);
    int n = 7;
    for (px_entry *e = st->head; e; e = e->next) {
        /* Claimed and still waiting for a worker's window when a refresh
         * comes (none connected, or all full): not charged either. Here,
         * not as it starts to wait, so flow control's short waits rarely
         * pay a command for it, and two. */
        if (e->state == PX_E_SEND) px_reader_waiting(e);
        else count_again(e);
        argv[n] = e->id;
        lens[n++] = strlen(e->id);
        if (n == 7 + PX_REFRESH_BATCH || e->next == NULL) {
            px_redis_argv(st->px->redis, sc->stream, 0, refresh_reply_cb, st, n, argv, lens);
            n = 7;
        }
    }
}

void px_reader_refresh_now(px_stream *st)
{
    px_reader *rd = st->reader;
    if (st->conf->group && rd && rd->state != R_STOPPED) refresh_cb(st->px->loop, &rd->refresh, 0);
}

/* The id of one [id, fields] element of a read or reclaim reply, or NULL when
 * it is not a stream id as Redis writes one (a misbehaving server's reply must
 * never become a cursor, a last_id or an XPENDING range). */
static const char *entry_id(const redisReply *en)
{
    if (en->type != REDIS_REPLY_ARRAY || en->elements < 1) return NULL;
    const redisReply *id = en->element[0];
    if (id->type != REDIS_REPLY_STRING || !px_rp_stream_id(id->str, id->len)) return NULL;
    return id->str;
}

/* Take the entries of one stream out of an XREAD/XREADGROUP/XAUTOCLAIM reply.
 * Returns how many there were; adds their field bytes to *bytes. 'history':
 * a history page, which reads lost before it may have counted too.
 * 'cursor' (a read's last_id, NULL for a reclaim) moves past each: a reclaim
 * answered during a history replay must not move the replay's place. */
static size_t take_entries(px_stream *st, redisReply *entries, bool fresh, bool history,
                           char *cursor, size_t *bytes)
{
    px_reader *rd = st->reader;
    if (entries == NULL || entries->type != REDIS_REPLY_ARRAY) return 0;
    counts_ask *counts = NULL;
    if (!fresh && st->conf->group && entries->elements > 0) {
        const char *first = entry_id(entries->element[0]);
        const char *last = entry_id(entries->element[entries->elements - 1]);
        if (first && last) counts = counts_new(st, first, last, entries->elements, history);
    }
    for (size_t i = 0; i < entries->elements; i++) {
        redisReply *en = entries->element[i];
        const char *id = entry_id(en);
        if (id == NULL || en->elements < 2) continue;
        if (cursor) snprintf(cursor, sizeof(rd->last_id), "%s", id);
        if (!fresh) {
            px_entry *known = px_proxy_find(st, id);
            if (known && known->delivery.counts_wait && counts) {
                /* Still ours, and its count not known yet (its batch's XPENDING
                 * is out, or lost and asked again): setting it back now would
                 * guess it. It waits for this page's ask instead, which sees
                 * this read's count, and takes this read off. */
                known->delivery.rereads++;
                known->delivery.counts_wait = counts->seq;
                continue;
            }
            if (known) { /* ours again: that read counted no delivery, undo it */
                known->delivery.taken = false;
                set_count(known, known->delivery.redis_count);
                continue;
            }
        }
        /* nil: pending, but deleted from the stream. An elided array is an
         * entry with more fields than any deliverable one (reply.h): bad
         * input, dead-lettered by reference (px_entry_create). */
        if (en->element[1]->type != REDIS_REPLY_ARRAY && en->element[1]->type != PX_REPLY_ELIDED) {
            px_proxy_trimmed(st, id, true);
            continue;
        }
        px_entry *e = px_entry_create(st, id, en->element[1], bytes);
        if (fresh && st->conf->group) e->delivery.redis_count = 1; /* group-less: 'e' may be gone */
        else if (counts) e->delivery.counts_wait = counts->seq;    /* group mode: still here */
    }
    if (counts) counts_go(counts);
    return entries->elements;
}

/* The newest entry of a live page: its id's ms is its server's clock. */
static void clock_sample(px_stream *st, const redisReply *reply, double now)
{
    const redisReply *sr = reply->element[reply->elements - 1];
    if (sr->type != REDIS_REPLY_ARRAY || sr->elements != 2 || sr->element[1]->type != REDIS_REPLY_ARRAY ||
        sr->element[1]->elements == 0)
        return;
    const char *id = entry_id(sr->element[1]->element[sr->element[1]->elements - 1]);
    if (id) px_redis_clock_sample(&st->reader->clock, now * 1000.0, strtod(id, NULL));
}

static void read_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_stream *st = priv;
    px_reader *rd = st->reader;
    rd->reading = false;
    if (rd->state == R_STOPPED) return;
    /* Its link went down first (link.c drops, then answers what was pending). */
    PX_ENSURE(!rd->reading_history || rd->state == R_HISTORY || rd->state == R_DOWN);
    if (reply == NULL) {
        if (rd->reading_history) rd->history_lost++;
        page_lost(st, false);
        /* Link down: the state callback restarts us. A cluster may stay up
         * while one command is lost (its node failed over): pause, then again,
         * from the history in group mode (what the lost read took is there). */
        if (px_redis_is_up(rd->link)) {
            if (st->conf->group) reader_to(st, R_CREATE);
            ev_timer_start(st->px->loop, &rd->pause);
        }
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        if (strncmp(reply->str, "NOGROUP", 7) == 0) reader_to(st, R_CREATE); /* group or key gone */
        ev_timer_start(st->px->loop, &rd->pause);                            /* a brief pause, then again */
        return;
    }
    size_t got = 0, bytes = 0;
    if (reply->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < reply->elements; i++) {
            redisReply *sr = reply->element[i];
            if (sr->type == REDIS_REPLY_ARRAY && sr->elements == 2)
                got += take_entries(st, sr->element[1], rd->state == R_LIVE,
                                    rd->state == R_HISTORY,
                                    st->conf->group == NULL || rd->state == R_HISTORY ? rd->last_id : NULL,
                                    &bytes);
        }
        page_seen(st, got, bytes);
    }
    if (rd->state == R_HISTORY && got == 0) {
        reader_to(st, R_LIVE); /* a whole replay */
        px_log_info("stream %s: reading new entries as %s/%s", st->conf->stream, st->conf->group,
                    st->conf->consumer);
    }
    /* The batch window: after a short live page, while entries arrive close
     * together, let more arrive so they are read, claimed and committed
     * together (batch_ms, or a fixed linger_ms). */
    if (rd->state != R_LIVE || got == 0) rd->batching = false;
    if (rd->state == R_LIVE && got > 0) {
        double now = ev_now(st->px->loop);
        px_batch_view v = { .got = got,
                            .asked = rd->asked,
                            .gap_ms = rd->last_page > 0 ? (now - rd->last_page) * 1000.0 : -1.0,
                            .linger_ms = st->conf->linger_ms,
                            .batch_ms = st->conf->batch_ms };
        long long wait_ms = px_decide_batch_wait(&v);
        rd->last_page = now;
        clock_sample(st, reply, now);
        rd->batching = wait_ms > 0;
        if (wait_ms > 0 && window_in_redis(st, wait_ms)) return;
        if (wait_ms > 0) {
            ev_timer_set(&rd->linger, (double)wait_ms / 1000.0, 0.);
            ev_timer_start(st->px->loop, &rd->linger);
            return;
        }
    }
    read_next(st);
}

/* The BLPOP of a window answered: nil at its end, or at once with an element
 * someone pushed to its key (the window is shorter, nothing else); an error
 * is a refusal that keeps the window local on this link (docs/redis.md),
 * unless it is one that passes (a cluster's MOVED, LOADING, ...). The read
 * behind it went on in any case. */
static void window_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_stream *st = priv;
    px_reader *rd = st->reader;
    rd->window_out = false;
    ev_timer_stop(st->px->loop, &rd->wake);
    if (rd->window_holds) { /* the answers it held first: their done marks ride with the page behind it */
        rd->window_holds = false;
        px_deliver_unhold(st->px);
    }
    if (reply && reply->type == REDIS_REPLY_NIL && rd->wakes == 0) /* timed out in Redis, unwoken */
        px_redis_clock_window(&rd->clock, rd->window_sent, ev_now(st->px->loop) * 1000.0, rd->window_asked);
    if (reply == NULL || reply->type != REDIS_REPLY_ERROR || px_decide_error_passes(reply->str)) return;
    rd->window_local = true;
    if (!rd->window_warned)
        px_log_warn("stream %s: the batch window waits in this process: BLPOP %s: %s (docs/redis.md)",
                    st->conf->stream, rd->window_key, reply->str);
    rd->window_warned = true;
}

/* The window's end passed and its BLPOP has not answered: wake Redis, whose
 * loop then ends the blocked timeout and runs the read behind it. */
static void wake_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    px_stream *st = w->data;
    px_reader *rd = st->reader;
    if (!rd->window_out || ++rd->wakes >= PX_WINDOW_WAKES) ev_timer_stop(loop, w);
    if (!rd->window_out) return;
    if (rd->window_holds) { /* overdue (a slow link, a paused Redis): the answers wait no longer */
        rd->window_holds = false;
        px_deliver_unhold(st->px);
    }
    const char *argv[] = { "PING" };
    px_redis_strv(st->px->redis, st->conf->stream, NULL, NULL, 1, argv);
}

/* The longest window whose end the workers' answers may wait for: no longer
 * than any stream's commit_ms (an answer is then read and its done mark
 * written within it, whichever stream's window held it; commit_ms 0: never),
 * and short beside ack_timeout_ms, whose flow control times the answers. */
static long long hold_limit_ms(const px_proxy *px)
{
    long long limit = px->conf->ack_timeout_ms / PX_WINDOW_HOLD_RATIO;
    for (size_t i = 0; i < px->conf->nstreams; i++)
        if (px->conf->streams[i].commit_ms < limit) limit = px->conf->streams[i].commit_ms;
    return limit;
}

/* Open a window of 'wait_ms' in Redis, the next read queued behind it: its
 * page is then the only wake-up of this process. False: use the timer. */
static bool window_in_redis(px_stream *st, long long wait_ms)
{
    px_reader *rd = st->reader;
    /* One at a time: on a cluster the read may come back before its window
     * (the BLPOP sent on to another node by an ASK while the slot migrates). */
    if (rd->window_local || rd->window_out) return false;
    /* Asked a millisecond less when that ends it nearer wait_ms (decide.h). */
    double now_ms = ev_time() * 1000.0;
    long long ask = px_decide_window_ask(wait_ms, px_redis_clock_frac(&rd->clock, now_ms));
    char secs[32];
    snprintf(secs, sizeof(secs), "%.3f", (double)ask / 1000.0);
    const char *argv[] = { "BLPOP", rd->window_key, secs };
    size_t lens[] = { 5, strlen(rd->window_key), strlen(secs) };
    if (px_redis_argv(rd->link, st->conf->stream, wait_ms + PX_WINDOW_SLACK_MS, window_reply_cb, st, 3, argv,
                      lens) != PX_OK)
        return false;
    rd->window_out = true;
    rd->window_ms = wait_ms;
    rd->window_asked = ask;
    rd->window_sent = now_ms;
    rd->wakes = 0;
    /* The workers' answers wait for its end, in their sockets (sp.h): the
     * page behind it wakes this process for both. */
    rd->window_holds = wait_ms <= hold_limit_ms(st->px);
    if (rd->window_holds) px_deliver_hold(st->px);
    ev_now_update(st->px->loop); /* the end counts from now, not from this loop turn's start */
    ev_timer_set(&rd->wake, (double)(wait_ms + PX_WINDOW_WAKE_MS) / 1000.0, (double)PX_WINDOW_WAKE_MS / 1000.0);
    ev_timer_start(st->px->loop, &rd->wake);
    read_next(st);
    return true;
}

static void create_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_stream *st = priv;
    px_reader *rd = st->reader;
    rd->reading = false;
    if (rd->state == R_STOPPED || reply == NULL) return;
    if (st->conf->group) {
        if (reply->type == REDIS_REPLY_ERROR && !px_decide_error_expected(reply->str)) {
            px_log_warn("stream %s: XGROUP CREATE: %s", st->conf->stream, reply->str);
            ev_timer_start(st->px->loop, &rd->pause);
            return;
        }
        reader_to(st, R_HISTORY);
    } else {
        /* XREVRANGE s + - COUNT 1: start after the newest entry ("$"). */
        strcpy(rd->last_id, "0-0");
        const char *newest = reply->type == REDIS_REPLY_ARRAY && reply->elements > 0
                                 ? entry_id(reply->element[0])
                                 : NULL;
        if (newest) snprintf(rd->last_id, sizeof(rd->last_id), "%s", newest);
        reader_to(st, R_LIVE);
    }
    read_next(st);
}

/* Issue the next read if the link is up, nothing is in flight and there is room. */
static void read_next(px_stream *st)
{
    px_reader *rd = st->reader;
    px_stream_conf *sc = st->conf;
    if (rd->reading || rd->state == R_STOPPED || rd->state == R_DOWN || st->px->stopping ||
        ev_is_active(&rd->linger))
        return;
    if (!px_redis_is_up(rd->link)) return;
    /* A lost reclaim's entries are in our history: replay it, once the
     * command link is back, which the replay needs to set back the count of
     * the entries it re-reads that we still hold (set_count). */
    if (rd->replay_due && rd->state == R_LIVE &&
        px_redis_key_up(st->px->redis, sc->stream, strlen(sc->stream)))
        reader_to(st, R_HISTORY);
    int rc = PX_ERR;
    rd->reading_history = false; /* nothing is in flight here */
    if (rd->state == R_CREATE) {
        if (sc->group) {
            const char *argv[] = { "XGROUP", "CREATE", sc->stream, sc->group, sc->start, "MKSTREAM" };
            size_t lens[] = { 6, 6, strlen(sc->stream), strlen(sc->group), strlen(sc->start), 8 };
            rc = px_redis_argv(rd->link, sc->stream, 0, create_reply_cb, st, 6, argv, lens);
        } else if (strcmp(sc->start, "$") == 0) {
            const char *argv[] = { "XREVRANGE", sc->stream, "+", "-", "COUNT", "1" };
            rc = px_redis_strv(rd->link, sc->stream, create_reply_cb, st, 6, argv);
        } else {
            snprintf(rd->last_id, sizeof(rd->last_id), "%s", sc->start);
            reader_to(st, R_LIVE);
            read_next(st);
            return;
        }
        if (rc == PX_OK) rd->reading = true;
        return;
    }
    /* Wait for a useful batch of room (a quarter of one), so a full pipeline
     * is not read a few entries at a time; px_reader_kick resumes us. */
    size_t n = batch_size(st);
    /* A read queued behind a window starts its BLOCK once the window ends. */
    long long block_ms = PX_READER_BLOCK_MS + (rd->window_out ? rd->window_ms + PX_WINDOW_SLACK_MS : 0);
    size_t full = (size_t)st->px->conf->max_inflight < rd->page_count
                      ? (size_t)st->px->conf->max_inflight
                      : rd->page_count;
    if (n == 0 || (n < (full + 3) / 4 && st->tracked > 0)) return;
    char count[24], block[24];
    snprintf(count, sizeof(count), "%zu", n);
    snprintf(block, sizeof(block), "%d", PX_READER_BLOCK_MS);
    if (sc->group && rd->state == R_HISTORY) {
        const char *argv[] = { "XREADGROUP", "GROUP", sc->group, sc->consumer, "COUNT", count,
                               "STREAMS", sc->stream, rd->last_id };
        size_t lens[9];
        for (int i = 0; i < 9; i++) lens[i] = strlen(argv[i]);
        rc = px_redis_argv(rd->link, sc->stream, 0, read_reply_cb, st, 9, argv, lens);
        if (rc == PX_OK) rd->reading_history = true;
    } else if (sc->group) {
        const char *argv[] = { "XREADGROUP", "GROUP", sc->group, sc->consumer, "COUNT", count,
                               "BLOCK", block, "STREAMS", sc->stream, ">" };
        size_t lens[11];
        for (int i = 0; i < 11; i++) lens[i] = strlen(argv[i]);
        rc = px_redis_argv(rd->link, sc->stream, block_ms, read_reply_cb, st, 11, argv,
                           lens);
    } else {
        const char *argv[] = { "XREAD", "COUNT", count, "BLOCK", block, "STREAMS", sc->stream,
                               rd->last_id };
        size_t lens[8];
        for (int i = 0; i < 8; i++) lens[i] = strlen(argv[i]);
        rc = px_redis_argv(rd->link, sc->stream, block_ms, read_reply_cb, st, 8, argv,
                           lens);
    }
    if (rc == PX_OK) {
        rd->reading = true;
        rd->asked = n;
    }
}

/* --- XAUTOCLAIM ------------------------------------------------------------ */

static void autoclaim_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    px_stream *st = priv;
    px_reader *rd = st->reader;
    rd->reclaiming = false;
    if (reply == NULL) {
        /* As a lost read (page_lost), and the reclaim cursor did not move:
         * the reader replays our history next, which brings back what it
         * took, and no reclaim goes out before (it would take them again,
         * counting once more). */
        page_lost(st, true);
        rd->replay_due = true;
        read_next(st);
        return;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) return;
    if (reply->element[0]->type == REDIS_REPLY_STRING &&
        px_rp_stream_id(reply->element[0]->str, reply->element[0]->len))
        snprintf(rd->autoclaim_cursor, sizeof(rd->autoclaim_cursor), "%s", reply->element[0]->str);
    size_t bytes = 0, got = take_entries(st, reply->element[1], false, false, NULL, &bytes);
    page_seen(st, got, bytes);
    if (reply->elements >= 3 && reply->element[2]->type == REDIS_REPLY_ARRAY) {
        /* Redis 7: ids that were pending but deleted; XAUTOCLAIM removed them. */
        redisReply *del = reply->element[2];
        for (size_t i = 0; i < del->elements; i++)
            if (del->element[i]->type == REDIS_REPLY_STRING &&
                px_rp_stream_id(del->element[i]->str, del->element[i]->len))
                px_proxy_trimmed(st, del->element[i]->str, false);
    }
}

static void autoclaim_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_stream *st = w->data;
    px_reader *rd = st->reader;
    px_stream_conf *sc = st->conf;
    if (st->px->stopping || rd->state != R_LIVE || rd->replay_due || rd->reclaiming) return;
    size_t n = batch_size(st);
    if (n == 0) return;
    char idle[24], count[24];
    snprintf(idle, sizeof(idle), "%lld", sc->claim_idle_ms);
    snprintf(count, sizeof(count), "%zu", n);
    const char *argv[] = { "XAUTOCLAIM", sc->stream, sc->group, sc->consumer, idle,
                           rd->autoclaim_cursor, "COUNT", count };
    size_t lens[8];
    for (int i = 0; i < 8; i++) lens[i] = strlen(argv[i]);
    if (px_redis_argv(st->px->redis, sc->stream, 0, autoclaim_reply_cb, st, 8, argv, lens) == PX_OK)
        rd->reclaiming = true;
}

/* --- janitor: consumers idle for an hour with nothing pending -------------- */

/* XINFO CONSUMERS, read by replies.c: a reply with any malformed element is
 * read as none (a "pending" that is not an integer is not 0 pending). */
static void consumers_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    px_stream *st = priv;
    if (reply == NULL) return;
    px_rp_consumer *cs = NULL;
    char why[128];
    long n = px_rp_xinfo_consumers(reply, &cs, why, sizeof(why));
    if (n < 0) px_log_warn("stream %s: XINFO CONSUMERS: malformed reply: %s", st->conf->stream, why);
    for (long i = 0; i < n; i++) {
        px_rp_consumer *c = &cs[i];
        if (c->name_len == strlen(st->conf->consumer) && memcmp(c->name, st->conf->consumer, c->name_len) == 0)
            continue;
        if (c->pending == 0 && c->idle_ms > idle_consumer_ms) {
            px_log_info("stream %s: removing idle consumer %.*s", st->conf->stream, (int)c->name_len, c->name);
            const char *argv[] = { "XGROUP", "DELCONSUMER", st->conf->stream, st->conf->group, c->name };
            size_t lens[] = { 6, 11, strlen(argv[2]), strlen(argv[3]), c->name_len };
            px_redis_argv(r, st->conf->stream, 0, NULL, NULL, 5, argv, lens);
        }
    }
    free(cs);
}

static void janitor_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_stream *st = w->data;
    px_reader *rd = st->reader;
    if (st->px->stopping || rd->state != R_LIVE) return;
    const char *argv[] = { "XINFO", "CONSUMERS", st->conf->stream, st->conf->group };
    size_t lens[] = { 5, 9, strlen(argv[2]), strlen(argv[3]) };
    px_redis_argv(st->px->redis, st->conf->stream, 0, consumers_reply_cb, st, 4, argv, lens);
}

/* --- public ------------------------------------------------------------------ */

static void pause_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    read_next(w->data);
}

static void link_state_cb(px_redis *r, bool up, void *udata)
{
    (void)r;
    px_stream *st = udata;
    px_reader *rd = st->reader;
    if (rd->state == R_STOPPED) return;
    if (!up) {
        rd->reading = false;
        reader_to(st, R_DOWN);
        return;
    }
    rd->window_local = false;                 /* a new connection: the window may wait in Redis again */
    memset(&rd->clock, 0, sizeof(rd->clock)); /* perhaps to another server, with another clock */
    /* Group mode starts over (the group may be gone, our history may hold
     * entries whose replies were lost); group-less resumes from the last id. */
    reader_to(st, st->conf->group == NULL && rd->last_id[0] ? R_LIVE : R_CREATE);
    read_next(st);
}

void px_reader_start(px_stream *st)
{
    px_reader *rd = st->reader = px_calloc(1, sizeof(*st->reader));
    px_config *c = st->px->conf;
    char name[300];
    snprintf(name, sizeof(name), "reader %s", st->conf->stream);
    px_redis_opts o;
    px_config_redis_opts(c, name, st->px->password, &o);
    rd->state = R_DOWN; /* calloc'd: where it starts */
    rd->page_count = PX_PAGE_FIRST;
    ev_timer_init(&rd->pause, pause_cb, 0.5, 0.);
    rd->pause.data = st;
    ev_timer_init(&rd->linger, pause_cb, 0., 0.);
    rd->linger.data = st;
    ev_timer_init(&rd->wake, wake_cb, 0., 0.);
    rd->wake.data = st;
    px_buf key = { 0 };
    px_buf_appends(&key, "idemproxy:window:{");
    px_cluster_tag(st->conf->stream, &key);
    px_buf_printf(&key, "}:%s", st->conf->stream);
    rd->window_key = key.data;
    rd->link = px_redis_create(st->px->loop, &o, link_state_cb, st);
    if (st->conf->group) {
        double every = (double)st->conf->claim_idle_ms / 2000.0;
        if (every < 0.1) every = 0.1;
        strcpy(rd->autoclaim_cursor, "0-0");
        ev_timer_init(&rd->autoclaim, autoclaim_cb, every, every);
        rd->autoclaim.data = st;
        ev_timer_start(st->px->loop, &rd->autoclaim);
        double fresh = (double)st->conf->claim_idle_ms / 3000.0;
        ev_timer_init(&rd->refresh, refresh_cb, fresh, fresh);
        rd->refresh.data = st;
        ev_timer_start(st->px->loop, &rd->refresh);
        if (px_hook.idle_consumer_ms > 0) idle_consumer_ms = px_hook.idle_consumer_ms;
        double janitor_s = (double)idle_consumer_ms / 1000.0 < PX_JANITOR_S
                               ? (double)idle_consumer_ms / 1000.0
                               : PX_JANITOR_S;
        if (janitor_s < 0.2) janitor_s = 0.2;
        ev_timer_init(&rd->janitor, janitor_cb, janitor_s, janitor_s);
        rd->janitor.data = st;
        ev_timer_start(st->px->loop, &rd->janitor);
    }
}

bool px_reader_live(px_stream *st)
{
    px_reader *rd = st->reader;
    return rd->link && px_redis_is_up(rd->link) && (rd->state == R_LIVE || rd->state == R_HISTORY);
}

/* The last live page opened the batch window: the next page is read within
 * batch_ms (or linger_ms), or its read is out, and its claims can carry the
 * done marks queued meanwhile (commit.c). Until a page that does not open it,
 * or an empty one. */
bool px_reader_batching(px_stream *st)
{
    px_reader *rd = st->reader;
    return rd != NULL && rd->state == R_LIVE && rd->batching;
}

void px_reader_kick(px_stream *st)
{
    read_next(st);
}

void px_reader_stop(px_stream *st)
{
    px_reader *rd = st->reader;
    if (rd == NULL || rd->state == R_STOPPED) return;
    reader_to(st, R_STOPPED);
    ev_timer_stop(st->px->loop, &rd->pause);
    ev_timer_stop(st->px->loop, &rd->linger);
    ev_timer_stop(st->px->loop, &rd->wake);
    ev_timer_stop(st->px->loop, &rd->autoclaim);
    /* The refresh goes on (on the command link) while the drain waits for
     * the workers: what they still hold must not look idle and be taken over
     * by another instance (docs/guarantee.md). px_reader_free stops it. */
    ev_timer_stop(st->px->loop, &rd->janitor);
    while (rd->counts_waiting) { /* answered as lost: 'stopping' frees them */
        counts_ask *a = rd->counts_waiting;
        counts_unwait(a);
        counts_reply_cb(st->px->redis, NULL, a);
    }
    px_redis_destroy(rd->link);
    rd->link = NULL;
}

/* After the command link is gone: its replies (XPENDING, XAUTOCLAIM, the
 * refreshes) find the reader until then. */
void px_reader_free(px_stream *st)
{
    if (st->reader) {
        ev_timer_stop(st->px->loop, &st->reader->refresh);
        free(st->reader->window_key);
    }
    free(st->reader);
    st->reader = NULL;
}
