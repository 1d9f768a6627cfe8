/*
 * test_reply.c - replies built in a link's arena (proxy/reply.c) by hiredis'
 * own reader: the same trees hiredis builds with malloc, whole or fed a byte
 * at a time; memory reused from one reply to the next; a reply cut short by
 * a protocol error or by freeing the reader; an arena released while a reply
 * is still alive.
 */
#include <stdlib.h>

#include <hiredis/hiredis.h>

#include "reply.h"
#include "test.h"

/* An XREADGROUP reply: one stream, two entries, then a deleted one (nil fields). */
static const char xread[] =
    "*1\r\n*2\r\n$4\r\nroom\r\n*3\r\n"
    "*2\r\n$3\r\n1-0\r\n*2\r\n$7\r\npayload\r\n$17\r\n{\"eventId\":\"e-1\"}\r\n"
    "*2\r\n$3\r\n2-0\r\n*4\r\n$1\r\na\r\n$0\r\n\r\n$1\r\nb\r\n$1\r\nc\r\n"
    "*2\r\n$3\r\n3-0\r\n*-1\r\n";

static redisReader *reader(px_reply_arena *a)
{
    redisReader *r = redisReaderCreate();
    r->maxbuf = 0;
    px_reply_attach(r, a);
    return r;
}

/* Feed 'resp' in pieces of 'step' bytes; return the one reply it holds. */
static redisReply *parse(redisReader *r, const char *resp, size_t len, size_t step)
{
    void *reply = NULL;
    for (size_t off = 0; off < len && reply == NULL; off += step) {
        size_t n = len - off < step ? len - off : step;
        if (redisReaderFeed(r, resp + off, n) != REDIS_OK) return NULL;
        if (redisReaderGetReply(r, &reply) != REDIS_OK) return NULL;
    }
    return reply;
}

static int is_str(const redisReply *r, const char *s)
{
    return r && r->type == REDIS_REPLY_STRING && r->len == strlen(s) && strcmp(r->str, s) == 0;
}

static void check_xread(const redisReply *x, const char *how)
{
    char name[128];
    snprintf(name, sizeof(name), "XREADGROUP reply, %s: the tree", how);
    const redisReply *s = x && x->type == REDIS_REPLY_ARRAY && x->elements == 1 ? x->element[0] : NULL;
    const redisReply *es = s && s->elements == 2 && is_str(s->element[0], "room") ? s->element[1] : NULL;
    int ok = es && es->type == REDIS_REPLY_ARRAY && es->elements == 3;
    if (ok) {
        const redisReply *e1 = es->element[0], *e2 = es->element[1], *e3 = es->element[2];
        ok = is_str(e1->element[0], "1-0") && e1->element[1]->elements == 2 &&
             is_str(e1->element[1]->element[0], "payload") &&
             is_str(e1->element[1]->element[1], "{\"eventId\":\"e-1\"}") &&
             is_str(e2->element[0], "2-0") && e2->element[1]->elements == 4 &&
             is_str(e2->element[1]->element[1], "") && is_str(e2->element[1]->element[3], "c") &&
             is_str(e3->element[0], "3-0") && e3->element[1]->type == REDIS_REPLY_NIL;
    }
    test_cond(name, ok);
}

