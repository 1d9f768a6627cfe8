/*
 * claim.h - the dedup claim, the leases and the releases, in Redis (claim.c).
 * The writes that finish an entry are commit.h's.
 */
#ifndef PX_CLAIM_H
#define PX_CLAIM_H

#include "proxy.h"

#define PX_FENCE_KEY "idemproxy:fence" /* the one fencing counter, every lock's */
void px_claim_init(void);
/* The flush returns how many entries it wrote commands for. */
size_t px_claim_flush(px_proxy *px); /* claim_q -> claimed | duplicate | busy */
void px_claim_lock_key(px_entry *e); /* retry lock_key within wait_ms */
void px_claim_release(px_entry *e);  /* give back our locks, fire and forget */
void px_claim_extend(px_stream *st); /* extend leases of delivered entries */
/* Every lock 'e' needs is known to be ours at 'now_ms' (px_mono_ms): the
 * last reply confirming each answered a command sent less than lease_ms -
 * timeout_ms before (docs/guarantee.md; decide.h: px_decide_lease_held). */
bool px_claim_held(px_entry *e, uint64_t now_ms);

/* What the commit (commit.c) shares with the claim. */
/* Run 'fn' on every entry of 'q' whose servers are up (and, with 'counts',
 * whose delivery counts are in); the others stay queued, in order. Returns
 * how many ran. */
size_t px_claim_flush_up(px_proxy *px, px_queue *q, void (*fn)(px_entry *), bool counts);
/* Split layout: the entry's lock and done keys take commands in the order
 * they were sent (one server, or one cluster slot). */
bool px_claim_split_ordered(px_entry *e);
/* The value our dedup lock holds, in 'buf'. */
const char *px_claim_lock_value(px_entry *e, char *buf, size_t size);
/* The split layout's dedup lock released in the entry's step (commit.c:
 * only after the done mark). */
void px_claim_release_step(px_entry *e);

#endif
