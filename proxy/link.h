/*
 * link.h - one connection to one Redis server on the libev loop, and nothing
 * of clusters: the name resolved again at every (re)connect (in a resolver
 * thread, so the loop never waits on DNS; every address it returns, IPv4 and
 * IPv6, is tried in turn), a non-blocking connect, TLS (OpenSSL) when
 * configured, the handshake (AUTH, SELECT, HELLO 2 for the version check,
 * SCRIPT LOAD, PING), a deadline on every command (when the oldest passes,
 * the connection is dropped and every pending callback runs with reply ==
 * NULL), reconnection with backoff, RESP written by hand and read by hiredis'
 * redisReader into the reply arena (reply.h). Scripts go as EVALSHA and fall
 * back to EVAL after NOSCRIPT.
 *
 * redis.c puts one link, or one cluster of links (cluster.c), behind redis.h.
 * A link's callbacks get the px_redis it was created for ('owner').
 */
#ifndef PX_LINK_H
#define PX_LINK_H

#include <ev.h>
#include <hiredis/read.h>

#include "redis.h"

typedef struct px_link px_link;

/* Called when the link becomes usable (after the handshake) and when it is lost. */
typedef void px_link_state_cb(px_link *l, bool up, void *udata);

/* Connects at once. 'opts' is copied (its strings and its TLS options);
 * opts->seeds is ignored. */
px_link *px_link_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis *owner,
                        px_link_state_cb *state_cb, void *udata);

/* A link told where to connect by its owner (a sentinel-followed one): it
 * does not connect at once, and each time it wants to (at first, and after
 * every drop, once the backoff has passed) it calls 'want_cb' instead; the
 * owner answers, now or later, with px_link_connect_to. */
typedef void px_link_want_cb(px_link *l, void *udata);
px_link *px_link_create_deferred(struct ev_loop *loop, const px_redis_opts *opts,
                                 px_redis *owner, px_link_state_cb *state_cb,
                                 px_link_want_cb *want_cb, void *udata);

/* Connect to 'host' ('port') now if the link waits for a target, as its
 * want_cb asked; otherwise it is kept for the next connect. */
void px_link_connect_to(px_link *l, const char *host, int port);

/* Drop the connection (if any) saying 'why', and reconnect with backoff; a
 * link already down and waiting out its backoff reconnects at once. */
void px_link_reset(px_link *l, const char *why);

/* Pub/sub messages (["message", channel, text] after a SUBSCRIBE) go to 'cb'
 * instead of the command FIFO; 'reply' is valid during the call. */
void px_link_on_message(px_link *l, px_redis_cb *cb, void *priv);

/* Pending callbacks run with reply == NULL; the state callback does not. */
void px_link_destroy(px_link *l);

bool px_link_is_up(const px_link *l);
size_t px_link_pending(const px_link *l);

/* As px_redis_argv and px_redis_script, on this one connection: PX_ERR (and
 * 'cb' never called) while it is not up. */
int px_link_argv(px_link *l, long long extra_ms, px_redis_cb *cb, void *priv, int argc,
                 const char **argv, const size_t *lens);
int px_link_script(px_link *l, px_script *s, px_redis_cb *cb, void *priv, int nkeys, int argc,
                   const char **argv, const size_t *lens);

/* The TLS files of 'tls' load (the CA, the client certificate and its key,
 * which must match): true, or false with the reason in 'err'. For check and
 * startup; connects read them again. */
bool px_link_tls_check(const px_tls_opts *tls, char *err, size_t errlen);

/* See px_redis_refused. */
bool px_link_refused(void);

#endif
