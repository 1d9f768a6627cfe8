/*
 * reply.h - hiredis reply objects carved from an arena, one per Redis link,
 * instead of two mallocs and two frees per object (a read of 256 entries is
 * over 2,500 objects). Replies are read, handed to one callback and freed
 * before the next is read, so the arena is rewound whenever no reply is
 * alive. Whoever needs a value after its callback copies it, as before.
 */
#ifndef PX_REPLY_H
#define PX_REPLY_H

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

/* For tests: bytes of replies now alive, and bytes kept for the next ones. */
size_t px_reply_arena_in_use(const px_reply_arena *a);
size_t px_reply_arena_kept(const px_reply_arena *a);

#endif
