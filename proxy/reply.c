/*
 * reply.c - see reply.h. hiredis builds every reply through the reader's
 * redisReplyObjectFunctions; ours take each object, with its string or its
 * element array, from the link's arena in one bump, and keep no list of them.
 *
 * hiredis frees only whole replies (the root a callback got, or the root of a
 * reply cut short by an error or a closing link), so the arena counts roots:
 * when none is alive every object is dead and the arena is rewound. A link
 * whose reader is being parsed while another reply is still in a callback
 * (two contexts of one link, during a reconnect) just waits for both.
 *
 * Under AddressSanitizer rewound memory is poisoned, so a reply read after
 * its callback returned is reported like any use after free.
 */
#include "reply.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "px.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PX_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PX_ASAN 1
#endif
#ifdef PX_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define PX_CHUNK      (64 * 1024)  /* a read of 256 entries fills about three */
#define PX_ARENA_KEEP (512 * 1024) /* chunks kept for the next reply; more go back */

typedef struct px_chunk {
    struct px_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
} px_chunk;

struct px_reply_arena {
    px_chunk *chunks; /* in use, newest (the one bumped) first */
    px_chunk *spare;  /* rewound, each PX_CHUNK */
    size_t spare_bytes;
    size_t live;            /* roots made and not yet freed */
    size_t limit;           /* string bytes kept per array; 0: no limit */
    size_t max_elements;    /* an array longer is refused (reply.h) */
    char refused[96];       /* why the last array was refused; "" if none */
    const void *run_parent; /* the array whose strings are being summed */
    size_t run_bytes;       /* ... and their bytes so far */
    bool released;          /* its link is gone: free it once 'live' is 0 */
};

/* A root carries its arena just before it, for freeObject. */
typedef struct {
    px_reply_arena *arena;
    void *pad;
} root_head;

