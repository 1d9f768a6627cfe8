/*
 * sentinel.h - a master followed through Redis Sentinel (docs/configuration.md,
 * redis.sentinel). The sentinels are asked in turn (SENTINEL
 * get-master-addr-by-name) for the master's address at every (re)connect of the
 * data link; the data link checks ROLE before anything is written and drops
 * itself on READONLY (link.c); one sentinel's +switch-master channel drops it
 * at once when the master changes. Uses only link.h; redis.c puts the data link
 * behind redis.h.
 */
#ifndef PX_SENTINEL_H
#define PX_SENTINEL_H

#include <hiredis/hiredis.h>

#include "link.h"

typedef struct px_sentinel px_sentinel;

/* 'opts' names the master (master_name) and the sentinels; the data link it
 * makes gets 'state_cb' and 'udata' as a single server's link would. */
px_sentinel *px_sentinel_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *owner,
                                px_link_state_cb *state_cb, void *udata);
void px_sentinel_destroy(px_sentinel *s);

/* The link to the master (down while none is known). */
px_link *px_sentinel_link(const px_sentinel *s);

/* --- pure parsers (sentinel_reply.c), for tests -------------------------- */

typedef enum {
    PX_SN_ADDR_OK,
    PX_SN_ADDR_UNKNOWN,
    PX_SN_ADDR_BAD
} px_sn_addr;

/* The reply of SENTINEL get-master-addr-by-name: [ip, port] is OK (host and
 * *port filled); nil is UNKNOWN (the sentinel monitors no master of that name);
 * anything else (an error, a bad port) is BAD, with the reason in 'why'. */
px_sn_addr px_sentinel_parse_addr(const redisReply *r, char *host, size_t hostsize, int *port,
                                  char *why, size_t whysize);

/* A +switch-master message's text ('msglen' bytes, a NUL among them is not
 * an end), "<name> <oldip> <oldport> <newip> <newport>": true when it is
 * well formed and about master 'name'; the new address in host and *port. */
bool px_sentinel_parse_switch(const char *msg, size_t msglen, const char *name, char *host,
                              size_t hostsize, int *port);

/* A pub/sub message as the subscription link hands it over: true when it is
 * ["message", "+switch-master", text], each a string of exactly that, and
 * the text is a switch of master 'name' (px_sentinel_parse_switch). */
bool px_sentinel_parse_message(const redisReply *r, const char *name, char *host, size_t hostsize,
                               int *port);

/* ROLE's reply: true when its first element is exactly "master"; 'role' gets
 * that element ("slave", "sentinel", or "?" when the reply is not one). */
bool px_sentinel_role_master(const redisReply *r, char *role, size_t rolesize);

#endif
