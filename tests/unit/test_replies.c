/*
 * test_replies.c - proxy/replies.c: the claim, XPENDING, XINFO and pub/sub
 * replies, built by hiredis' own protocol reader from what Redis 7.0 sends
 * and from what a misbehaving server could send instead: every value is read
 * only from an element of its type, and strings are compared whole.
 */
#include <stdlib.h>

#include <hiredis/hiredis.h>

#include "replies.h"
#include "test.h"

#define RESP(s) s, sizeof(s) - 1

static redisReply *parse(const char *resp, size_t n)
{
    redisReader *rd = redisReaderCreate();
    void *reply = NULL;
    redisReaderFeed(rd, resp, n);
    if (redisReaderGetReply(rd, &reply) != REDIS_OK) reply = NULL;
    redisReaderFree(rd);
    return reply;
}

static void test_scalars(void)
{
    static const struct { const char *what, *resp; size_t n; px_lock_reply want; } lock[] = {
        { "nil: taken", RESP("$-1\r\n"), PX_LOCK_TAKEN },
        { "our value: taken", RESP("$5\r\nL:abc\r\n"), PX_LOCK_TAKEN },
        { "another value: busy", RESP("$5\r\nL:xyz\r\n"), PX_LOCK_BUSY },
        { "the done mark", RESP("$1\r\nD\r\n"), PX_LOCK_DONE },
        { "our value, a NUL and more: busy", RESP("$7\r\nL:abc\0x\r\n"), PX_LOCK_BUSY },
        { "an integer: malformed", RESP(":0\r\n"), PX_LOCK_NONE },
        { "a status: malformed", RESP("+OK\r\n"), PX_LOCK_NONE },
        { "an array: malformed", RESP("*1\r\n$5\r\nL:abc\r\n"), PX_LOCK_NONE },
    };
    for (size_t i = 0; i < sizeof(lock) / sizeof(lock[0]); i++) {
        redisReply *r = parse(lock[i].resp, lock[i].n);
        test_cond(lock[i].what, r != NULL && px_rp_lock_set(r, "L:abc") == lock[i].want);
        freeReplyObject(r);
    }
    test_cond("no reply: malformed", px_rp_lock_set(NULL, "L:abc") == PX_LOCK_NONE);

    long long v = 42;
    redisReply *r = parse(RESP(":1\r\n"));
    test_cond("an integer", px_rp_int(r, &v) && v == 1);
    freeReplyObject(r);
    static const char *not_int[] = { "$1\r\n1\r\n", "+1\r\n", "$-1\r\n", "*0\r\n" };
    for (size_t i = 0; i < sizeof(not_int) / sizeof(not_int[0]); i++) {
        r = parse(not_int[i], strlen(not_int[i]));
        v = 42;
        test_cond(not_int[i], r != NULL && !px_rp_int(r, &v) && v == 42);
        freeReplyObject(r);
    }
    const char *s;
    size_t len;
    r = parse(RESP("$-1\r\n"));
    test_cond("nil", px_rp_str_or_nil(r, &s, &len) && s == NULL);
    freeReplyObject(r);
    r = parse(RESP(":7\r\n"));
    test_cond("an integer is not a string", !px_rp_str_or_nil(r, &s, &len));
    freeReplyObject(r);

    test_cond("an id", px_rp_stream_id("1700000000000-0", 15));
    static const char *bad_ids[] = { "", "1", "1-", "-1", "1-1-1", "a-1", "1-1 ", "123456789012345678901-0" };
    for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++)
        test_cond(bad_ids[i], !px_rp_stream_id(bad_ids[i], strlen(bad_ids[i])));
    test_cond("an id with a NUL", !px_rp_stream_id("1-1\0" "2", 5));
}