static void test_trees(void)
{
    px_reply_arena *a = px_reply_arena_new();
    redisReader *r = reader(a);
    redisReply *x = parse(r, xread, sizeof(xread) - 1, sizeof(xread));
    check_xread(x, "whole");
    test_cond("a reply alive is in the arena", px_reply_arena_in_use(a) > 0);
    r->fn->freeObject(x);
    test_cond("freed: the arena is rewound", px_reply_arena_in_use(a) == 0);

    x = parse(r, xread, sizeof(xread) - 1, 1);
    check_xread(x, "a byte at a time");
    r->fn->freeObject(x);

    x = parse(r, ":-42\r\n", 6, 6);
    test_cond("integer", x && x->type == REDIS_REPLY_INTEGER && x->integer == -42);
    r->fn->freeObject(x);
    x = parse(r, "$-1\r\n", 5, 5);
    test_cond("nil", x && x->type == REDIS_REPLY_NIL);
    r->fn->freeObject(x);
    x = parse(r, "+OK\r\n", 5, 5);
    test_cond("status", x && x->type == REDIS_REPLY_STATUS && strcmp(x->str, "OK") == 0 && x->len == 2);
    r->fn->freeObject(x);
    x = parse(r, "-BUSYGROUP exists\r\n", 19, 19);
    test_cond("error", x && x->type == REDIS_REPLY_ERROR && strcmp(x->str, "BUSYGROUP exists") == 0);
    r->fn->freeObject(x);
    x = parse(r, "*0\r\n", 4, 4);
    test_cond("empty array", x && x->type == REDIS_REPLY_ARRAY && x->elements == 0);
    r->fn->freeObject(x);
    x = parse(r, "*-1\r\n", 5, 5);
    test_cond("nil array", x && x->type == REDIS_REPLY_NIL);
    r->fn->freeObject(x);

    /* Many replies at once, each handed out and freed before the next, as
     * hiredis' async context does. */
    size_t n = 2000;
    char *many = malloc(n * (sizeof(xread) - 1));
    for (size_t i = 0; i < n; i++) memcpy(many + i * (sizeof(xread) - 1), xread, sizeof(xread) - 1);
    redisReaderFeed(r, many, n * (sizeof(xread) - 1));
    size_t got = 0, kept_max = 0;
    void *reply;
    while (redisReaderGetReply(r, &reply) == REDIS_OK && reply) {
        got++;
        r->fn->freeObject(reply);
        if (px_reply_arena_kept(a) > kept_max) kept_max = px_reply_arena_kept(a);
    }
    test_cond("2000 pipelined replies, one at a time", got == n && px_reply_arena_in_use(a) == 0);
    test_cond("memory reused: one chunk kept", kept_max == 64 * 1024);
    free(many);

    /* A 3 MB bulk string: its own chunk, given back when freed. */
    size_t big = 3u << 20;
    char *resp = malloc(big + 32);
    int h = snprintf(resp, 32, "$%zu\r\n", big);
    memset(resp + h, 'x', big);
    memcpy(resp + h + big, "\r\n", 2);
    x = parse(r, resp, (size_t)h + big + 2, 1 << 16);
    test_cond("a 3 MB string", x && x->len == big && x->str[0] == 'x' && x->str[big - 1] == 'x' &&
              x->str[big] == '\0');
    r->fn->freeObject(x);
    test_cond("its chunk is not kept", px_reply_arena_kept(a) <= 512 * 1024);
    free(resp);

    redisReaderFree(r);
    px_reply_arena_release(a);
}

static void test_cut_short(void)
{
    px_reply_arena *a = px_reply_arena_new();
    redisReader *r = reader(a);
    /* Half a reply, then garbage where a type byte should be. */
    void *reply = NULL;
    redisReaderFeed(r, "*3\r\n$1\r\na\r\n", 11);
    test_cond("half a reply: no reply yet", redisReaderGetReply(r, &reply) == REDIS_OK && reply == NULL);
    test_cond("its objects are in the arena", px_reply_arena_in_use(a) > 0);
    redisReaderFeed(r, "!oops\r\n", 7);
    test_cond("a protocol error", redisReaderGetReply(r, &reply) == REDIS_ERR && reply == NULL);
    test_cond("the half reply is freed: arena rewound", px_reply_arena_in_use(a) == 0);
    redisReaderFree(r);

    /* A reader freed with half a reply (a link that drops mid-reply). */
    r = reader(a);
    redisReaderFeed(r, "*2\r\n:1\r\n", 8);
    redisReaderGetReply(r, &reply);
    test_cond("half a reply held by a reader", reply == NULL && px_reply_arena_in_use(a) > 0);
    redisReaderFree(r);
    test_cond("freeing the reader frees it", px_reply_arena_in_use(a) == 0);

    /* Released while a reply is still in its callback (hiredis defers the
     * context's free until the callback returns): the reply stays readable
     * and the arena goes with it (valgrind and ASan see no leak). */
    r = reader(a);
    redisReply *x = parse(r, xread, sizeof(xread) - 1, sizeof(xread));
    px_reply_arena_release(a);
    check_xread(x, "after its arena was released");
    r->fn->freeObject(x);
    redisReaderFree(r);
}

/* A limit on the strings of one array (an entry's fields past
 * max_entry_bytes): the strings past it are elided with their lengths, the
 * arena holds none of their bytes; other arrays and root strings are kept. */
