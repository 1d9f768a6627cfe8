/*
 * commit.c - the writes that finish an entry (docs/protocol.md, "What each
 * answer does"): its done mark, its dead letter, the release of its locks, and
 * the XACK batches. The claim that came before, and the locks and leases these
 * writes end, are claim.c.
 *
 * Finish. ACK: the done mark (`SET done PX done_ttl`, in single layout with
 * GET, whose old value tells whether our lock was still there), the lock_key
 * released; XACK only after the done mark's reply is OK. DROP or exhausted:
 * XADD to the dead-letter stream and the done mark, then XACK. The releases
 * are claim.c's compare-and-delete script.
 *
 * How a command's reply comes back to its entry, how the replies of one round
 * trip make a step, and why an entry outlives its commands: step.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claim.h"
#include "cluster.h"
#include "commit.h"
#include "decide.h"
#include "hooks.h"
#include "log.h"
#include "reader.h"
#include "replies.h"
#include "step.h"

/* A reply of a type the command never answers (replies.h) is as good as
 * lost: the step fails, and the commit is tried again. */
static void malformed(px_entry *e)
{
    e->step.failed = true;
}

/* --- commit: done mark, dead letter ---------------------------------------- */

/* Our done mark's value: the time of its first write (a retry writes the
 * same), and the fingerprint (decide.h: px_done_mark). */
static size_t done_value(px_entry *e, char buf[PX_DONE_MARK_MAX])
{
    if (e->claim.done_ms == 0) e->claim.done_ms = px_now_ms();
    char lead = e->st->conf->layout == PX_LAYOUT_SINGLE ? 'D' : '1';
    return px_done_mark_write(buf, lead, e->claim.done_ms, e->has_fp, e->fp);
}

static void on_done_set(px_entry *e, redisReply *r)
{
    char mine[32], done[PX_DONE_MARK_MAX];
    if (e->st->conf->layout != PX_LAYOUT_SINGLE || e->outcome != PX_OUT_ACKED) return;
    px_claim_lock_value(e, mine, sizeof(mine));
    done_value(e, done);
    /* A retry after a lost reply reads back the mark its first try may have
     * written: that is ours, not a lost lease. (Were the lease lost and the
     * key done by another holder in that same window, this cannot tell.) */
    if (e->claim.done_sets > 1 && r->type == REDIS_REPLY_STRING && strcmp(r->str, done) == 0) return;
    if (!(r->type == REDIS_REPLY_STRING && strcmp(r->str, mine) == 0) && !e->claim.lease_lost) {
        e->claim.lease_lost = true;
        e->st->c.lease_lost++;
        px_log_entry(PX_LOG_WARN, e, "late ack after the lease was lost (done mark written)");
    }
}

static void on_dl_added(px_entry *e, redisReply *r)
{
    /* nil: the mark was there, written by another instance or an earlier try
     * of ours whose reply was lost; not counted again */
    const char *id;
    size_t len;
    if (!px_rp_str_or_nil(r, &id, &len)) {
        malformed(e);
        return;
    }
    e->claim.dl_written = true;
    e->claim.dl_other = id == NULL;
}

static void commit_decided(px_entry *e)
{
    px_proxy_committed(e, !e->step.failed);
}

/* --- the dead letter, written once ------------------------------------------
 * A dead letter whose reply is lost (the link dropped, or the write overran
 * timeout_ms) may or may not have been applied, and the commit is retried.
 * The XADD therefore runs in a script with a written-mark:
 *
 *   idemproxy:dlw:{<slot tag>}:<stream>:<group or ->:<entry id>
 *
 * checked and set in the same atomic step as the XADD (it holds the dead
 * letter's id, for done_ttl_ms), so a retry finds it and writes nothing.
 * Not an XADD with an id derived from the entry's: dead-letter ids must grow,
 * and entries of several streams (or replayed ones) arrive out of order. The
 * script's two keys must share a cluster slot: the mark's {tag} is the
 * dead-letter stream's own hash tag, or its whole name when it has none (and
 * no '}'), or failing both a number found to hash to the same slot. The mark
 * is checked first and set last, so a script that fails (a dead-letter key of
 * the wrong type) writes nothing and a retry tries again.
 *
 * Lua calls take fewer than 8,000 arguments: an entry with more fields than
 * PX_DL_MAX_FIELDS gets a dead letter by reference, as an oversized one. */
#define PX_DL_MAX_FIELDS 3900

static const char dead_letter_lua[] =
    "if redis.call('exists', KEYS[2]) == 1 then return false end "
    "local id = redis.call('xadd', KEYS[1], '*', unpack(ARGV, 2)) "
    "redis.call('set', KEYS[2], id, 'px', ARGV[1]) return id";


