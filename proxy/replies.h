/*
 * replies.h - pure readers of the Redis replies the daemon acts on (issue 37):
 * SET NX GET and the other claim replies (claim.c), XPENDING and XINFO
 * CONSUMERS (the reader), XINFO GROUPS (metrics.c), pub/sub messages and
 * HELLO (link.c's handshake). Every element's type is checked before it is read; a
 * string is compared whole (its length, not up to a NUL); an integer is only
 * ever read from an integer reply (hiredis leaves 'integer' 0 in any other
 * type: a "pending" sent as a string is not 0 pending, it is a malformed
 * reply). No I/O, no state: tests/unit/test_replies.c and
 * tests/fuzz/fuzz_replies.c call them with whatever a server could send.
 */
#ifndef PX_REPLIES_H
#define PX_REPLIES_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

#include "decide.h"
#include "redis.h"

/* 'r' is a string (bulk or status) of exactly the bytes of 's'. */
bool px_rp_is(const redisReply *r, const char *s);

/* An integer reply (EXISTS, INCR, a script's number): true with '*v'; false
 * for any other type. */
bool px_rp_int(const redisReply *r, long long *v);

/* A bulk string or nil (GET, SET ... GET, a script's id or nil): true with
 * '*s' and '*len' (NULL and 0 for nil); false for any other type. */
bool px_rp_str_or_nil(const redisReply *r, const char **s, size_t *len);

/* What SET lock value NX PX lease GET answered, 'mine' the value we set:
 * PX_LOCK_TAKEN (nil, or exactly our value: a reply lost in a reconnect),
 * PX_LOCK_DONE (a done mark, 'D...'), PX_LOCK_BUSY (another value), or
 * PX_LOCK_NONE when the reply is neither nil nor a string (malformed: the
 * claim treats it as a lost reply). */
px_lock_reply px_rp_lock_set(const redisReply *r, const char *mine);

/* A stream entry id as Redis writes one: "<ms>-<seq>", each 1 to 20 digits. */
bool px_rp_stream_id(const char *s, size_t len);

/* One element of XPENDING key group start end count [consumer]. */
typedef struct px_rp_pending {
    const char *id; /* (ref) a stream id (px_rp_stream_id), NUL-terminated by hiredis */
    size_t id_len;
    const char *consumer; /* (ref) */
    size_t consumer_len;
    long long idle_ms;
    long long count; /* deliveries, >= 0 */
} px_rp_pending;

/* The extended form's reply: an array of [id, consumer, idle, count]. Returns
 * the number of elements, each in (*out)[i] (malloc'd, the caller frees; refs
 * into 'r'), or -1 with the reason in 'why' when any element is malformed
 * (then *out is NULL). */
long px_rp_xpending(const redisReply *r, px_rp_pending **out, char *why, size_t whysize);

/* One consumer of XINFO CONSUMERS key group. */
typedef struct px_rp_consumer {
    const char *name; /* (ref) */
    size_t name_len;
    long long pending; /* entries it holds */
    long long idle_ms;
} px_rp_consumer;

/* The reply: an array of maps (RESP2: [key, value, ...]) each with name (a
 * string), pending and idle (integers). Returns the number of consumers, in
 * *out as px_rp_xpending does, or -1 with 'why' when any map lacks one of
 * those, holds it with another type, names a key twice or has an odd length.
 * A consumer whose pending count is unknown must never look idle and empty. */
long px_rp_xinfo_consumers(const redisReply *r, px_rp_consumer **out, char *why, size_t whysize);

/* XINFO GROUPS key, the group named exactly 'group': true when the reply is an
 * array holding it; '*pending_known' and '*lag_known' say whether its pending
 * and lag are integers (lag is nil when Redis cannot tell). */
bool px_rp_xinfo_group(const redisReply *r, const char *group, long long *pending,
                       bool *pending_known, long long *lag, bool *lag_known);

/* px_redis_server_check (redis.h), HELLO's reply, is here too: keys compared
 * whole, the version read from its leading digits. */

/* A pub/sub message: ["message", channel, payload], the first exactly
 * "message" (the command FIFO has no entry for it). */
bool px_rp_pubsub_message(const redisReply *r);

#endif
