/*
 * proxy.h - the daemon's state and the life of an entry.
 *
 * An entry is read once from its stream (reader.c), parsed and given its key
 * (event.c), claimed in Redis (claim.c), delivered to a worker (deliver.c) and
 * finished when the worker's answer is written back (commit.c: done mark,
 * dead letter, XACK). proxy.c moves entries between those steps:
 *
 *   READ -> CLAIM -+-> claimed --> SEND -> SENT --ACK/DROP--> COMMIT -> XACK -> gone
 *                  |                        \--RETRY/timeout--> release, BACKOFF -> CLAIM
 *                  +-> duplicate ---------------------------------------> XACK -> gone
 *                  +-> busy --> PARKED (timer) --------------------------> CLAIM
 *
 * Work queued during one loop iteration is flushed once, in an ev_prepare
 * watcher, so every step pipelines across all entries that reached it.
 */
#ifndef PX_PROXY_H
#define PX_PROXY_H

#include <ev.h>
#include <json-c/json.h>

#include "codec.h"
#include "config.h"
#include "entry.h"
#include "log.h"
#include "redis.h"

/* Lease extension pacing (claim.c): each held lease is extended every
 * lease_ms / 3, by a timer that ticks this often in that time and extends only
 * the entries that are due, at most 'lease_budget' a tick. */
#define PX_LEASE_TICKS 16

typedef struct px_proxy px_proxy;
typedef struct px_deliver px_deliver; /* deliver.c's state */
typedef struct px_metrics px_metrics; /* metrics.c's state */
typedef struct px_reader px_reader;   /* reader.c's state of one stream */

/*
 * Per-stream counters of docs/operations.md, declared once: the struct field,
 * the metric family, its label and the family's help text (on its first member;
 * NULL on the others). metrics.c exports every one of them, at 0 from the
 * start, in this order (a family's members are adjacent).
 */
#define PX_STREAM_COUNTERS(X) \
    X(entries_read, "idemproxy_entries_read_total", NULL, NULL, \
      "Entries read from the stream, once each (re-examinations and redeliveries are not reads).") \
    X(acked, "idemproxy_outcomes_total", "outcome", "acked", \
      "Entries that left, by outcome; read = sum of outcomes + pending.") \
    X(duplicate, "idemproxy_outcomes_total", "outcome", "duplicate", NULL) \
    X(dead_lettered, "idemproxy_outcomes_total", "outcome", "dead_lettered", NULL) \
    X(skipped, "idemproxy_outcomes_total", "outcome", "skipped", NULL) \
    X(deliveries, "idemproxy_deliveries_total", NULL, NULL, \
      "Deliveries sent to a worker, redeliveries included.") \
    X(dup_before_lock, "idemproxy_duplicates_total", "stage", "before_lock", \
      "Copies skipped because their key was done, by when that was seen.") \
    X(dup_after_lock, "idemproxy_duplicates_total", "stage", "after_lock", NULL) \
    X(lock_busy, "idemproxy_lock_busy_total", NULL, NULL, \
      "Claims that found a lock (dedup or lock_key) held elsewhere.") \
    X(acks_ack, "idemproxy_acks_total", "status", "ack", \
      "Answers from workers, by status; timeout and invalid count as retries.") \
    X(acks_retry, "idemproxy_acks_total", "status", "retry", NULL) \
    X(acks_drop, "idemproxy_acks_total", "status", "drop", NULL) \
    X(acks_timeout, "idemproxy_acks_total", "status", "timeout", NULL) \
    X(acks_invalid, "idemproxy_acks_total", "status", "invalid", NULL) \
    X(ack_timeouts, "idemproxy_ack_timeouts_total", NULL, NULL, \
      "Deliveries with no answer within ack_timeout_ms.") \
    X(dead_letters, "idemproxy_dead_letters_total", NULL, NULL, \
      "Entries dead-lettered (DROP, max_deliveries, bad input, busy refusal).") \
    X(lease_lost, "idemproxy_lease_lost_total", NULL, NULL, \
      "Leases found gone while the app worked (the fencing token guards that work).") \
    X(trimmed, "idemproxy_trimmed_total", NULL, NULL, \
      "Pending entries trimmed or deleted from the stream, acked away.") \
    X(conflicts, "idemproxy_conflicts_total", NULL, NULL, \
      "Copies whose key was done with another fingerprint (on_conflict), never delivered.")

/* A Prometheus histogram with fixed buckets (upper bounds in seconds). */
#define PX_HIST_BUCKETS 14
typedef struct px_hist {
    unsigned long long counts[PX_HIST_BUCKETS + 1]; /* the last one is +Inf */
    double sum;
    unsigned long long count;
} px_hist;

/*
 * A stream block, its fields grouped by the module that owns them, as
 * px_entry's are: the stream itself, its entries and counters (proxy.c; the
 * counters and histograms are exported by metrics.c), the reader (reader.c,
 * opaque), the leases (claim.c) and the group's XINFO numbers (metrics.c).
 */