/* The written-mark of a dead letter: one per entry and group (group-less:
 * one across every instance). */
void px_dl_mark_name(const px_stream_conf *sc, const char *id, px_buf *b)
{
    px_buf_appends(b, "idemproxy:dlw:{");
    px_cluster_tag(sc->dead_letter, b);
    px_buf_printf(b, "}:%s:%s:%s", sc->stream, sc->group ? sc->group : "-", id);
}

/* The claim a cluster's redrive takes on a dead letter (ops.c): in the
 * dead-letter stream's slot too, so one script checks the dead letter and
 * takes the claim together. */
void px_dl_redrive_claim_name(const px_stream_conf *sc, const char *dlid, px_buf *b)
{
    px_buf_appends(b, "idemproxy:redrive:{");
    px_cluster_tag(sc->dead_letter, b);
    px_buf_printf(b, "}:%s:%s", sc->dead_letter, dlid);
}

static void dl_mark_name(px_entry *e, px_buf *b)
{
    px_dl_mark_name(e->st->conf, e->id, b);
}

/* XADD the entry to the dead-letter stream with the idemproxy-* fields, once.
 * The entry's fields come first, exactly as they were (a producer's own
 * "idemproxy-stream" included), then idemproxy's four, last and in this
 * order: inspect and redrive (ops.c, dl_meta_of) read them by position, so a
 * producer cannot write them. */
static void dead_letter_add(px_entry *e, const char *reason)
{
    px_stream_conf *sc = e->st->conf;
    if (sc->dead_letter == NULL || e->claim.dl_written) return;
    /* An oversized entry is not copied: its reason and id are the reference. */
    size_t nf = e->oversized || e->nfields > PX_DL_MAX_FIELDS ? 0 : e->nfields;
    size_t argc = 6 + 2 * nf + 8;
    const char **argv = px_malloc(sizeof(char *) * argc);
    size_t *lens = px_malloc(sizeof(size_t) * argc);
    char attempts[16];
    snprintf(attempts, sizeof(attempts), "%u", e->delivery.attempt);
    px_buf mark = { 0 };
    dl_mark_name(e, &mark);
    size_t n = 0;
#define ARG(p, l) \
    do { \
        argv[n] = (p); \
        lens[n] = (l); \
        n++; \
    } while (0)
    ARG("EVAL", 4);
    ARG(dead_letter_lua, sizeof(dead_letter_lua) - 1);
    ARG("2", 1);
    ARG(sc->dead_letter, strlen(sc->dead_letter));
    ARG(mark.data, mark.len);
    ARG(e->st->ttl_s, strlen(e->st->ttl_s));
    for (size_t i = 0; i < nf; i++) {
        ARG(e->fields[i].name, e->fields[i].name_len);
        ARG(e->fields[i].value, e->fields[i].value_len);
    }
    ARG("idemproxy-reason", 16);
    ARG(reason, strlen(reason));
    ARG("idemproxy-stream", 16);
    ARG(sc->stream, strlen(sc->stream));
    ARG("idemproxy-entry-id", 18);
    ARG(e->id, strlen(e->id));
    ARG("idemproxy-attempts", 18);
    ARG(attempts, strlen(attempts));
#undef ARG
    px_step_cmd(e, sc->dead_letter, on_dl_added, (int)n, argv, lens);
    px_buf_deinit(&mark);
    free(argv);
    free(lens);
}

/* The releases that end a commit: the split layout's dedup lock (only after
 * the done mark: a release first would let another holder in before done is
 * visible), lock_key, or a dedup lock not marked done. */
static void commit_release(px_entry *e)
{
    if (e->claim.has_dedup && e->st->conf->layout == PX_LAYOUT_SPLIT) px_claim_release_step(e);
    px_claim_release(e);
}

/* Unordered slots: the done mark's reply is in; now the releases. */
static void commit_release_after(px_entry *e)
{
    if (e->step.failed) {
        commit_decided(e);
        return;
    }
    px_step_begin(e, commit_decided);
    commit_release(e);
    px_step_end(e);
}

