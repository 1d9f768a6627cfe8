/*
 * claim.c - the dedup decision and every write that finishes an entry
 * (SPEC 5.3 - 5.5). Read this file top to bottom to know what idemproxy does
 * in Redis.
 *
 * Claim. For each entry the outcome is claimed, duplicate or busy:
 *
 *   layout single: one key, prefix + key, holds "L:<token>" while locked and
 *   "D:<ms>[:<fingerprint>]" once done (decide.h, px_done_mark; an older
 *   idemproxy's plain "D" reads as done too). `SET k L:<token> NX PX lease
 *   GET` is the whole double-checked lock in one atomic command: nil means we
 *   took the lock on a key that was not done; "D..." means done (a duplicate,
 *   or a conflict when its fingerprint is another); "L:<our token>" means we
 *   already held it (a reply lost in a reconnect); any other "L:" means busy.
 *
 *   layout split: lock_prefix + key and done_prefix + key, exactly as the
 *   seeds' @RedisLock aspect uses them, so a consumer running the seeds' code
 *   and idemproxy can share the keys. First `GET done` (the fast path; any
 *   value is done, the seeds' "1" too, and idemproxy's own "1:<ms>[:<fp>]"
 *   brings its time and fingerprint). If not done, `SET lock <token> NX PX
 *   lease GET` and, in the same pipeline, `GET done` again: the check after
 *   the lock is held, which closes the race of seed 000 (a holder that writes
 *   done and releases between our first check and our lock). The commands run in order, so this holds even when
 *   lock and done keys live on different cluster nodes.
 *
 * Then, for a claimed entry with lock_key, the resource lock: `SET lock_key
 * <token> NX PX lease GET`. With fencing, `INCR idemproxy:fence` is pipelined
 * right after the SET that takes the lock the token belongs to; one counter
 * serves every lock, so tokens increase per lock as they must, and no counter
 * key is left behind per event.
 *
 * Finish. ACK: the done mark (`SET done PX done_ttl`, in single layout with
 * GET, whose old value tells whether our lock was still there), the lock_key
 * released; XACK only after the done mark's reply is OK. DROP or exhausted:
 * XADD to the dead-letter stream and the done mark, then XACK. Releases are a
 * compare-and-delete script, so a holder whose lease ran out never deletes the
 * next holder's lock.
 *
 * How a command's reply comes back to its entry, how the replies of one round
 * trip make a step, and why an entry outlives its commands: step.h.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "claim.h"
#include "cluster.h"
#include "decide.h"
#include "hooks.h"
#include "log.h"
#include "replies.h"
#include "step.h"

static px_script release_script = {
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
    "return 0",
    ""
};
static px_script extend_script = {
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0",
    ""
};

static uint64_t token_state[2]; /* see new_token */

void px_claim_init(void)
{
    if (getrandom(token_state, sizeof(token_state), 0) != (ssize_t)sizeof(token_state) ||
        (token_state[0] | token_state[1]) == 0) {
        struct timespec ts; /* no getrandom: time to the ns, pid and an address */
        clock_gettime(CLOCK_REALTIME, &ts);
        token_state[0] = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
        token_state[1] = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)&ts;
    }
    px_script_init(&release_script);
    px_script_init(&extend_script);
}

/* Split layout on a cluster: lock and done keys on different slots may sit on
 * different nodes, where pipelined commands run in any order. Then each
 * double check waits for the reply before it (lock before the second done
 * check; done mark before the release). */
static bool split_ordered(px_entry *e)
{
    if (!px_redis_clustered(e->st->px->redis)) return true; /* one server: one connection */
    bool same = px_redis_same_slot(e->st->px->redis, e->lock_name, e->done_name);
    return same;
}

/* Where the entry's commands go is reachable. One server: it is up. A
 * cluster: the masters of every key the entry's claim or commit may touch are
 * up, whatever the other masters do; a failover in progress on one master
 * holds only the entries with a key there (issue 15, item 11). */
static bool key_up(px_redis *r, const char *key)
{
    return key == NULL || px_redis_key_up(r, key, strlen(key));
}

