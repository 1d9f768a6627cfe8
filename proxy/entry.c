/*
 * entry.c - an entry's state changes, checked against the table of legal
 * transitions (debug and sanitizer builds), and log lines about an entry.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "proxy.h"

/* --- the entry's states -------------------------------------------------------
 * Every change of an entry's state goes through px_entry_to, which checks it
 * against this table in debug and sanitizer builds. A new entry starts in
 * CLAIM (or goes straight to COMMIT, XACK or GONE as bad input).
 *
 *   from      to        event                                          who
 *   CLAIM     CLAIM     queued again (a new entry, a re-look)           proxy.c
 *   CLAIM     SEND      claimed: every lock held, not done              claim.c -> proxy.c
 *   CLAIM     PARKED    busy (dedup lock, or lock_key past wait_ms with
 *                       on_busy: retry), or the claim failed            proxy.c
 *   CLAIM     LOCKWAIT  lock_key busy, within wait_ms                   proxy.c
 *   CLAIM     COMMIT    refused (on_busy: dead_letter), max_deliveries
 *                       reached at claim, a Redis error that stays,
 *                       bad input                                       proxy.c
 *   CLAIM     XACK      duplicate, skipped, dead-lettered already       proxy.c
 *   CLAIM     GONE      the same, group-less; released while draining   proxy.c
 *   PARKED    CLAIM     its timer, or its local holder let go           proxy.c
 *   PARKED    GONE      released while draining                         proxy.c
 *   LOCKWAIT  CLAIM     its timer: lock_key tried again                 proxy.c
 *   LOCKWAIT  GONE      released while draining                         proxy.c
 *   SEND      SENT      sent to a worker (its ack timer starts)         deliver.c
 *   SEND      GONE      released while draining                         proxy.c
 *   SENT      COMMIT    ACK; DROP; RETRY or timeout at max_deliveries   deliver.c -> proxy.c
 *   SENT      BACKOFF   RETRY, invalid reply or timeout: locks released proxy.c
 *   SENT      GONE      unanswered when the drain's grace ends          proxy.c
 *   BACKOFF   CLAIM     its timer                                       proxy.c
 *   BACKOFF   GONE      released while draining                         proxy.c
 *   COMMIT    COMMIT    written again after an error                    proxy.c
 *   COMMIT    XACK      written (group mode)                            proxy.c
 *   COMMIT    GONE      written (group-less)                            proxy.c
 *   XACK      XACK      XACK sent again after an error                  proxy.c
 *   XACK      GONE      XACKed                                          claim.c -> proxy.c
 */
#define T(from, to) [PX_E_##from][PX_E_##to] = true
static const bool legal[PX_E_GONE + 1][PX_E_GONE + 1] = {
    T(CLAIM, CLAIM),
    T(CLAIM, SEND),
    T(CLAIM, PARKED),
    T(CLAIM, LOCKWAIT),
    T(CLAIM, COMMIT),
    T(CLAIM, XACK),
    T(CLAIM, GONE),
    T(PARKED, CLAIM),
    T(PARKED, GONE),
    T(LOCKWAIT, CLAIM),
    T(LOCKWAIT, GONE),
    T(SEND, SENT),
    T(SEND, CLAIM),
    T(SEND, GONE),
    T(SENT, COMMIT),
    T(SENT, BACKOFF),
    T(SENT, GONE),
    T(BACKOFF, CLAIM),
    T(BACKOFF, GONE),
    T(COMMIT, COMMIT),
    T(COMMIT, XACK),
    T(COMMIT, GONE),
    T(XACK, XACK),
    T(XACK, GONE),
};
#undef T

void px_assert_fail(const char *cond, const char *file, int line)
{
    px_log_error("assertion failed: %s (%s:%d)", cond, file, line);
    abort();
}

void px_entry_to(px_entry *e, px_entry_state next)
{
    PX_ASSERT(!e->gone);
    PX_ASSERT(legal[e->state][next]);
    (void)legal;
    if (next != PX_E_GONE) e->state = next;
}

/* --- lines about an entry ---------------------------------------------------------- */

static px_log_about entry_about(const px_entry *e)
{
    return (px_log_about){ e->st->conf->stream, e->id, e->key, e->delivery.attempt };
}

void px_log_entry(px_log_level level, const px_entry *e, const char *fmt, ...)
{
    if (!px_log_enabled(level)) return;
    px_log_about a = entry_about(e);
    va_list ap;
    va_start(ap, fmt);
    px_log_about_v(level, NULL, 0, &a, fmt, ap);
    va_end(ap);
}

void px_log_entry_limited(px_log_limit *l, double every_s, px_log_level level, const px_entry *e,
                          const char *fmt, ...)
{
    if (!px_log_enabled(level)) return;
    px_log_about a = entry_about(e);
    va_list ap;
    va_start(ap, fmt);
    px_log_about_v(level, l, every_s, &a, fmt, ap);
    va_end(ap);
}
