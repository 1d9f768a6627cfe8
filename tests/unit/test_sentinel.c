/*
 * test_sentinel.c - the pure part of proxy/sentinel.c (sentinel_reply.c):
 * SENTINEL get-master-addr-by-name replies, +switch-master messages and ROLE
 * replies, the replies built by hiredis' own protocol reader from what Redis
 * 7.0 and its sentinel send.
 */
#include <stdlib.h>

#include <hiredis/hiredis.h>

#include "sentinel.h"
#include "test.h"

#define RESP(s) s, sizeof(s) - 1

/* 'n' bytes of RESP (a NUL inside a string is part of it). */
static redisReply *parse_resp_n(const char *resp, size_t n)
{
    redisReader *rd = redisReaderCreate();
    void *reply = NULL;
    redisReaderFeed(rd, resp, n);
    if (redisReaderGetReply(rd, &reply) != REDIS_OK) reply = NULL;
    redisReaderFree(rd);
    return reply;
}

static redisReply *parse_resp(const char *resp)
{
    redisReader *rd = redisReaderCreate();
    void *reply = NULL;
    redisReaderFeed(rd, resp, strlen(resp));
    if (redisReaderGetReply(rd, &reply) != REDIS_OK) reply = NULL;
    redisReaderFree(rd);
    return reply;
}

static px_sn_addr addr(const char *resp, char *host, size_t hostsize, int *port, char *why)
{
    redisReply *r = parse_resp(resp);
    px_sn_addr a = px_sentinel_parse_addr(r, host, hostsize, port, why, 200);
    if (r) freeReplyObject(r);
    return a;
}

static void test_addr(void)
{
    char host[64], why[200];
    int port = 0;
    test_cond("[ip, port]", addr("*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6380\r\n", host, sizeof(host),
                                 &port, why) == PX_SN_ADDR_OK &&
                                strcmp(host, "127.0.0.1") == 0 && port == 6380);
    test_cond("an IPv6 address", addr("*2\r\n$3\r\n::1\r\n$5\r\n26379\r\n", host, sizeof(host),
                                      &port, why) == PX_SN_ADDR_OK &&
                                     strcmp(host, "::1") == 0 && port == 26379);
    test_cond("nil: no such master", addr("*-1\r\n", host, sizeof(host), &port, why) ==
                                             PX_SN_ADDR_UNKNOWN &&
                                         strstr(why, "no master") != NULL);
    test_cond("an error reply", addr("-NOAUTH Authentication required.\r\n", host, sizeof(host),
                                     &port, why) == PX_SN_ADDR_BAD &&
                                    strstr(why, "NOAUTH") != NULL);
    static const char *bad[] = {
        "*2\r\n$9\r\n127.0.0.1\r\n$1\r\n0\r\n",          /* port 0 */
        "*2\r\n$9\r\n127.0.0.1\r\n$5\r\n70000\r\n",      /* port too large */
        "*2\r\n$9\r\n127.0.0.1\r\n$2\r\n6x\r\n",         /* not a number */
        "*2\r\n$0\r\n\r\n$4\r\n6379\r\n",                /* no host */
        "*1\r\n$9\r\n127.0.0.1\r\n",                     /* no port */
        "*2\r\n:1\r\n:2\r\n",                            /* integers */
        "+OK\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        test_cond(bad[i], addr(bad[i], host, sizeof(host), &port, why) == PX_SN_ADDR_BAD);
    test_cond("a host longer than the buffer", addr("*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6379\r\n",
                                                    host, 9, &port, why) == PX_SN_ADDR_BAD);
    test_cond("no reply", px_sentinel_parse_addr(NULL, host, sizeof(host), &port, why, 200) ==
                              PX_SN_ADDR_BAD);
    test_cond("an error without text still has a reason",
              addr("-\r\n", host, sizeof(host), &port, why) == PX_SN_ADDR_BAD && why[0] != '\0');

    /* A host the sentinel did not name must not be dialled: with a NUL, the
     * link would connect to the part before it. */
    static const struct { const char *what, *resp; size_t n; } hostile[] = {
                { "a NUL in the host", RESP("*2\r\n$13\r\n10.0.0.1\0evil\r\n$4\r\n6379\r\n") },
        { "a control byte in the host", RESP("*2\r\n$9\r\n10.0.0.1\n\r\n$4\r\n6379\r\n") },
        { "a NUL in the port", RESP("*2\r\n$9\r\n127.0.0.1\r\n$5\r\n6379\0\r\n") },
    };
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        redisReply *r = parse_resp_n(hostile[i].resp, hostile[i].n);
        test_cond(hostile[i].what, r != NULL && px_sentinel_parse_addr(r, host, sizeof(host), &port,
                                                                       why, 200) == PX_SN_ADDR_BAD);
        if (r) freeReplyObject(r);
    }
}