static bool entry_up(px_entry *e)
{
    px_redis *r = e->st->px->redis;
    if (px_redis_is_up(r)) return true;
    if (!px_redis_clustered(r)) return false;
    px_stream_conf *sc = e->st->conf;
    if (!key_up(r, e->lock_name) || !key_up(r, e->done_name) || !key_up(r, e->lock_key) ||
        !key_up(r, sc->dead_letter) || (sc->fencing && !key_up(r, PX_FENCE_KEY)))
        return false;
    /* The dead letter's written-mark (px_dl_mark_name) hashes to the dead-letter
     * stream's slot, checked above. */
    return true;
}

/* Take every entry of 'q' whose servers are up (and, for claims, whose
 * delivery counts are in: reader.c's delivery.counts_wait) and run 'fn' on it; the
 * others stay queued, in order. */
static size_t flush_up(px_proxy *px, px_queue *q, void (*fn)(px_entry *), bool counts)
{
    bool all = px_redis_is_up(px->redis);
    if (q->n == 0 || (!all && !px_redis_clustered(px->redis))) return 0;
    px_queue keep = { 0 };
    px_entry *e;
    size_t ran = 0;
    while ((e = px_queue_pop(q)) != NULL) {
        if ((counts && e->delivery.counts_wait) || (!all && !entry_up(e))) {
            px_queue_push(&keep, e);
        } else {
            fn(e);
            ran++;
        }
    }
    while ((e = px_queue_pop(&keep)) != NULL) px_queue_push(q, e);
    return ran;
}

/* The value our dedup lock holds. */
static const char *lock_value(px_entry *e, char *buf, size_t size)
{
    /* Copied, not printed: this runs for every claim and commit and its reply,
     * and snprintf was 7% of the daemon's instructions. */
    size_t off = e->st->conf->layout == PX_LAYOUT_SINGLE ? 2 : 0, n = strlen(e->claim.token);
    if (off + n >= size) n = size - off - 1; /* never: 20 digits into 32 bytes */
    memcpy(buf, "L:", off);
    memcpy(buf + off, e->claim.token, n);
    buf[off + n] = '\0';
    return buf;
}

/* A fresh random lock token: 20 hex digits from xorshift128+, seeded from the
 * kernel once. Tokens need to be unique per holder, not secret, but unique
 * they must be, across processes too: a claim that finds its own token takes
 * the lock as "ours, from a lost reply". An earlier srandom(ms ^ pid) seed let
 * two replicas started in the same millisecond draw the same tokens, and both
 * delivered every key (test_two_replicas_never_deliver_a_key_twice caught it).
 * The state is token_state, seeded above. */
static uint64_t next_random(void)
{
    uint64_t x = token_state[0], y = token_state[1];
    token_state[0] = y;
    x ^= x << 23;
    token_state[1] = x ^ y ^ (x >> 17) ^ (y >> 26);
    return token_state[1] + y;
}

static void new_token(px_entry *e)
{
    static const char hex[] = "0123456789abcdef";
    uint64_t a = next_random(), b = next_random();
    for (size_t i = 0; i < 16; i++) e->claim.token[i] = hex[(a >> (4 * i)) & 15];
    for (size_t i = 16; i < 20; i++) e->claim.token[i] = hex[(b >> (4 * (i - 16))) & 15];
    e->claim.token[20] = '\0';
    e->claim.token_seq = px_step_next_seq(); /* replies to commands before it are not about it */
    e->claim.dedup_held_ms = e->claim.lock_held_ms = 0;
}

/* --- what is known held ------------------------------------------------------
 * SPEC 5.4: an entry is sent only while its lease is known to be held. Each
 * lock records when the command whose reply last confirmed it ours was sent
 * (step.h: px_step_replying): the SET NX that took it (not one that found our
 * own token there: that left the TTL as it was), or an extension that found
 * our token. A reply about an older token of the entry confirms nothing. An
 * extension that finds the token gone is a lease lost only if a reply had
 * confirmed the lock held: a claim whose reply was lost may never have taken
 * it, and a lease never held is not lost (SPEC 6). */

/* When the command whose reply is being read was sent, if it carried the
 * entry's current token; else 0. */
static uint64_t reply_sent_ms(px_entry *e)
{
    px_step_sent s = px_step_replying();
    return s.seq >= e->claim.token_seq ? s.sent_ms : 0;
}

bool px_claim_held(px_entry *e, uint64_t now_ms)
{
    long long lease = e->st->conf->lease_ms, timeout = e->st->px->conf->timeout_ms;
    if (!e->claim.has_dedup || !px_decide_lease_held(now_ms, e->claim.dedup_held_ms, lease, timeout))
        return false;
    return e->lock_key == NULL ||
           (e->claim.has_lock && px_decide_lease_held(now_ms, e->claim.lock_held_ms, lease, timeout));
}

