/*
 * hooks.h - the test hooks, all of them: IDEMPROXY_DEBUG_* environment
 * variables read once, when the proxy starts (px_hooks_init, from
 * px_proxy_create). Each lets a test force a timing it would otherwise have to
 * wait for or hope for; none is set in production, and an unset hook leaves
 * the daemon as it is.
 */
#ifndef PX_HOOKS_H
#define PX_HOOKS_H

typedef struct px_hooks {
    /* IDEMPROXY_DEBUG_CLAIM_PAUSE_MS (claim.c): a split claim waits this long
     * between its first done check and its lock, so a test can run another
     * holder's whole cycle in that gap (write-up 000's race). 0: no pause. */
    long claim_pause_ms;
    /* IDEMPROXY_DEBUG_COUNTS_DELAY_MS (reader.c): a batch's XPENDING for its
     * delivery counts goes out this much later, as a stream master slower
     * than the lock's would answer it. 0: at once. */
    long counts_delay_ms;
    /* IDEMPROXY_DEBUG_IDLE_CONSUMER_MS (reader.c): consumers idle this long
     * are removed, instead of after an hour. 0: the hour. */
    long long idle_consumer_ms;
    /* IDEMPROXY_DEBUG_XACK_RIDE_MS (commit.c): the longest an XACK waits for a
     * claim or commit to ride with, instead of PX_XACK_RIDE_MS, so a test can
     * see that it rides and that a stop sends it. 0: PX_XACK_RIDE_MS. */
    long long xack_ride_ms;
} px_hooks;

extern px_hooks px_hook;

void px_hooks_init(void);

#endif