static void test_xpending(void)
{
    char why[200];
    px_rp_pending *v;
    /* As Redis 7.0 answers XPENDING s g - + 10 c. */
    redisReply *r = parse(RESP("*2\r\n*4\r\n$3\r\n1-0\r\n$1\r\nc\r\n:5\r\n:1\r\n"
                               "*4\r\n$3\r\n2-7\r\n$1\r\nc\r\n:9\r\n:3\r\n"));
    long n = px_rp_xpending(r, &v, why, sizeof(why));
    test_cond("two entries", n == 2 && strcmp(v[0].id, "1-0") == 0 && v[0].count == 1 &&
                                 v[0].idle_ms == 5 && strcmp(v[1].id, "2-7") == 0 && v[1].count == 3);
    free(v);
    freeReplyObject(r);
    r = parse(RESP("*0\r\n"));
    test_cond("none", px_rp_xpending(r, &v, why, sizeof(why)) == 0);
    free(v);
    freeReplyObject(r);
    static const struct { const char *what, *resp; size_t n; } bad[] = {
        { "a count that is a string", RESP("*1\r\n*4\r\n$3\r\n1-0\r\n$1\r\nc\r\n:5\r\n$1\r\n3\r\n") },
        { "idle a string", RESP("*1\r\n*4\r\n$3\r\n1-0\r\n$1\r\nc\r\n$1\r\n5\r\n:1\r\n") },
        { "an id that is an integer", RESP("*1\r\n*4\r\n:1\r\n$1\r\nc\r\n:5\r\n:1\r\n") },
        { "an id with a NUL", RESP("*1\r\n*4\r\n$4\r\n1-0\0\r\n$1\r\nc\r\n:5\r\n:1\r\n") },
        { "three elements", RESP("*1\r\n*3\r\n$3\r\n1-0\r\n$1\r\nc\r\n:5\r\n") },
        { "a negative count", RESP("*1\r\n*4\r\n$3\r\n1-0\r\n$1\r\nc\r\n:5\r\n:-1\r\n") },
        { "the consumer an integer", RESP("*1\r\n*4\r\n$3\r\n1-0\r\n:1\r\n:5\r\n:1\r\n") },
        { "not an array", RESP("+OK\r\n") },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = parse(bad[i].resp, bad[i].n);
        why[0] = '\0';
        test_cond(bad[i].what, r != NULL && px_rp_xpending(r, &v, why, sizeof(why)) == -1 && v == NULL &&
                                   why[0] != '\0');
        freeReplyObject(r);
    }
}