/* Send `SET key value NX PX lease GET`. */
static void set_nx_get(px_entry *e, px_reply_fn *on, const char *key, const char *value)
{
    const char *px = e->st->lease_s;
    const char *argv[] = { "SET", key, value, "NX", "PX", px, "GET" };
    size_t lens[] = { 3, strlen(key), strlen(value), 2, 2, strlen(px), 3 };
    px_step_cmd(e, key, on, 7, argv, lens);
}

static void incr_fence(px_entry *e);

/* --- the refusal that is final ---------------------------------------------
 * On a stream that refuses (lock_key with on_busy: dead_letter) the claim also
 * asks whether the entry's dead letter was written (its mark, see "the dead
 * letter, written once" below): then the refusal was final, and the entry is
 * never delivered, whoever holds it. Group-less, every replica reads every
 * entry, and reads it again after a restart. In a group, a replica that
 * stalled past claim_idle_ms (its link down, the process stopped) still holds
 * an entry another replica has since taken over and refused (a busy refusal
 * writes no done mark); it must not deliver it when it comes back. */

static void dl_mark_name(px_entry *e, px_buf *b);
/* The mark is asked for once the dedup lock is ours, in a round trip of its
 * own: the refusing replica writes it while it holds that lock and releases
 * the lock after, so a mark asked for after our lock was taken cannot be
 * missed. Asked in the same round trip as the lock, on a cluster (the mark
 * and the lock on two masters, a redirect delaying one of them) the EXISTS
 * could read before the refusal and the SET NX after its release (chaos
 * seed 0, cluster, after a failover: refused, then delivered). */

static bool refusals_final(px_entry *e)
{
    px_stream_conf *sc = e->st->conf;
    return sc->dead_letter && sc->lock_key && sc->on_busy == PX_BUSY_DEAD_LETTER;
}

/* A reply of a type the command never answers (replies.h) is as good as
 * lost: the step fails, and the claim or commit is tried again. */
static void malformed(px_entry *e)
{
    e->step.failed = true;
}

static void on_mark_exists(px_entry *e, redisReply *r)
{
    long long n;
    if (!px_rp_int(r, &n)) malformed(e);
    else e->claim.marked = n == 1;
}

static void exists_mark(px_entry *e)
{
    px_buf b = { 0 };
    dl_mark_name(e, &b);
    const char *argv[2] = { "EXISTS", b.data };
    size_t lens[2] = { 6, b.len };
    px_step_cmd(e, b.data, on_mark_exists, 2, argv, lens);
    px_buf_deinit(&b);
}

/* --- claim ---------------------------------------------------------------- */

/* What the SET NX GET on the dedup lock said (decide.c reads the value). */
static void on_lock_set(px_entry *e, redisReply *r)
{
    char mine[32];
    lock_value(e, mine, sizeof(mine));
    px_lock_reply l = px_rp_lock_set(r, mine);
    if (l == PX_LOCK_NONE) {
        malformed(e);
        return;
    }
    e->claim.set = (int)l;
    e->claim.own = r->type == REDIS_REPLY_STRING && l == PX_LOCK_TAKEN;
    if (l == PX_LOCK_DONE) e->claim.found = px_decide_done_mark(r->str);
    uint64_t sent = reply_sent_ms(e);
    if (e->claim.set == PX_LOCK_TAKEN && !e->claim.own && sent) e->claim.dedup_held_ms = sent;
}

/* The done key's value: nil, not done; any string, done (the seeds' "1" too),
 * and what idemproxy's own marks keep (time, fingerprint) read from it. */
static void on_done_get(px_entry *e, redisReply *r)
{
    const char *v;
    size_t len;
    if (!px_rp_str_or_nil(r, &v, &len)) {
        malformed(e);
        return;
    }
    e->claim.done = v != NULL;
    if (e->claim.done) e->claim.found = px_decide_done_mark(v);
}

static void on_fence(px_entry *e, redisReply *r)
{
    long long n;
    if (!px_rp_int(r, &n) || n < 1) malformed(e); /* INCR: 1 or more */
    else e->claim.fence = (uint64_t)n;
}

/* Send `GET done`: as cheap as EXISTS, and it brings the mark's time and
 * fingerprint back in the same reply (no round trip of their own). */
