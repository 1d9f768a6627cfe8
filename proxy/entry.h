/*
 * entry.h - one entry of a stream: its fields, grouped by the module that
 * owns them, its states, and the one way it changes state (px_entry_to,
 * entry.c, which holds the table of legal transitions next to it).
 */
#ifndef PX_ENTRY_H
#define PX_ENTRY_H

#include <ev.h>
#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdint.h>

#include "codec.h"
#include "decide.h"
#include "log.h"
#include "px.h"

typedef struct px_stream px_stream;
typedef struct px_entry px_entry;
typedef void px_step_fn(px_entry *e);

typedef enum {
    PX_E_CLAIM,    /* queued for (or in) a claim round trip */
    PX_E_PARKED,   /* busy: its timer brings it back to CLAIM */
    PX_E_LOCKWAIT, /* dedup lock held, lock_key busy: retried within wait_ms */
    PX_E_SEND,     /* claimed, queued for the socket */
    PX_E_SENT,     /* with a worker; its timer is the ack timeout */
    PX_E_BACKOFF,  /* released after RETRY/timeout; its timer brings it back */
    PX_E_COMMIT,   /* answer known; done mark / dead letter being written */
    PX_E_XACK,     /* finished; XACK queued or in flight (group mode) */
    PX_E_GONE,     /* finished (px_entry_finish): never stored in 'state'; sets 'gone' */
} px_entry_state;

typedef enum { /* what the entry leaves as (docs/operations.md outcomes) */
               PX_OUT_NONE = 0,
               PX_OUT_ACKED,
               PX_OUT_DUPLICATE,
               PX_OUT_DEAD_LETTERED,
               PX_OUT_SKIPPED,
} px_outcome;

/*
 * An entry, its fields grouped by the module that owns them: the entry itself
 * and its verdict (proxy.c; its event and keys: event.c), then claim (claim.c:
 * locks, leases; commit.c: the writes that finish it), step (step.c: its
 * commands in flight), delivery (deliver.c, and reader.c for Redis' delivery counts) and
 * park (proxy.c: waiting for a lock or a holder). A module reads another's
 * part where it must (deliver.c sends claim.fence); it writes only its own,
 * apart from the hub, proxy.c, which hands entries between them.
 */
struct px_entry {
    px_stream *st;        /* (ref) */
    px_entry_state state; /* changed only by px_entry_to */
    char *id;             /* entry id; owned, in 'blob' */
    px_field *fields;     /* all fields, in stream order; point into 'blob' */
    size_t nfields;
    int payload_idx;       /* index of the payload field, or -1 */
    char *blob;            /* id and field bytes; 'fields' and 'blob' live in
                                      the entry's own allocation, after it */
    size_t bytes;          /* size of the entry's fields, for max_entry_bytes */
    char *key;             /* rendered dedup key; owned; NULL for bad input */
    const char *lock_name; /* Redis key names of the dedup lock and the done mark, */
    const char *done_name; /* in key's allocation (event.c); the same in */
    size_t lock_name_len;  /* layout single */
    size_t done_name_len;
    char *lock_key;        /* rendered lock_key; owned; NULL when none */
    bool has_fp;           /* the stream has a fingerprint: 'fp' is the entry's */
    uint64_t fp;           /* px_hash64 of the fingerprint's rendering (event.c) */
    bool bad;              /* bad input: the commit is its dead letter */
    bool oversized;        /* over max_entry_bytes: its dead letter is a reference */
    bool wide;             /* ... with more fields than any deliverable entry: bytes is their count */
    px_outcome outcome;    /* set when the final answer is known */
    bool mark_done;        /* the commit writes the done mark */
    char *reason;          /* owned: dead-letter reason, or NULL */
    bool gone;             /* sent to PX_E_GONE (px_entry_to); freed when step.io reaches 0 */
    ev_timer timer;        /* park / backoff / lock wait / ack timeout */
    px_entry *prev, *next; /* the stream's list of tracked entries */
    px_entry *qnext;       /* the queue it waits in (claim, send, commit, xack) */
    bool queued;           /* on one of them (px_queue_push .. px_queue_pop) */

    struct px_trace_entry *trace; /* trace.c's; NULL while tracing is off */