static void *arena_alloc(px_reply_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    px_chunk *c = a->chunks;
    if (c == NULL || c->cap - c->used < n) {
        if (n <= PX_CHUNK && a->spare) {
            c = a->spare;
            a->spare = c->next;
            a->spare_bytes -= c->cap;
        } else {
            size_t cap = n > PX_CHUNK ? n : PX_CHUNK;
            c = px_malloc(sizeof(*c) + cap);
            c->cap = cap;
            POISON(c->data, cap);
        }
        c->used = 0;
        c->next = a->chunks;
        a->chunks = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    UNPOISON(p, n);
    return p;
}

static void arena_rewind(px_reply_arena *a)
{
    px_chunk *c = a->chunks, *next;
    a->run_parent = NULL; /* the next reply's arrays may reuse its addresses */
    for (; c; c = next) {
        next = c->next;
        POISON(c->data, c->cap);
        if (c->cap == PX_CHUNK && a->spare_bytes + c->cap <= PX_ARENA_KEEP) {
            c->next = a->spare;
            a->spare = c;
            a->spare_bytes += c->cap;
        } else {
            free(c);
        }
    }
    a->chunks = NULL;
}

static void arena_free(px_reply_arena *a)
{
    arena_rewind(a);
    px_chunk *c = a->spare, *next;
    for (; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}

static px_reply_arena *task_arena(const redisReadTask *task)
{
    const redisReadTask *t = task;
    while (t->parent) t = t->parent; /* the root task carries the arena */
    return t->privdata;
}

/* What every element of an elided array is (and its elements', at any
 * depth): hiredis reads them to find the reply's end, nothing keeps them. */
static redisReply elided_child = { .type = PX_REPLY_ELIDED, .str = (char *)"" };

static bool under_elided(const redisReadTask *task)
{
    return task->parent && ((redisReply *)task->parent->obj)->type == PX_REPLY_ELIDED;
}

/* An object of 'type' in 'a' with 'extra' bytes after it, linked into its parent. */
static redisReply *new_object(px_reply_arena *a, const redisReadTask *task, int type, size_t extra)
{
    bool root = task->parent == NULL;
    unsigned char *p = arena_alloc(a, (root ? sizeof(root_head) : 0) + sizeof(redisReply) + extra);
    if (root) {
        ((root_head *)p)->arena = a;
        a->live++;
        p += sizeof(root_head);
    }
    redisReply *r = (redisReply *)p;
    memset(r, 0, sizeof(*r));
    r->type = type;
    if (!root) ((redisReply *)task->parent->obj)->element[task->idx] = r;
    return r;
}

static void *create_string(const redisReadTask *task, char *str, size_t len)
{
    if (under_elided(task)) return &elided_child;
    px_reply_arena *a = task_arena(task);
    if (a->limit && task->parent && task->type == REDIS_REPLY_STRING) {
        /* An array's elements are read in order, one array at a time. */
        if (a->run_parent != task->parent->obj) {
            a->run_parent = task->parent->obj;
            a->run_bytes = 0;
        }
        a->run_bytes += len;
        if (a->run_bytes > a->limit) {
            redisReply *r = new_object(a, task, PX_REPLY_ELIDED, 0);
            r->str = (char *)"";
            r->len = len;
            return r;
        }
    }
    redisReply *r = new_object(a, task, task->type, len + 1);
    r->str = (char *)(r + 1);
    memcpy(r->str, str, len);
    r->str[len] = '\0';
    r->len = len;
    return r;
}

static void *create_array(const redisReadTask *task, int elements)
{
    if (under_elided(task)) return &elided_child;
    size_t n = elements > 0 ? (size_t)elements : 0;
    px_reply_arena *a = task_arena(task);
    if (n > a->max_elements && task->parent) {
        /* Inside a reply (an entry's fields): kept as one PX_REPLY_ELIDED
         * object whose 'len' is the count announced, its elements read and
         * dropped, so an entry with more fields than any deliverable one is
         * still read whole, and dead-lettered by reference
         * (docs/guarantee.md). */
        redisReply *r = new_object(a, task, PX_REPLY_ELIDED, 0);
        r->str = (char *)"";
        r->len = n;
        return r;
    }
    if (n > a->max_elements) {
        /* hiredis then stops with a protocol error ("Out of memory"): say why */
        snprintf(a->refused, sizeof(a->refused), "an array of %zu elements, over the limit of %zu",
                 n, a->max_elements);
        return NULL;
    }
    redisReply *r = new_object(a, task, REDIS_REPLY_ARRAY, n * sizeof(redisReply *));
    if (n) {
        r->element = (redisReply **)(r + 1);
        memset(r->element, 0, n * sizeof(redisReply *));
    }
    r->elements = n;
    return r;
}

static void *create_integer(const redisReadTask *task, long long value)
{
    if (under_elided(task)) return &elided_child;
    redisReply *r = new_object(task_arena(task), task, REDIS_REPLY_INTEGER, 0);
    r->integer = value;
    return r;
}

static void *create_nil(const redisReadTask *task)
{
    if (under_elided(task)) return &elided_child;
    return new_object(task_arena(task), task, REDIS_REPLY_NIL, 0);
}

static void free_object(void *obj)
{
    if (obj == NULL) return;
    px_reply_arena *a = ((root_head *)obj - 1)->arena;
    if (--a->live > 0) return;
    if (a->released) arena_free(a);
    else arena_rewind(a);
}

static redisReplyObjectFunctions reply_functions = {
    create_string, create_array, create_integer, create_nil, free_object
};

px_reply_arena *px_reply_arena_new(void)
{
    px_reply_arena *a = px_calloc(1, sizeof(px_reply_arena));
    a->max_elements = PX_REPLY_MIN_ELEMENTS;
    return a;
}

void px_reply_arena_release(px_reply_arena *a)
{
    if (a == NULL) return;
    a->released = true;
    if (a->live == 0) arena_free(a);
}

void px_reply_attach(redisReader *reader, px_reply_arena *a)
{
    reader->fn = &reply_functions;
    reader->privdata = a;
    a->refused[0] = '\0';
}

void px_reply_arena_limit(px_reply_arena *a, size_t limit)
{
    a->limit = limit;
}

void px_reply_arena_max_elements(px_reply_arena *a, size_t n)
{
    a->max_elements = n > PX_REPLY_MIN_ELEMENTS ? n : PX_REPLY_MIN_ELEMENTS;
}

const char *px_reply_error(const redisReader *r)
{
    const px_reply_arena *a = r->privdata;
    return a && r->fn == &reply_functions && a->refused[0] ? a->refused : r->errstr;
}

bool px_reply_pending_ok(const redisReader *r, size_t max_bulk, char *why, size_t whylen)
{
    size_t held = r->len - r->pos;
    if (r->ridx >= 0 && r->rstack[r->ridx].type == REDIS_REPLY_STRING) {
        /* a bulk string begun: its length (hiredis consumed the '$') */
        unsigned long long n = 0;
        bool more = false; /* digits after those read */
        for (const char *p = r->buf + r->pos; p < r->buf + r->len && *p >= '0' && *p <= '9'; p++) {
            if (n > max_bulk) {
                more = true;
                break;
            }
            n = n * 10 + (unsigned long long)(*p - '0');
        }
        if (n > max_bulk) {
            snprintf(why, whylen, "a string of %s%llu bytes, over the limit of %zu",
                     more ? "over " : "", n, max_bulk);
            return false;
        }
    }
    /* whatever the item: a line or a string is never longer than that */
    if (held > max_bulk + 64) {
        snprintf(why, whylen, "%zu bytes of one reply item and no end, over the limit of %zu", held,
                 max_bulk);
        return false;
    }
    return true;
}

size_t px_reply_arena_in_use(const px_reply_arena *a)
{
    size_t n = 0;
    for (const px_chunk *c = a->chunks; c; c = c->next) n += c->used;
    return n;
}

size_t px_reply_arena_kept(const px_reply_arena *a)
{
    return a->spare_bytes;
}