static void exists_done(px_entry *e)
{
    const char *argv[2] = { "GET", e->done_name };
    size_t lens[2] = { 3, e->done_name_len };
    px_step_cmd(e, e->done_name, on_done_get, 2, argv, lens);
}

static void on_dedup_extended(px_entry *e, redisReply *r);
static void on_lock_extended(px_entry *e, redisReply *r);

/* The lease of a lock just taken is extended from now on, every lease_every
 * (px_claim_extend), whatever state the entry is in while it holds it. The
 * first extension falls in the second half of lease_every, jittered, so a
 * burst of claims does not become a burst of extensions. */
static void lease_start(px_entry *e)
{
    double j = 0.5 + 0.5 * (double)(random() % 1000) / 1000.0;
    e->claim.lease_next = ev_now(e->st->px->loop) + e->st->lease_every * j;
}

/* Extend one of our locks at once: 'dedup' or lock_key. */
static void extend_now(px_entry *e, const char *key, bool dedup)
{
    char val[32];
    px_step_script(e, &extend_script, dedup ? on_dedup_extended : on_lock_extended, false, key,
                   dedup ? lock_value(e, val, sizeof(val)) : e->claim.token, e->st->lease_s);
}

/* The last reply of a claim round trip is in: decide. */
static void claim_decided(px_entry *e)
{
    e->claim.in_io = false;
    if (e->step.failed) {
        /* The link went down or Redis refused: we may or may not hold the lock.
         * Keep the token; the next claim recognises our own lock. */
        e->claim.has_dedup = true;
        px_proxy_claim_failed(e);
        return;
    }
    if (refusals_final(e) && !e->claim.mark_asked && e->claim.set == PX_LOCK_TAKEN && !e->claim.done) {
        e->claim.mark_asked = true; /* the lock is ours: was the entry refused meanwhile? */
        e->claim.in_io = true;
        px_step_begin(e, claim_decided);
        exists_mark(e);
        px_step_end(e);
        return;
    }
    if (e->claim.marked) { /* refused already, by us or another replica */
        if (e->claim.set == PX_LOCK_TAKEN) {
            e->claim.has_dedup = true;
            px_claim_release(e);
        }
        px_proxy_already_dead(e);
        return;
    }
    bool examined = e->claim.examined;
    e->claim.examined = true;
    switch (px_decide_claim((px_lock_reply)e->claim.set, e->claim.done, examined)) {
    case PX_CLAIM_DUP_BEFORE_LOCK:
        px_proxy_duplicate(e, false);
        break;
    case PX_CLAIM_DUP_RELEASE:
        e->claim.has_dedup = true; /* done under our lock: the double check */
        px_claim_release(e);
        px_proxy_duplicate(e, true);
        break;
    case PX_CLAIM_DUP_AFTER_LOCK:
        px_proxy_duplicate(e, true);
        break;
    case PX_CLAIM_CLAIMED:
        e->claim.has_dedup = true;
        /* Ours now, whatever an extension said of it before this claim
         * (its reply came first): not bounced as lost (issue 30, 5). */
        e->claim.lease_lost = false;
        lease_start(e);
        /* Our own lock from a claim whose reply was lost: SET NX left its
         * TTL as it was, maybe nearly spent. Extend it now. */
        if (e->claim.own) extend_now(e, e->lock_name, true);
        if (e->lock_key) px_claim_lock_key(e);
        else px_proxy_claimed(e);
        break;
    case PX_CLAIM_BUSY:
        e->claim.has_dedup = false;
        px_proxy_busy(e, false);
        break;
    }
}

static void claim_split_lock_now(px_entry *e);

static void claim_resume_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    claim_split_lock_now(w->data);
}

/* Split layout, second half: the lock, then done again. */
static void claim_split_lock(px_entry *e)
{
    if (e->step.failed) {
        claim_decided(e);
        return;
    }
    if (e->claim.done) {
        claim_decided(e);
        return;
    }                                 /* no lock needed */
    if (px_hook.claim_pause_ms > 0) { /* the test hook (hooks.h) */
        px_log_info("debug: claim of key %s paused for %ld ms after the first check", e->key,
                    px_hook.claim_pause_ms);
        ev_timer_stop(e->st->px->loop, &e->timer);
        ev_init(&e->timer, claim_resume_cb);
        ev_timer_set(&e->timer, (double)px_hook.claim_pause_ms / 1000.0, 0.);
        e->timer.data = e;
        ev_timer_start(e->st->px->loop, &e->timer);
        return;
    }
    claim_split_lock_now(e);
}

