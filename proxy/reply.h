/*
 * reply.h - hiredis reply objects carved from an arena, one per Redis link,
 * instead of two mallocs and two frees per object (a read of 256 entries is
 * over 2,500 objects). Replies are read, handed to one callback and freed
 * before the next is read, so the arena is rewound whenever no reply is
 * alive. Whoever needs a value after its callback copies it, as before.
 */
#ifndef PX_REPLY_H
#define PX_REPLY_H

#include <stdbool.h>

#include <hiredis/read.h>

typedef struct px_reply_arena px_reply_arena;

px_reply_arena *px_reply_arena_new(void);

/* The arena goes once no reply is alive; a reply still held by a reader
 * (a context whose free hiredis deferred) keeps it until that reply is freed. */
void px_reply_arena_release(px_reply_arena *a);

/* Build this reader's replies in 'a' (before it reads anything). */
void px_reply_attach(redisReader *reader, px_reply_arena *a);

/*
 * Strings of one array past 'limit' bytes (their lengths summed, in order) are
 * not kept: such an element has type PX_REPLY_ELIDED, its real 'len' and an
 * empty 'str'. An entry over max_entry_bytes is then never copied out of the
 * reader (its fields are one array), so a 40 MB entry costs the arena nothing.
 * 0 (the default) keeps everything. Status and error replies are always kept.
 */
#define PX_REPLY_ELIDED 64
void px_reply_arena_limit(px_reply_arena *a, size_t limit);

/*
 * Caps on what a reply may announce (issue 37): a server, or anyone on a plain
 * or unverified link, could otherwise make the daemon allocate from a header
 * alone ("*2147483647" asked for 17 GB). Past a cap the reply is a protocol
 * error and the link is dropped (link.c), or an array inside one is elided.
 *
 * Arrays: hiredis asks for the whole element array as soon as it reads the
 * header. The longest array the daemon can need is an entry's fields (two
 * elements a field): every field takes at least 2 bytes of its Delivery, so an
 * entry it can deliver has fewer than max_entry_bytes elements, and twice
 * that still reads (and dead-letters by reference) entries over the limit.
 * Every other reply is far shorter (a page of at most 256 entries, 16384
 * cluster slots, an XRANGE of 1000 dead letters), so the cap is
 * 2 x max_entry_bytes (config.c), and never less than PX_REPLY_MIN_ELEMENTS:
 * a header costs at most 8 bytes an element (16 MiB by default). A longer
 * array inside a reply (an entry with more fields than that: a producer can
 * write one) is not an error: it is kept as one object of type
 * PX_REPLY_ELIDED whose 'len' is the count announced, and its elements are
 * read and dropped (the entry is dead-lettered by reference,
 * docs/guarantee.md). Only a whole reply that is such an array is refused.
 *
 * Strings: hiredis allocates nothing from a bulk header; it buffers the bytes
 * as they come, and the daemon must read an entry of any size a producer can
 * write to dead-letter it (docs/guarantee.md), so the cap is the largest string
 * Redis takes by default (proto-max-bulk-len, 512 MiB): no default server can
 * hold a longer value. It also bounds a status or error line that never ends.
 */
#define PX_REPLY_MIN_ELEMENTS ((size_t)1 << 20)
#define PX_REPLY_MAX_BULK     ((size_t)512 << 20)

/* Refuse arrays of more than 'n' elements (at least PX_REPLY_MIN_ELEMENTS,
 * the default). */
void px_reply_arena_max_elements(px_reply_arena *a, size_t n);

/* Why the reader stopped with an error: an array over the cap (hiredis only
 * says "Out of memory"), else the reader's own message. */
const char *px_reply_error(const redisReader *r);

/* After the reader gave no reply: false, with 'why', when the item it is in
 * the middle of is a string announced longer than 'max_bulk' (usually
 * PX_REPLY_MAX_BULK), or when it holds more than that of one item. */
bool px_reply_pending_ok(const redisReader *r, size_t max_bulk, char *why, size_t whylen);

/* For tests: bytes of replies now alive, and bytes kept for the next ones. */
size_t px_reply_arena_in_use(const px_reply_arena *a);
size_t px_reply_arena_kept(const px_reply_arena *a);

#endif