static void commit_one(px_entry *e)
{
    px_stream_conf *sc = e->st->conf;
    if (e->bad) {
        px_step_begin(e, commit_decided);
        dead_letter_add(e, e->reason);
        px_step_end(e);
        return;
    }
    const char *ttl = e->st->ttl_s;
    bool ordered = !(e->key && e->mark_done && e->claim.has_dedup && sc->layout == PX_LAYOUT_SPLIT) ||
                   px_claim_split_ordered(e);
    px_step_begin(e, ordered ? commit_decided : commit_release_after);
    if (e->outcome == PX_OUT_DEAD_LETTERED) dead_letter_add(e, e->reason ? e->reason : "dropped");
    if (e->key && e->mark_done) {
        char val[PX_DONE_MARK_MAX];
        size_t vn = done_value(e, val);
        const char *argv[] = { "SET", e->done_name, val, "PX", ttl, "GET" };
        size_t lens[] = { 3, e->done_name_len, vn, 2, strlen(ttl), 3 };
        if (sc->layout == PX_LAYOUT_SINGLE && e->claim.done_sets < 255) e->claim.done_sets++;
        px_step_cmd(e, e->done_name, on_done_set, sc->layout == PX_LAYOUT_SINGLE ? 6 : 5, argv,
                    lens);
        if (sc->layout == PX_LAYOUT_SINGLE) e->claim.has_dedup = false; /* the done mark replaced it */
    }
    if (ordered) commit_release(e);
    px_step_end(e);
}

/* --- the done mark's ride ---------------------------------------------------
 * An ACK's done mark is written after the worker has the entry: waiting does
 * not delay any delivery. While the batch window of its stream is open (a page
 * is read within batch_ms, reader.c), the claims of that page are written
 * soon: a commit queued in a loop turn that writes no claim waits for them, at
 * most commit_ms (the timer px->commit_wait), so the done marks of the entries
 * acked meanwhile and those claims go in one write and their replies come back
 * in one read: at 1,000 entries/s one wake-up of the loop fewer per delivered
 * entry (issue 34). A stream whose window is shut (entries arriving alone), or
 * commit_ms 0, writes them at once, as before. Nothing else changes: the XACK
 * still follows the done mark's reply, the lease is still extended (and its
 * loss seen by the done mark's GET) while the entry waits, and a crash
 * meanwhile leaves the entry pending, to be delivered again as before any
 * done mark (docs/guarantee.md). Not armed while Redis is out of reach. */
void px_commit_wait_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    px->commit_due = true; /* flush_cb, which runs before the loop waits again, writes them */
}

/* The least commit_ms of the queued entries' streams, 0 if one of them has
 * its batch window shut (or commit_ms 0). */
static long long commit_ride_ms(px_proxy *px)
{
    long long ms = PX_LINGER_MAX_MS;
    for (px_entry *e = px->commit_q.head; e != NULL; e = e->qnext) {
        if (!px_reader_batching(e->st)) return 0;
        if (e->st->conf->commit_ms < ms) ms = e->st->conf->commit_ms;
    }
    return ms;
}

size_t px_commit_flush(px_proxy *px, bool carried)
{
    if (px->commit_q.n == 0 || !px_redis_is_up(px->redis)) {
        /* nothing to write, or nowhere (a cluster writes what it can) */
        ev_timer_stop(px->loop, &px->commit_wait);
        px->commit_due = false;
        if (px->commit_q.n == 0 || !px_redis_clustered(px->redis)) return 0;
        return px_claim_flush_up(px, &px->commit_q, commit_one, false);
    }
    px_commit_view v = { .carried = carried,
                         .due = px->commit_due,
                         .stopping = px->stopping,
                         .queued = px->commit_q.n,
                         .wait_ms = 0 };
    if (!carried && !px->commit_due && !px->stopping && px->commit_q.n < PX_COMMIT_RIDE_MAX)
        v.wait_ms = commit_ride_ms(px);
    long long ms = px_decide_commit_wait(&v);
    if (ms > 0) {
        /* armed once, not per entry; sooner for a stream of a shorter commit_ms */
        if (!ev_is_active(&px->commit_wait) ||
            ev_timer_remaining(px->loop, &px->commit_wait) > (double)ms / 1000.0) {
            ev_timer_stop(px->loop, &px->commit_wait);
            ev_timer_set(&px->commit_wait, (double)ms / 1000.0, 0.);
            ev_timer_start(px->loop, &px->commit_wait);
        }
        return 0;
    }
    ev_timer_stop(px->loop, &px->commit_wait);
    px->commit_due = false;
    return px_claim_flush_up(px, &px->commit_q, commit_one, false);
}

/* --- XACK ------------------------------------------------------------------
 * An XACK is not on anyone's path: the worker has the entry, the done mark is
 * written (or it was a copy). So it rides along with the next claim or commit
 * written to Redis, in the same write, and its reply comes back in the same
 * read as theirs: at 1,000 entries/s that is one wake-up and one write fewer
 * per entry (issue 18). It waits at most PX_XACK_RIDE_MS for a carrier (the
 * timer px->xack_wait, armed once, not per entry; a test can lengthen it:
 * IDEMPROXY_DEBUG_XACK_RIDE_MS), or until PX_XACK_RIDE_MAX
 * ids are queued, and never once the proxy stops. A wait changes nothing that
 * anyone can tell apart from a slower XACK: the entry stays pending those few
 * milliseconds, and a crash then leaves it pending, to be found done when it
 * is read again, as with a lost XACK (docs/guarantee.md). */