/* Unordered slots: the lock's reply is in; now the second done check. */
static void claim_split_recheck(px_entry *e)
{
    if (e->step.failed) {
        claim_decided(e);
        return;
    }
    px_step_begin(e, claim_decided);
    exists_done(e);
    px_step_end(e);
}

static void claim_split_lock_now(px_entry *e)
{
    char val[32];
    bool ordered = split_ordered(e);
    px_step_begin(e, ordered ? claim_decided : claim_split_recheck);
    set_nx_get(e, on_lock_set, e->lock_name, lock_value(e, val, sizeof(val)));
    if (e->st->conf->fencing && !e->lock_key) incr_fence(e);
    if (ordered) exists_done(e);
    px_step_end(e);
}

static void claim_one(px_entry *e)
{
    char val[32];
    if (!e->claim.has_dedup) {
        new_token(e);
        e->claim.lease_lost = false;
    }
    e->claim.set = PX_LOCK_NONE;
    e->claim.own = false;
    e->claim.done = false;
    e->claim.found = (px_done_mark){ 0 };
    e->claim.marked = false;
    e->claim.mark_asked = false;
    e->claim.in_io = true;
    if (e->st->conf->layout == PX_LAYOUT_SINGLE) {
        px_step_begin(e, claim_decided);
        set_nx_get(e, on_lock_set, e->lock_name, lock_value(e, val, sizeof(val)));
        if (e->st->conf->fencing && !e->lock_key) incr_fence(e);
    } else {
        px_step_begin(e, claim_split_lock);
        exists_done(e);
    }
    px_step_end(e);
}

size_t px_claim_flush(px_proxy *px)
{
    return flush_up(px, &px->claim_q, claim_one, true);
}

static void incr_fence(px_entry *e)
{
    const char *argv[] = { "INCR", PX_FENCE_KEY };
    size_t lens[] = { 4, sizeof(PX_FENCE_KEY) - 1 };
    px_step_cmd(e, PX_FENCE_KEY, on_fence, 2, argv, lens);
}

/* --- lock_key -------------------------------------------------------------
 * Taken after the dedup lock, with the same token. An entry that had to wait
 * for it (wait_ms) held its dedup lock all along (extended like any other),
 * and once lock_key is taken it looks at the dedup key again: done meanwhile
 * (a copy handled elsewhere while we waited) is a duplicate; our dedup lock
 * gone (a lease lost to a Redis pause or failover) makes the entry busy, so it
 * is claimed afresh. Without the look, a copy that claimed the key after our
 * lease ran out would be delivered after our ack. */

static void on_lock_value(px_entry *e, redisReply *r)
{
    char mine[32];
    lock_value(e, mine, sizeof(mine));
    const char *v;
    size_t len;
    if (!px_rp_str_or_nil(r, &v, &len)) {
        malformed(e);
        return;
    }
    e->claim.recheck_mine = v && len == strlen(mine) && memcmp(v, mine, len) == 0;
    if (e->st->conf->layout == PX_LAYOUT_SINGLE && v && len && v[0] == 'D') {
        e->claim.done = true;
        e->claim.found = px_decide_done_mark(v);
    }
}

/* Send the look at the dedup key: its lock (and, split, the done mark). */
static void recheck_dedup(px_entry *e)
{
    const char *argv[2] = { "GET", e->lock_name };
    size_t lens[2] = { 3, e->lock_name_len };
    e->claim.done = false;
    e->claim.found = (px_done_mark){ 0 };
    e->claim.recheck_mine = false;
    px_step_cmd(e, e->lock_name, on_lock_value, 2, argv, lens);
    if (e->st->conf->layout == PX_LAYOUT_SPLIT) exists_done(e);
}

