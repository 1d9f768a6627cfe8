/*
 * commit.h - the writes that finish an entry, in Redis (commit.c): its done
 * mark, its dead letter, the XACK batches.
 */
#ifndef PX_COMMIT_H
#define PX_COMMIT_H

#include "proxy.h"

/* The name of the written-mark of entry 'id''s dead letter (see commit.c),
 * appended to 'b'. 'sc' must have a dead_letter stream. */
void px_dl_mark_name(const px_stream_conf *sc, const char *id, px_buf *b);
/* The name of the claim `redrive` takes on dead letter 'dlid' on a Redis
 * Cluster (ops.c), in the dead-letter stream's slot, appended to 'b'. */
void px_dl_redrive_claim_name(const px_stream_conf *sc, const char *dlid, px_buf *b);
/* commit_q -> done mark / dead letter, now or, while the batch window is
 * open and no claim is written this loop turn ('carried' false), with the next
 * page's claims (commit_ms). Returns how many entries it wrote commands for. */
size_t px_commit_flush(px_proxy *px, bool carried);
void px_commit_wait_cb(struct ev_loop *loop, ev_timer *w, int revents); /* px->commit_wait */
/* xack_q -> XACK, when 'carried' (claims or commits were written this loop
 * turn), the queue is long, the ride's wait is over or the proxy stops. */
void px_commit_xack_flush(px_proxy *px, bool carried);
void px_commit_xack_wait_cb(struct ev_loop *loop, ev_timer *w, int revents); /* px->xack_wait */

#endif