    struct {                     /* claim.c, and commit.c as it finishes the entry */
        char token[24];          /* our random lock token for this claim */
        uint64_t fence;          /* fencing token of this claim, 0 when off */
        bool examined;           /* claimed at least once before: a later 'done' is after_lock */
        uint64_t token_seq;      /* step.h number of the first command with this token */
        bool has_dedup;          /* we hold the dedup lock (or may: reply lost) */
        bool has_lock;           /* we hold lock_key (or may) */
        uint64_t dedup_held_ms;  /* the dedup lock was confirmed ours by a reply to a command */
        uint64_t lock_held_ms;   /* sent then (px_mono_ms), lock_key too; 0: by none (claim.c) */
        bool lease_lost;         /* an extension found a lock of ours gone (counted if confirmed) */
        double lease_next;       /* loop time its next lease extension is due */
        bool in_io;              /* a claim or XACK round trip is in flight */
        int set;                 /* a px_lock_reply (decide.h) */
        bool done;               /* the done key exists */
        px_done_mark found;      /* what the done mark found says (decide.h), when 'done' */
        uint64_t done_ms;        /* the time our done mark holds; 0: not written yet */
        bool own;                /* the lock already held our token (a lost reply) */
        bool marked;             /* the entry-level dead-letter mark exists */
        bool mark_asked;         /* the mark was asked for, after the lock */
        bool lock_waited;        /* lock_key was busy once: look at the dedup key again */
        bool recheck_mine;       /* that look found our dedup lock */
        unsigned char done_sets; /* single layout: done marks sent (a retry reads back its own D) */
        bool dl_written;         /* the dead letter is written (not again on a retry) */
        bool dl_other;           /* ... by another instance (group-less mark) */
    } claim;

    struct {                   /* step.c (step.h: the contract) */
        int io;                /* commands about this entry awaiting replies */
        int pending;           /* replies the current step still waits for */
        bool failed;           /* a reply of the step was lost or an error */
        bool hard;             /* ... with an error that retrying does not cure */
        px_step_fn *done;      /* runs when the step's last reply is in */
        char *redis_error;     /* owned: the last such error, for the dead letter */
        unsigned redis_errors; /* such errors so far (PX_MAX_REDIS_ERRORS; proxy.c counts) */
    } step;

    struct {                     /* deliver.c; reader.c for Redis' counts */
        uint32_t attempt;        /* deliveries so far; group mode starts from Redis' count */
        uint32_t redis_count;    /* group mode: the delivery count Redis holds for it */
        uint32_t counts_wait;    /* claimed only once this batch's delivery counts are in */
        uint32_t rereads;        /* history reads of it while its counts were out (reader.c) */
        bool count_unsure;       /* the last count set was lost: Redis' count not known (reader.c) */
        bool taken;              /* another consumer owns it (px_proxy_taken_over): never delivered from here */
        uint32_t req_id;         /* SP request id of the current delivery */
        uint64_t deadline_ms;    /* ack deadline of the current delivery */
        double sent_at;          /* loop time the current delivery went out (ack_latency) */
        bool held_read;          /* its ack timer fired once and read the held answers first */
        uint32_t retry_after_ms; /* the worker's RETRY asked for this wait (protocol 1.1), else 0 */
    } delivery;

    struct {                    /* proxy.c: waiting for a lock or its holder */
        bool has_followers;     /* copies of this key are parked behind our lock */
        bool waiting_out;       /* parked behind a holder's lease: not in max_inflight */
        unsigned busy_looks;    /* times found busy behind another holder */
        uint64_t wait_until_ms; /* LOCKWAIT: give up on lock_key after this */
        double claim_since;     /* loop time of the first claim attempt (lock_wait) */
    } park;
};

/* A new entry 'id' of stream 'st', its fields copied from the stream reply's
 * 'fields' (one allocation), handed to the hub (px_proxy_read), which tracks
 * it and gives its verdict. Adds the entry's field bytes to *page_bytes.
 * Group-less, the entry returned may be gone already (bad input skipped or
 * without a dead-letter stream). */
px_entry *px_entry_create(px_stream *st, const char *id, redisReply *fields, size_t *page_bytes);
void px_entry_free(px_entry *e); /* only when e->step.io == 0 */

/* A singly linked FIFO of entries through 'qnext'. */
typedef struct px_queue {
    px_entry *head, *tail;
    size_t n;
} px_queue;

void px_queue_push(px_queue *q, px_entry *e);
px_entry *px_queue_pop(px_queue *q);

/* Every state change; debug and sanitizer builds check it against entry.c's
 * table of legal transitions. */
void px_entry_to(px_entry *e, px_entry_state next);

/* A log line about entry 'e' (log.h): always names its stream, entry id, key
 * and attempt, in text before the message, in JSON as fields. */
void px_log_entry(px_log_level level, const px_entry *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void px_log_entry_limited(px_log_limit *l, double every_s, px_log_level level, const px_entry *e,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