struct px_stream {
    px_proxy *px;         /* (ref) */
    px_stream_conf *conf; /* (ref) */
    size_t index;
    px_entry *head; /* tracked entries of this stream */
    size_t tracked;
    size_t waiting_out; /* of those, copies parked behind another holder's lock (proxy.c) */
    size_t leaving;     /* of those, committed (or copies) and only awaiting XACK (proxy.c) */
#define PX_COUNTER_FIELD(n, family, label, value, help) unsigned long long n;
    struct {
        PX_STREAM_COUNTERS(PX_COUNTER_FIELD)
    } c;
#undef PX_COUNTER_FIELD
    px_hist ack_latency; /* delivery sent -> answer received */
    px_hist lock_wait;   /* first claim attempt -> locks held */
    px_hist dup_age;     /* a copy found done: the done mark's age (its time, decide.h) */

    px_reader *reader; /* reader.c: its link, state, page and cursors (opaque) */

    struct {                 /* claim.c (set up by px_proxy_create): its lease */
        char lease_s[24];    /* lease_ms as text, for commands */
        char ttl_s[24];      /* done_ttl_ms as text, for commit.c's done marks */
        ev_timer lease;      /* ticks PX_LEASE_TICKS times per lease_every */
        double lease_every;  /* seconds between two extensions of one lease: lease_ms / 3 */
        size_t lease_budget; /* entries extended at most per tick (bounds the bursts) */
    };                       /* unnamed: claim.c's lines read st->lease_s as before */

    /* Group mode, with metrics on: the group's XINFO GROUPS numbers, refreshed
     * every PX_GROUP_INFO_S by metrics.c (not exported while unknown). */
    struct {               /* metrics.c */
        bool busy;         /* this block's XINFO GROUPS is in flight */
        bool known;        /* pending is the last answer's */
        bool lag_known;    /* lag too (Redis answers nil when it cannot tell) */
        long long pending; /* entries delivered to the group and not acked */
        long long lag;     /* entries not yet delivered to the group */
    } info;
};

struct px_proxy {
    struct ev_loop *loop; /* (ref) */
    px_config *conf;      /* (ref) */
    px_redis *redis;      /* the command link (claims, commits, acks) */
    char *password;       /* from the url or password_file; never logged */
    px_stream *streams;
    size_t nstreams;
    size_t tracked;     /* entries read and not yet gone, all streams */
    size_t waiting_out; /* of those, copies parked behind another holder's lock */
    size_t leaving;     /* of those, committed (or copies) and only awaiting XACK */
    px_queue claim_q, send_q, commit_q, xack_q;
    ev_timer xack_wait;   /* the longest an XACK waits for a claim or commit to ride with */
    bool xack_due;        /* that wait is over: flush_cb sends the XACKs */
    ev_timer commit_wait; /* the longest a done mark waits for a claim to ride with */
    bool commit_due;      /* that wait is over: flush_cb writes the commits */
    px_deliver *deliver;  /* deliver.c state */
    px_metrics *metrics;  /* metrics.c state; NULL when disabled */
    ev_prepare flush;     /* flushes the queues once per loop iteration */
    ev_check woke;        /* loop_busy: the loop is back from epoll_wait ... */
    ev_prepare sleeps;    /* ... and about to wait again (its last prepare) */
    double woke_at;       /* monotonic seconds; 0 before the first wake-up */
    px_hist loop_busy;    /* per loop iteration: woke -> sleeps */
    ev_signal sigterm, sigint;
    ev_timer grace; /* shutdown grace */
    bool stopping;

    struct px_trace *trace; /* trace.c state; NULL when tracing is off (the default) */
};

/* proxy.c */
px_proxy *px_proxy_create(struct ev_loop *loop, px_config *conf, const char *password);
void px_proxy_destroy(px_proxy *px);
void px_proxy_read(px_entry *e);                       /* a new entry (px_entry_create): tracked, then its verdict */
void px_entry_finish(px_entry *e, px_outcome outcome); /* after XACK (or none needed) */
void px_proxy_claimed(px_entry *e);
void px_proxy_busy(px_entry *e, bool lock_key_busy);
void px_proxy_duplicate(px_entry *e, bool after_lock);
void px_proxy_claim_failed(px_entry *e);
void px_proxy_already_dead(px_entry *e);
void px_proxy_reclaim_unsent(px_entry *e);
void px_proxy_taken_over(px_entry *e);
void px_proxy_on_answer(px_entry *e, px_ack_status status, const char *reason);
void px_proxy_committed(px_entry *e, bool ok);
void px_proxy_xack_failed(px_entry *e);
void px_proxy_bad_entry(px_entry *e, const char *why);
void px_proxy_trimmed(px_stream *st, const char *id, bool ack);
px_entry *px_proxy_find(px_stream *st, const char *id);
size_t px_proxy_room(px_proxy *px);
size_t px_proxy_room_for(px_stream *st);

#endif