static void test_limit(void)
{
    px_reply_arena *a = px_reply_arena_new();
    px_reply_arena_limit(a, 1000);
    redisReader *r = reader(a);
    size_t big = 3u << 20;
    char *resp = malloc(big + 256);
    int h = snprintf(resp, 256, "*2\r\n*2\r\n$3\r\n1-0\r\n*4\r\n$1\r\na\r\n$%zu\r\n", big);
    memset(resp + h, 'x', big);
    size_t n = (size_t)h + big;
    n += (size_t)snprintf(resp + n, 64, "\r\n$1\r\nb\r\n$2\r\nok\r\n");
    n += (size_t)snprintf(resp + n, 64, "*2\r\n$3\r\n2-0\r\n*2\r\n$1\r\nc\r\n$1\r\nd\r\n");
    redisReply *x = parse(r, resp, n, 1 << 16);
    redisReply *f = x && x->elements == 2 ? x->element[0]->element[1] : NULL;
    test_cond("limit: the strings before it are kept",
              f && f->elements == 4 && is_str(f->element[0], "a"));
    test_cond("limit: a string past it is elided with its length",
              f && f->element[1]->type == PX_REPLY_ELIDED && f->element[1]->len == big &&
              f->element[1]->str && f->element[1]->str[0] == '\0');
    test_cond("limit: and so is every later string of that array",
              f && f->element[2]->type == PX_REPLY_ELIDED && f->element[3]->type == PX_REPLY_ELIDED &&
              f->element[3]->len == 2);
    test_cond("limit: the arena never held the big string", px_reply_arena_in_use(a) < 4096);
    redisReply *g = x && x->elements == 2 ? x->element[1] : NULL;
    test_cond("limit: another array is counted afresh",
              g && is_str(g->element[0], "2-0") && is_str(g->element[1]->element[1], "d"));
    r->fn->freeObject(x);
    redisReaderFree(r);
    r = reader(a);
    int hb = snprintf(resp, 32, "$%zu\r\n", big);
    memset(resp + hb, 'y', big);
    memcpy(resp + hb + big, "\r\n", 2);
    x = parse(r, resp, (size_t)hb + big + 2, 1 << 16);
    test_cond("limit: a string reply of its own is kept", x && x->type == REDIS_REPLY_STRING &&
              x->len == big && x->str[big - 1] == 'y');
    r->fn->freeObject(x);
    redisReaderFree(r);
    px_reply_arena_release(a);
    free(resp);
}

/* An array's header no longer sizes an allocation beyond what the daemon can
 * need (issue 37): "*2147483647" asked for 17 GB, and "*100000000" took
 * 800 MB, from 13 bytes a server sent. Past the cap the reply is a protocol
 * error that says why, and the arena holds nothing of it. */