static void lock_key_decided(px_entry *e)
{
    e->claim.in_io = false;
    if (e->step.failed) {
        e->claim.has_lock = true; /* maybe; the release compares tokens */
        px_proxy_claim_failed(e);
        return;
    }
    if (e->claim.set != PX_LOCK_TAKEN) {
        e->claim.lock_waited = true;
        px_proxy_busy(e, true);
        return;
    }
    e->claim.has_lock = true;
    if (e->claim.own) extend_now(e, e->lock_key, false);
    if (e->claim.lock_waited && e->claim.done) { /* done while we waited */
        px_claim_release(e);
        px_proxy_duplicate(e, true);
    } else if (e->claim.lock_waited && !e->claim.recheck_mine) { /* our dedup lease ran out */
        px_log_entry(PX_LOG_INFO, e, "dedup lock lost while waiting for %s; claiming again",
                     e->lock_key);
        e->claim.has_dedup = true; /* release compares tokens */
        px_claim_release(e);       /* the room too: claimed afresh */
        px_proxy_busy(e, false);
    } else {
        px_proxy_claimed(e);
    }
}

/* Unordered (cluster, different nodes): lock_key's reply is in; now the look. */
static void lock_key_recheck(px_entry *e)
{
    if (e->step.failed || e->claim.set != PX_LOCK_TAKEN) {
        lock_key_decided(e);
        return;
    }
    px_step_begin(e, lock_key_decided);
    recheck_dedup(e);
    px_step_end(e);
}

static void on_lock_key_set(px_entry *e, redisReply *r)
{
    /* lock_key holds tokens only: any other value is someone else's lock. */
    const char *old;
    size_t len;
    if (!px_rp_str_or_nil(r, &old, &len)) {
        malformed(e);
        return;
    }
    bool mine = old == NULL || (len == strlen(e->claim.token) && memcmp(old, e->claim.token, len) == 0);
    e->claim.set = mine ? PX_LOCK_TAKEN : PX_LOCK_BUSY;
    e->claim.own = old != NULL && mine;
    uint64_t sent = reply_sent_ms(e);
    if (old == NULL && sent) e->claim.lock_held_ms = sent;
}

void px_claim_lock_key(px_entry *e)
{
    if (!entry_up(e)) {
        px_proxy_claim_failed(e);
        return;
    }
    e->claim.set = PX_LOCK_NONE;
    e->claim.own = false;
    e->claim.in_io = true;
    /* The look after a wait must run after the SET: pipelined on one
     * connection, or after its reply when the keys may sit on two nodes. */
    bool ordered = !e->claim.lock_waited || !px_redis_clustered(e->st->px->redis) ||
                   (px_redis_same_slot(e->st->px->redis, e->lock_key, e->lock_name) &&
                    px_redis_same_slot(e->st->px->redis, e->lock_key, e->done_name));
    px_step_begin(e, ordered ? lock_key_decided : lock_key_recheck);
    set_nx_get(e, on_lock_key_set, e->lock_key, e->claim.token);
    if (e->st->conf->fencing) incr_fence(e);
    if (ordered && e->claim.lock_waited) recheck_dedup(e);
    px_step_end(e);
}

/* --- release and lease extension ------------------------------------------ */

void px_claim_release(px_entry *e)
{
    px_redis *r = e->st->px->redis;
    if (e->claim.has_dedup) {
        char val[32];
        const char *argv[] = { e->lock_name, lock_value(e, val, sizeof(val)) };
        size_t lens[] = { e->lock_name_len, strlen(val) };
        px_redis_script(r, &release_script, NULL, NULL, 1, 2, argv, lens);
        e->claim.has_dedup = false;
    }
    if (e->claim.has_lock) {
        const char *argv[] = { e->lock_key, e->claim.token };
        size_t lens[] = { strlen(e->lock_key), strlen(e->claim.token) };
        px_redis_script(r, &release_script, NULL, NULL, 1, 2, argv, lens);
        e->claim.has_lock = false;
    }
}

/* An extension's (or a release's) answer about one of our locks, whose
 * confirmation time is 'held' (see "what is known held" above). */
static void extended(px_entry *e, redisReply *r, uint64_t *held)
{
    uint64_t sent = reply_sent_ms(e);
    if (sent == 0 || r->type != REDIS_REPLY_INTEGER) return; /* an older token's, or no answer */
    if (r->integer == 1) {
        if (sent > *held) *held = sent;
        return;
    }
    if (*held == 0) {
        /* Never confirmed ours (a claim whose reply was lost, then one that
         * found our own token): not a lease that was held, so not counted;
         * but not ours now either, so an entry waiting to be sent goes back
         * to the claim (px_deliver_flush) instead of waiting for ever. */
        e->claim.lease_lost = true;
        return;
    }
    *held = 0;
    if (!e->claim.lease_lost) {
        e->claim.lease_lost = true;
        e->st->c.lease_lost++;
        px_log_entry(PX_LOG_WARN, e, "lease lost");
    }
}

