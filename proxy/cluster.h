/*
 * cluster.h - Redis Cluster routing for px_redis (hiredis 0.14 has none).
 *
 * The pure part (slots.c): the hash slot of a key (CRC16-XMODEM mod 16384, honouring
 * the first non-empty {hash tag}), MOVED/ASK error parsing and CLUSTER SLOTS
 * parsing. The router: one link (link.h) per master on the loop, every command
 * sent to the master that owns its key's slot (so each node's link pipelines
 * as a single server's does); MOVED repoints the slot and refreshes the map,
 * ASK sends ASKING and the command to the named node once; TRYAGAIN,
 * CLUSTERDOWN and a node without a live link make the command wait (up to its
 * deadline) for the map to settle. redis.c puts a px_redis in cluster mode
 * when px_redis_opts names startup nodes (its 'seeds'); callers see the same API either way.
 */
#ifndef PX_CLUSTER_H
#define PX_CLUSTER_H

#include <ev.h>
#include <hiredis/hiredis.h>

#include "redis.h"

#define PX_CLUSTER_SLOTS 16384

/* The hash slot of 'key' ('len' bytes), as CLUSTER KEYSLOT computes it. */
unsigned px_cluster_slot(const char *key, size_t len);

/* Appends to 'b' a hash tag's text that puts "...{tag}..." in the slot of the
 * key 'name': its own tag, the whole name when it has no braces, else a number
 * found in that slot. For keys idemproxy makes beside a user's key (a dead
 * letter's written-mark, the batch window's key). */
void px_cluster_tag(const char *name, px_buf *b);

typedef struct px_redirect {
    bool ask; /* ASK (one-shot) rather than MOVED */
    unsigned slot;
    char addr[280]; /* "host:port" */
} px_redirect;

/* Parse "MOVED <slot> <host>:<port>" or "ASK ..."; false for any other text. */
bool px_cluster_redirect(const char *err, px_redirect *out);

typedef struct px_slot_range {
    unsigned start, end; /* inclusive */
    char addr[280];      /* the master's "host:port" */
} px_slot_range;

/* Parse a CLUSTER SLOTS reply into '*out' (malloc'd; caller frees). A master
 * reported with an empty host is on 'asked_host', the node that answered.
 * Returns the number of ranges, or -1 when the reply is not a slot map. A
 * range whose master has an address no link can dial (a port outside
 * 1-65535; a host with a bracket, blank, control byte or NUL, or longer than
 * PX_ADDR_HOST_MAX - 1) is left out, the others kept, and 'why' says which
 * (empty when every range was kept). */
int px_cluster_parse_slots(const redisReply *r, const char *asked_host, px_slot_range **out,
                           char *why, size_t whysize);

/* --- the router (used by redis.c only) ----------------------------------- */

typedef struct px_cluster px_cluster;

/* The cluster's readiness changed (every slot mapped, every master linked). */
typedef void px_cluster_state_cb(px_redis *outer, bool up);

/* One link (link.h) per master, each created from 'opts' (copied); every
 * command's callback gets 'outer'. */
px_cluster *px_cluster_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *outer,
                              px_cluster_state_cb *state_cb);
void px_cluster_destroy(px_cluster *cl);
size_t px_cluster_pending(const px_cluster *cl);

/* The master that owns key's slot (NULL: any master) has a live link. */
bool px_cluster_key_up(const px_cluster *cl, const char *key, size_t len);

/* Route one command (a script when 's' is set) by 'key' (NULL: any master). */
int px_cluster_send(px_cluster *cl, px_script *s, int nkeys, const char *key, size_t keylen,
                    long long extra_ms, px_redis_cb *cb, void *priv, int argc, const char **argv,
                    const size_t *lens);

/* Checks for tests: the router of a cluster client (NULL for a single
 * server), and how many slots point at a node that is not in its node list
 * (freed): always 0. */
px_cluster *px_redis_router(const px_redis *r);
size_t px_cluster_stale_slots(const px_cluster *cl);

#endif