static void test_huge_headers(void)
{
    static const struct { const char *resp, *label; } huge[] = {
        { "*2147483647\r\n", "*2147483647" },
        { "*100000000\r\n", "*100000000" },
        { "*1048577\r\n", "one element over the default cap" },
    };
    px_reply_arena *a = px_reply_arena_new();
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        redisReader *r = reader(a);
        void *reply = NULL;
        char label[128];
        redisReaderFeed(r, huge[i].resp, strlen(huge[i].resp));
        snprintf(label, sizeof(label), "%s: a protocol error, nothing kept", huge[i].label);
        test_cond(label, redisReaderGetReply(r, &reply) == REDIS_ERR && reply == NULL &&
                             px_reply_arena_in_use(a) == 0);
        snprintf(label, sizeof(label), "%s: the reason", huge[i].label);
        test_cond(label, strstr(px_reply_error(r), "elements, over the limit of 1048576") != NULL);
        redisReaderFree(r);
    }

    /* Inside a reply (an entry with more fields than any deliverable one): one
     * PX_REPLY_ELIDED object with the count announced, its elements read and
     * dropped, nothing allocated for them; the reply goes on after it. */
    {
        redisReader *r = reader(a);
        void *reply = NULL;
        const char *head = "*3\r\n:1\r\n*1048578\r\n";
        redisReaderFeed(r, head, strlen(head));
        test_cond("nested over the cap: read on, not refused",
                  redisReaderGetReply(r, &reply) == REDIS_OK && reply == NULL);
        size_t before = px_reply_arena_in_use(a);
        for (int i = 0; i < 1048578; i++) redisReaderFeed(r, "$1\r\nx\r\n", 7);
        test_cond("nested over the cap: its elements keep nothing", px_reply_arena_in_use(a) == before);
        redisReaderFeed(r, "$4\r\ntail\r\n", 10);
        test_cond("nested over the cap: the reply ends", redisReaderGetReply(r, &reply) == REDIS_OK && reply);
        redisReply *top = reply;
        test_cond("nested over the cap: elided, with its count",
                  top && top->elements == 3 && top->element[1]->type == PX_REPLY_ELIDED &&
                      top->element[1]->len == 1048578 && top->element[1]->elements == 0 &&
                      top->element[2]->type == REDIS_REPLY_STRING && strcmp(top->element[2]->str, "tail") == 0);
        if (reply) r->fn->freeObject(reply);
        redisReaderFree(r);
        reply = NULL;
        r = reader(a);
        const char *deep = "*1\r\n*1048577\r\n*2\r\n:1\r\n:2\r\n";
        redisReaderFeed(r, deep, strlen(deep));
        for (int i = 1; i < 1048577; i++) redisReaderFeed(r, "$-1\r\n", 5);
        test_cond("nested arrays under an elided one: dropped too",
                  redisReaderGetReply(r, &reply) == REDIS_OK && reply &&
                      ((redisReply *)reply)->element[0]->type == PX_REPLY_ELIDED);
        if (reply) r->fn->freeObject(reply);
        redisReaderFree(r);
    }

    /* The cap is the caller's (2 x max_entry_bytes), never below 1 Mi. */
    px_reply_arena_max_elements(a, 3u << 20);
    redisReader *r = reader(a);
    void *reply = NULL;
    redisReaderFeed(r, "*3145728\r\n", 10);
    test_cond("at the cap: read on", redisReaderGetReply(r, &reply) == REDIS_OK && reply == NULL &&
                                         px_reply_arena_in_use(a) > 0);
    redisReaderFree(r);
    r = reader(a);
    redisReaderFeed(r, "*3145729\r\n", 10);
    test_cond("one over: refused", redisReaderGetReply(r, &reply) == REDIS_ERR &&
                                       strstr(px_reply_error(r), "3145729 elements, over the limit of 3145728"));
    redisReaderFree(r);
    px_reply_arena_max_elements(a, 10);
    r = reader(a);
    redisReaderFeed(r, "*1000\r\n", 7);
    test_cond("never below 1 Mi", redisReaderGetReply(r, &reply) == REDIS_OK && reply == NULL);
    redisReaderFree(r);
    r = reader(a);
    redisReaderFeed(r, "!x\r\n", 4);
    test_cond("other protocol errors keep hiredis' words",
              redisReaderGetReply(r, &reply) == REDIS_ERR && strstr(px_reply_error(r), "Protocol error"));
    redisReaderFree(r);
    px_reply_arena_release(a);
}

/* A string announced longer than the cap is refused from its header, before
 * its bytes are buffered; so is a reply item that holds more than the cap. */
static void test_huge_strings(void)
{
    static const struct { const char *resp; size_t max; bool ok; const char *why; } cases[] = {
        { "$1000\r\nabc", 1000, true, NULL },
        { "$1001\r\nabc", 1000, false, "a string of 1001 bytes, over the limit of 1000" },
        { "$1001", 1000, false, "a string of 1001 bytes" },   /* its line not even ended */
        { "$99999999999999999999", 1000, false, "a string of over 9999 bytes" },
        { "*2\r\n$1\r\na\r\n$600000000\r\nxyz", PX_REPLY_MAX_BULK, false,
          "a string of 600000000 bytes, over the limit of 536870912" },
        { "*2\r\n$1\r\na\r\n$536870912\r\nxyz", PX_REPLY_MAX_BULK, true, NULL },
        { "+a status line that goes on and on, longer than any string may be, and never ends",
          10, false, "bytes of one reply item and no end, over the limit of 10" },
        { "*3\r\n:1\r\n", 10, true, NULL },
    };
    px_reply_arena *a = px_reply_arena_new();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redisReader *r = reader(a);
        void *reply = NULL;
        char why[160] = "", label[160];
        redisReaderFeed(r, cases[i].resp, strlen(cases[i].resp));
        int rc = redisReaderGetReply(r, &reply);
        bool ok = px_reply_pending_ok(r, cases[i].max, why, sizeof(why));
        snprintf(label, sizeof(label), "string case %zu: %s", i, why);
        test_cond(label, rc == REDIS_OK && reply == NULL && ok == cases[i].ok &&
                             (cases[i].why == NULL || strstr(why, cases[i].why)));
        redisReaderFree(r);
    }
    px_reply_arena_release(a);
}

int main(void)
{
    test_trees();
    test_cut_short();
    test_limit();
    test_huge_headers();
    test_huge_strings();
    return test_report();
}
