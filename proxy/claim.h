/*
 * claim.h - the dedup claim and the writes that finish an entry, in Redis (claim.c).
 */
#ifndef PX_CLAIM_H
#define PX_CLAIM_H

#include "proxy.h"

#define PX_FENCE_KEY "idemproxy:fence" /* the one fencing counter, every lock's */
/* The name of the written-mark of entry 'id''s dead letter (see claim.c),
 * appended to 'b'. 'sc' must have a dead_letter stream. */
void px_dl_mark_name(const px_stream_conf *sc, const char *id, px_buf *b);
void px_claim_init(void);
/* The flushes return how many entries they wrote commands for. */
size_t px_claim_flush(px_proxy *px);        /* claim_q -> claimed | duplicate | busy */
void px_claim_lock_key(px_entry *e);        /* retry lock_key within wait_ms */
void px_claim_release(px_entry *e);         /* give back our locks, fire and forget */
void px_claim_extend(px_stream *st);        /* extend leases of delivered entries */
size_t px_claim_commit_flush(px_proxy *px); /* commit_q -> done mark / dead letter */
/* xack_q -> XACK, when 'carried' (claims or commits were written this loop
 * turn), the queue is long, the ride's wait is over or the proxy stops. */
void px_claim_xack_flush(px_proxy *px, bool carried);
void px_claim_xack_wait_cb(struct ev_loop *loop, ev_timer *w, int revents); /* px->xack_wait */
/* Every lock 'e' needs is known to be ours at 'now_ms' (px_mono_ms): the
 * last reply confirming each answered a command sent less than lease_ms -
 * timeout_ms before (SPEC 5.4; decide.h: px_decide_lease_held). */
bool px_claim_held(px_entry *e, uint64_t now_ms);

#endif