#define PX_XACK_RIDE_MS  10
#define PX_XACK_RIDE_MAX 256

void px_commit_xack_wait_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    px->xack_due = true; /* flush_cb, which runs before the loop waits again, sends them */
}

typedef struct xack_batch {
    px_entry **v;
    size_t n;
} xack_batch;

/* A batch holds its entries (step.h: px_step_io_hold), like any command
 * about an entry: shutdown may finish them while the XACK is in flight, and
 * the reply (or the link's teardown) must find them still allocated. */
static void xack_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    xack_batch *b = priv;
    bool ok = reply && reply->type == REDIS_REPLY_INTEGER;
    for (size_t i = 0; i < b->n; i++) {
        px_entry *e = b->v[i];
        e->claim.in_io = false;
        if (!px_step_io_done(e)) continue;
        if (ok) px_entry_finish(e, e->outcome);
        else px_proxy_xack_failed(e); /* written again after a pause */
    }
    free(b->v);
    free(b);
}

/* Some stream's XACK could be written now: the server is up, or on a
 * cluster, the master of some stream. */
static bool xack_writable(px_proxy *px)
{
    if (px_redis_is_up(px->redis)) return true;
    if (!px_redis_clustered(px->redis)) return false;
    for (size_t s = 0; s < px->nstreams; s++)
        if (px_redis_key_up(px->redis, px->streams[s].conf->stream, strlen(px->streams[s].conf->stream))) return true;
    return false;
}

void px_commit_xack_flush(px_proxy *px, bool carried)
{
    /* Nothing queued, or nowhere to write it: no ride is waited for. While
     * Redis is down, a ride armed anew after each one ran out added a wake-up
     * 10 ms after every other one; the first loop turn with Redis back arms it. */
    if (px->xack_q.n == 0 || !xack_writable(px)) {
        ev_timer_stop(px->loop, &px->xack_wait);
        px->xack_due = false;
        return;
    }
    if (!carried && !px->xack_due && !px->stopping && px->xack_q.n < PX_XACK_RIDE_MAX) {
        if (!ev_is_active(&px->xack_wait)) {
            long long ms = px_hook.xack_ride_ms > 0 ? px_hook.xack_ride_ms : PX_XACK_RIDE_MS;
            ev_timer_set(&px->xack_wait, (double)ms / 1000.0, 0.);
            ev_timer_start(px->loop, &px->xack_wait);
        }
        return;
    }
    px->xack_due = false;
    ev_timer_stop(px->loop, &px->xack_wait);
    bool all = px_redis_is_up(px->redis);
    if (!all && !px_redis_clustered(px->redis)) return;
    /* One XACK per stream, naming every id that stream finished; on a
     * cluster with a master down, for the streams whose master is up. */
    for (size_t s = 0; s < px->nstreams; s++) {
        px_stream *st = &px->streams[s];
        if (!all && !px_redis_key_up(px->redis, st->conf->stream, strlen(st->conf->stream))) continue;
        xack_batch *b = px_calloc(1, sizeof(*b));
        b->v = px_malloc(sizeof(px_entry *) * px->xack_q.n);
        px_queue keep = { 0 };
        px_entry *e;
        while ((e = px_queue_pop(&px->xack_q)) != NULL) {
            if (e->st == st) b->v[b->n++] = e;
            else px_queue_push(&keep, e);
        }
        px->xack_q = keep;
        if (b->n == 0) {
            free(b->v);
            free(b);
            continue;
        }
        size_t argc = 3 + b->n;
        const char **argv = px_malloc(sizeof(char *) * argc);
        size_t *lens = px_malloc(sizeof(size_t) * argc);
        argv[0] = "XACK";
        lens[0] = 4;
        argv[1] = st->conf->stream;
        lens[1] = strlen(st->conf->stream);
        argv[2] = st->conf->group;
        lens[2] = strlen(st->conf->group);
        for (size_t i = 0; i < b->n; i++) {
            argv[3 + i] = b->v[i]->id;
            lens[3 + i] = strlen(b->v[i]->id);
            b->v[i]->claim.in_io = true;
            px_step_io_hold(b->v[i]);
        }
        if (px_redis_argv(px->redis, st->conf->stream, 0, xack_reply_cb, b, (int)argc, argv, lens) != PX_OK) {
            for (size_t i = 0; i < b->n; i++) {
                b->v[i]->claim.in_io = false;
                bool kept = px_step_io_done(b->v[i]); /* never sent: not finished meanwhile */
                PX_ASSERT(kept);
                (void)kept;
                px_queue_push(&px->xack_q, b->v[i]);
            }
            free(b->v);
            free(b);
        }
        free(argv);
        free(lens);
    }
}