static void test_switch(void)
{
    char host[64];
    int port = 0;
    test_cond("our master", px_sentinel_parse_switch("mymaster 127.0.0.1 6379 127.0.0.1 6380", strlen("mymaster 127.0.0.1 6379 127.0.0.1 6380"),
                                                     "mymaster", host, sizeof(host), &port) &&
                                strcmp(host, "127.0.0.1") == 0 && port == 6380);
    test_cond("another master", !px_sentinel_parse_switch("other 10.0.0.1 6379 10.0.0.2 6379", strlen("other 10.0.0.1 6379 10.0.0.2 6379"),
                                                          "mymaster", host, sizeof(host), &port));
    test_cond("a prefix of our name", !px_sentinel_parse_switch("my 1.1.1.1 1 2.2.2.2 2", strlen("my 1.1.1.1 1 2.2.2.2 2"),
                                                                "mymaster", host, sizeof(host), &port));
    test_cond("our name is a prefix", !px_sentinel_parse_switch("mymaster2 1.1.1.1 1 2.2.2.2 2", strlen("mymaster2 1.1.1.1 1 2.2.2.2 2"),
                                                                 "mymaster", host, sizeof(host), &port));
    static const char *bad[] = {
        "mymaster 1.1.1.1 1 2.2.2.2", "mymaster 1.1.1.1 1 2.2.2.2 2 extra", "mymaster",
        "mymaster 1.1.1.1 x 2.2.2.2 2", "mymaster 1.1.1.1 1 2.2.2.2 0", "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        test_cond(bad[i], !px_sentinel_parse_switch(bad[i], strlen(bad[i]), "mymaster", host, sizeof(host), &port));
    /* The whole text is read: a NUL does not end it. */
    static const char nul[] = "mymaster 1.1.1.1 1 2.2.2.2 2\0 extra";
    test_cond("a NUL then more words", !px_sentinel_parse_switch(nul, sizeof(nul) - 1, "mymaster", host,
                                                                 sizeof(host), &port));
    static const char ctl[] = "mymaster 1.1.1.1 1 2.2.2.\x01 2";
    test_cond("a control byte in the host", !px_sentinel_parse_switch(ctl, sizeof(ctl) - 1, "mymaster",
                                                                      host, sizeof(host), &port));
    /* The message as the subscription link hands it over. */
    static const struct { const char *what, *resp; size_t n; bool ok; } msgs[] = {
        { "a switch", RESP("*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n"
                           "$38\r\nmymaster 127.0.0.1 6379 127.0.0.1 6380\r\n"), true },
        { "another channel", RESP("*3\r\n$7\r\nmessage\r\n$6\r\n+sdown\r\n"
                                  "$38\r\nmymaster 127.0.0.1 6379 127.0.0.1 6380\r\n"), false },
        { "a NUL in the text", RESP("*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n"
                                    "$40\r\nmymaster 127.0.0.1 6379 127.0.0.1 6380\0x\r\n"), false },
        { "the text an integer", RESP("*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n:1\r\n"), false },
        { "subscribe", RESP("*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n"), false },
    };
    for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
        redisReply *r = parse_resp_n(msgs[i].resp, msgs[i].n);
        test_cond(msgs[i].what, r != NULL && px_sentinel_parse_message(r, "mymaster", host, sizeof(host),
                                                                       &port) == msgs[i].ok);
        if (r) freeReplyObject(r);
    }
}

static bool role(const char *resp, char *out)
{
    redisReply *r = parse_resp(resp);
    bool m = px_sentinel_role_master(r, out, 32);
    if (r) freeReplyObject(r);
    return m;
}

static void test_role(void)
{
    char out[32];
    /* as Redis 7.0 answers: a master with one replica, a replica, a sentinel */
    test_cond("master", role("*3\r\n$6\r\nmaster\r\n:3129\r\n*1\r\n*3\r\n$9\r\n127.0.0.1\r\n"
                             "$4\r\n9001\r\n$4\r\n3129\r\n", out) &&
                            strcmp(out, "master") == 0);
    test_cond("slave", !role("*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:9000\r\n$9\r\nconnected"
                             "\r\n:3167\r\n", out) &&
                           strcmp(out, "slave") == 0);
    test_cond("sentinel", !role("*2\r\n$8\r\nsentinel\r\n*1\r\n$8\r\nmymaster\r\n", out) &&
                              strcmp(out, "sentinel") == 0);
    test_cond("an error", !role("-ERR unknown command\r\n", out) && strcmp(out, "?") == 0);
    test_cond("no reply", !px_sentinel_role_master(NULL, out, sizeof(out)));
    /* The whole element is compared: "master" then a NUL is not "master". */
    redisReply *r = parse_resp_n(RESP("*1\r\n$8\r\nmaster\0x\r\n"));
    test_cond("master and a NUL", r != NULL && !px_sentinel_role_master(r, out, sizeof(out)));
    if (r) freeReplyObject(r);
}

int main(void)
{
    test_addr();
    test_switch();
    test_role();
    return test_report();
}