static void on_dedup_extended(px_entry *e, redisReply *r)
{
    extended(e, r, &e->claim.dedup_held_ms);
}

static void on_lock_extended(px_entry *e, redisReply *r)
{
    extended(e, r, &e->claim.lock_held_ms);
}

/* Extend every lock an entry holds, in every state in which it holds it
 * (waiting for lock_key, queued for or with a worker, being committed), each
 * every lease_every, paced (see px_proxy_create). */
void px_claim_extend(px_stream *st)
{
    px_redis *r = st->px->redis;
    bool all = px_redis_is_up(r);
    if (!all && !px_redis_clustered(r)) return;
    double now = ev_now(st->px->loop);
    size_t budget = st->lease_budget;
    for (px_entry *e = st->head; e && budget; e = e->next) {
        if (!(e->claim.has_dedup || e->claim.has_lock) || e->claim.lease_next > now) continue;
        /* A cluster with a master down: extend each lock whose master is up
         * (issue 15, item 11); one whose master is down stays due, and is
         * extended soon after its master (or the replica promoted) is back. */
        bool dedup = e->claim.has_dedup && (all || key_up(r, e->lock_name));
        bool lock = e->claim.has_lock && (all || key_up(r, e->lock_key));
        if (!dedup && !lock) continue;
        bool skipped = dedup != e->claim.has_dedup || lock != e->claim.has_lock;
        e->claim.lease_next = now + (skipped ? st->lease_every / 4 : st->lease_every);
        budget--;
        if (dedup) extend_now(e, e->lock_name, true);
        if (lock) extend_now(e, e->lock_key, false);
    }
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
    lock_value(e, mine, sizeof(mine));
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

static void on_released(px_entry *e, redisReply *r)
{
    if (e->outcome == PX_OUT_ACKED) on_dedup_extended(e, r); /* 0: not our lock any more */
}

static void on_dl_added(px_entry *e, redisReply *r)
{
    /* nil: the mark was there, written by another replica or an earlier try
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

static void mark_tag(const char *dl, px_buf *b)
{
    const char *open = strchr(dl, '{'), *close = open ? strchr(open + 1, '}') : NULL;
    if (close && close > open + 1) { /* its own hash tag */
        px_buf_append(b, open + 1, (size_t)(close - open - 1));
        return;
    }
    if (dl[0] && strchr(dl, '}') == NULL) { /* no tag: the whole name hashes */
        px_buf_appends(b, dl);
        return;
    }
    unsigned slot = px_cluster_slot(dl, strlen(dl));
    char num[16];
    for (unsigned i = 0;; i++) { /* every slot is reached within 2^17 */
        int n = snprintf(num, sizeof(num), "%u", i);
        if (px_cluster_slot(num, (size_t)n) == slot) break;
    }
    px_buf_appends(b, num);
}

/* The written-mark of a dead letter: one per entry and group (group-less:
 * one across every replica). */
void px_dl_mark_name(const px_stream_conf *sc, const char *id, px_buf *b)
{
    px_buf_appends(b, "idemproxy:dlw:{");
    mark_tag(sc->dead_letter, b);
    px_buf_printf(b, "}:%s:%s:%s", sc->stream, sc->group ? sc->group : "-", id);
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
    if (e->claim.has_dedup && e->st->conf->layout == PX_LAYOUT_SPLIT) {
        char val[32];
        px_step_script(e, &release_script, on_released, true, e->lock_name,
                       lock_value(e, val, sizeof(val)), NULL);
        e->claim.has_dedup = false;
    }
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
                   split_ordered(e);
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

size_t px_claim_commit_flush(px_proxy *px)
{
    return flush_up(px, &px->commit_q, commit_one, false);
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
 * is read again, as with a lost XACK (SPEC 5.7). */
#define PX_XACK_RIDE_MS  10
#define PX_XACK_RIDE_MAX 256

void px_claim_xack_wait_cb(struct ev_loop *loop, ev_timer *w, int revents)
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
        if (key_up(px->redis, px->streams[s].conf->stream)) return true;
    return false;
}

void px_claim_xack_flush(px_proxy *px, bool carried)
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
        if (!all && !key_up(px->redis, st->conf->stream)) continue;
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
