/*
 * claim.c - the dedup decision, the leases and the releases
 * (docs/guarantee.md). What finishes an entry, its done mark, dead letter and
 * XACK, is commit.c (docs/protocol.md). Read the two top to bottom to know what
 * idemproxy does in Redis.
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
 *   write-ups' @RedisLock aspect uses them, so a consumer running the
 *   write-ups' code and idemproxy can share the keys. First `GET done` (the fast path; any
 *   value is done, the write-ups' "1" too, and idemproxy's own "1:<ms>[:<fp>]"
 *   brings its time and fingerprint). If not done, `SET lock <token> NX PX
 *   lease GET` and, in the same pipeline, `GET done` again: the check after
 *   the lock is held, which closes the race of write-up 000 (a holder that
 *   writes done and releases between our first check and our lock). The
 *   commands run in order, so this holds even when lock and done keys live
 *   on different cluster nodes.
 *
 * Then, for a claimed entry with lock_key, the resource lock: `SET lock_key
 * <token> NX PX lease GET`. With fencing, the fence script is pipelined right
 * after the SET that takes the lock the token belongs to; one counter serves
 * every lock, so tokens increase per lock as they must, and no counter key is
 * left behind per event. The script sets the counter to the larger of itself
 * plus one and the server's clock in microseconds (TIME): tokens go up one by
 * one while the counter lives, and a failover or restart that loses its last
 * increments still gives tokens above every token given before it, as long as
 * the new master's clock is ahead of the old one's at those grants (clocks
 * closer than the failover took; docs/database.md).
 *
 * Releases are a compare-and-delete script, so a holder whose lease ran out
 * never deletes the next holder's lock.
 *
 * How a command's reply comes back to its entry, how the replies of one round
 * trip make a step, and why an entry outlives its commands: step.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "claim.h"
#include "cluster.h"
#include "commit.h"
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

/* Numbers as text ("%.0f"): Lua 5.1 would print a 16-digit number in
 * exponent form and lose its last digits. Exact below 2^53 (year 2255). */
static px_script fence_script = {
    "local t = redis.call('time') "
    "local n = tonumber(t[1]) * 1000000 + tonumber(t[2]) "
    "local c = tonumber(redis.call('get', KEYS[1]) or '0') or 0 "
    "if c + 1 > n then n = c + 1 end "
    "local s = string.format('%.0f', n) "
    "redis.call('set', KEYS[1], s) "
    "return s",
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
    px_script_init(&fence_script);
}

/* Split layout on a cluster: lock and done keys on different slots may sit on
 * different nodes, where pipelined commands run in any order. Then each
 * double check waits for the reply before it (lock before the second done
 * check; done mark before the release). */
bool px_claim_split_ordered(px_entry *e)
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
size_t px_claim_flush_up(px_proxy *px, px_queue *q, void (*fn)(px_entry *), bool counts)
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
const char *px_claim_lock_value(px_entry *e, char *buf, size_t size)
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
 * two instances started in the same millisecond draw the same tokens, and both
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
 * docs/guarantee.md: an entry is sent only while its lease is known to be held.
 * Each lock records when the command whose reply last confirmed it ours was
 * sent (step.h: px_step_replying): the SET NX that took it (not one that found
 * our own token there: that left the TTL as it was), or an extension that found
 * our token. A reply about an older token of the entry confirms nothing. An
 * extension that finds the token gone is a lease lost only if a reply had
 * confirmed the lock held: a claim whose reply was lost may never have taken
 * it, and a lease never held is not lost (docs/operations.md,
 * idemproxy_lease_lost_total). */

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
 * letter, written once" in commit.c): then the refusal was final, and the entry is
 * never delivered, whoever holds it. Group-less, every instance reads every
 * entry, and reads it again after a restart. In a group, an instance that
 * stalled past claim_idle_ms (its link down, the process stopped) still holds
 * an entry another instance has since taken over and refused (a busy refusal
 * writes no done mark); it must not deliver it when it comes back. */

/* The mark is asked for once the dedup lock is ours, in a round trip of its
 * own: the refusing instance writes it while it holds that lock and releases
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
    px_dl_mark_name(e->st->conf, e->id, &b);
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
    px_claim_lock_value(e, mine, sizeof(mine));
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

/* The done key's value: nil, not done; any string, done (the write-ups' "1" too),
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
    /* The fence script's reply: the token as decimal text, 1 or more. */
    char buf[24], *end;
    unsigned long long n = 0;
    bool ok = r->type == REDIS_REPLY_STRING && r->len > 0 && r->len < sizeof(buf) &&
              r->str[0] >= '1' && r->str[0] <= '9';
    if (ok) {
        memcpy(buf, r->str, r->len);
        buf[r->len] = '\0';
        errno = 0;
        n = strtoull(buf, &end, 10);
        ok = errno == 0 && *end == '\0';
    }
    if (!ok) malformed(e);
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
static void on_released(px_entry *e, redisReply *r);

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
                   dedup ? px_claim_lock_value(e, val, sizeof(val)) : e->claim.token, e->st->lease_s);
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
    if (e->claim.marked) { /* refused already, by us or another instance */
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
    bool ordered = px_claim_split_ordered(e);
    px_step_begin(e, ordered ? claim_decided : claim_split_recheck);
    set_nx_get(e, on_lock_set, e->lock_name, px_claim_lock_value(e, val, sizeof(val)));
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
        set_nx_get(e, on_lock_set, e->lock_name, px_claim_lock_value(e, val, sizeof(val)));
        if (e->st->conf->fencing && !e->lock_key) incr_fence(e);
    } else {
        px_step_begin(e, claim_split_lock);
        exists_done(e);
    }
    px_step_end(e);
}

size_t px_claim_flush(px_proxy *px)
{
    return px_claim_flush_up(px, &px->claim_q, claim_one, true);
}

static void incr_fence(px_entry *e)
{
    px_step_script(e, &fence_script, on_fence, true, PX_FENCE_KEY, "", NULL);
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
    px_claim_lock_value(e, mine, sizeof(mine));
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
        const char *argv[] = { e->lock_name, px_claim_lock_value(e, val, sizeof(val)) };
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

/* The split layout's dedup lock released as a command of the entry's step
 * (commit.c: only after the done mark); an acked entry's reply tells whether
 * the lock was still ours. */
void px_claim_release_step(px_entry *e)
{
    char val[32];
    px_step_script(e, &release_script, on_released, true, e->lock_name,
                   px_claim_lock_value(e, val, sizeof(val)), NULL);
    e->claim.has_dedup = false;
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

static void on_released(px_entry *e, redisReply *r)
{
    if (e->outcome == PX_OUT_ACKED) on_dedup_extended(e, r); /* 0: not our lock any more */
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