static void test_xinfo(void)
{
    char why[200];
    px_rp_consumer *v;
    /* As Redis 7.0 answers XINFO CONSUMERS s g. */
    redisReply *r = parse(RESP("*2\r\n*8\r\n$4\r\nname\r\n$2\r\nc1\r\n$7\r\npending\r\n:0\r\n$4\r\nidle\r\n"
                               ":7200000\r\n$8\r\ninactive\r\n:7200000\r\n"
                               "*6\r\n$4\r\nname\r\n$2\r\nc2\r\n$7\r\npending\r\n:3\r\n$4\r\nidle\r\n:10\r\n"));
    long n = px_rp_xinfo_consumers(r, &v, why, sizeof(why));
    test_cond("two consumers", n == 2 && v[0].name_len == 2 && memcmp(v[0].name, "c1", 2) == 0 &&
                                   v[0].pending == 0 && v[0].idle_ms == 7200000 && v[1].pending == 3);
    free(v);
    freeReplyObject(r);
    /* A consumer whose pending is unknown must not look idle and empty. */
    static const struct { const char *what, *resp; size_t n; } bad[] = {
        { "pending a string", RESP("*1\r\n*6\r\n$4\r\nname\r\n$2\r\nc1\r\n$7\r\npending\r\n$1\r\n0\r\n"
                                   "$4\r\nidle\r\n:9000000\r\n") },
        { "no pending", RESP("*1\r\n*4\r\n$4\r\nname\r\n$2\r\nc1\r\n$4\r\nidle\r\n:9000000\r\n") },
        { "idle nil", RESP("*1\r\n*6\r\n$4\r\nname\r\n$2\r\nc1\r\n$7\r\npending\r\n:0\r\n$4\r\nidle\r\n$-1\r\n") },
        { "pending twice", RESP("*1\r\n*8\r\n$4\r\nname\r\n$2\r\nc1\r\n$7\r\npending\r\n:5\r\n$7\r\npending\r\n:0\r\n"
                                "$4\r\nidle\r\n:9000000\r\n") },
        { "an odd map", RESP("*1\r\n*7\r\n$4\r\nname\r\n$2\r\nc1\r\n$7\r\npending\r\n:0\r\n$4\r\nidle\r\n"
                             ":9000000\r\n$1\r\nx\r\n") },
        { "no name", RESP("*1\r\n*4\r\n$7\r\npending\r\n:0\r\n$4\r\nidle\r\n:9000000\r\n") },
        { "the key 'pending' with a NUL after it", RESP("*1\r\n*6\r\n$4\r\nname\r\n$2\r\nc1\r\n$8\r\npending\0\r\n:0\r\n"
                                                       "$4\r\nidle\r\n:9000000\r\n") },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = parse(bad[i].resp, bad[i].n);
        test_cond(bad[i].what, r != NULL && px_rp_xinfo_consumers(r, &v, why, sizeof(why)) == -1 && v == NULL);
        freeReplyObject(r);
    }

    /* XINFO GROUPS s, as Redis 7.0 answers: lag nil when it cannot tell. */
    long long pending = -1, lag = -1;
    bool pk, lk;
    r = parse(RESP("*2\r\n*4\r\n$4\r\nname\r\n$2\r\ng0\r\n$7\r\npending\r\n:9\r\n"
                   "*8\r\n$4\r\nname\r\n$1\r\ng\r\n$9\r\nconsumers\r\n:1\r\n$7\r\npending\r\n:4\r\n$3\r\nlag\r\n$-1\r\n"));
    test_cond("the group", px_rp_xinfo_group(r, "g", &pending, &pk, &lag, &lk) && pk && pending == 4 && !lk);
    test_cond("a group not there", !px_rp_xinfo_group(r, "h", &pending, &pk, &lag, &lk) && !pk && !lk);
    freeReplyObject(r);
    r = parse(RESP("*1\r\n*4\r\n$4\r\nname\r\n$1\r\ng\r\n$7\r\npending\r\n$1\r\n4\r\n"));
    test_cond("pending a string: unknown", px_rp_xinfo_group(r, "g", &pending, &pk, &lag, &lk) && !pk);
    freeReplyObject(r);
    r = parse(RESP("*1\r\n*4\r\n$4\r\nname\r\n$2\r\ng\0\r\n$7\r\npending\r\n:4\r\n"));
    test_cond("a name with a NUL is another group", !px_rp_xinfo_group(r, "g", &pending, &pk, &lag, &lk));
    freeReplyObject(r);
}

static void test_pubsub(void)
{
    static const struct { const char *what, *resp; size_t n; bool want; } cases[] = {
        { "a message", RESP("*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nx\r\n"), true },
        { "subscribe", RESP("*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n"), false },
        { "message and a NUL", RESP("*3\r\n$8\r\nmessage\0\r\n$1\r\nc\r\n$1\r\nx\r\n"), false },
        { "message as a status", RESP("*3\r\n+message\r\n$1\r\nc\r\n$1\r\nx\r\n"), false },
        { "two elements", RESP("*2\r\n$7\r\nmessage\r\n$1\r\nc\r\n"), false },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redisReply *r = parse(cases[i].resp, cases[i].n);
        test_cond(cases[i].what, r != NULL && px_rp_pubsub_message(r) == cases[i].want);
        freeReplyObject(r);
    }
}

int main(void)
{
    test_scalars();
    test_xpending();
    test_xinfo();
    test_pubsub();
    return test_report();
}
