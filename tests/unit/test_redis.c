/*
 * test_redis.c - the pure part of proxy/redis.c: what HELLO 2 says about the
 * server (docs/operations.md: Redis 7.0 or newer, or Valkey), with replies
 * built by hiredis' own protocol reader from what the servers send; and how a
 * password file is read (an empty one: no password, no AUTH).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "redis.h"
#include "test.h"

static redisReply *parse_resp(const char *resp)
{
    redisReader *rd = redisReaderCreate();
    void *reply = NULL;
    redisReaderFeed(rd, resp, strlen(resp));
    if (redisReaderGetReply(rd, &reply) != REDIS_OK) reply = NULL;
    redisReaderFree(rd);
    return reply;
}

/* HELLO 2 as a server answers it: a flat array of names and values. */
static char *hello(const char *server, const char *version)
{
    static char buf[512];
    snprintf(buf, sizeof(buf),
             "*14\r\n$6\r\nserver\r\n$%zu\r\n%s\r\n$7\r\nversion\r\n$%zu\r\n%s\r\n"
             "$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:7\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n"
             "$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n",
             strlen(server), server, strlen(version), version);
    return buf;
}

static void test_server_check(void)
{
    static const struct { const char *server, *version; px_server_check want; const char *ver; } cases[] = {
        { "redis", "7.0.15", PX_SERVER_OK, "redis 7.0.15" },
        { "redis", "7.0.0", PX_SERVER_OK, "redis 7.0.0" },
        { "redis", "7.2.4", PX_SERVER_OK, "redis 7.2.4" },
        { "redis", "8.0.2", PX_SERVER_OK, "redis 8.0.2" },
        { "redis", "255.255.255", PX_SERVER_OK, "redis 255.255.255" },   /* unstable builds */
        { "redis", "10.1.0", PX_SERVER_OK, "redis 10.1.0" },
        { "valkey", "8.0.1", PX_SERVER_OK, "valkey 8.0.1" },
        { "valkey", "7.2.5", PX_SERVER_OK, "valkey 7.2.5" },
        { "redis", "6.2.14", PX_SERVER_OLD, "redis 6.2.14" },
        { "redis", "6.0.20", PX_SERVER_OLD, "redis 6.0.20" },
        { "redis", "6.9.9", PX_SERVER_OLD, "redis 6.9.9" },
        { "redis", "garbage", PX_SERVER_UNKNOWN, "redis garbage" },
        /* the version's digits come first: no blank or sign that strtol skips */
        { "redis", " 7.0.0", PX_SERVER_UNKNOWN, "redis  7.0.0" },
        { "redis", "+7.0.0", PX_SERVER_UNKNOWN, "redis +7.0.0" },
        { "redis", "-9", PX_SERVER_UNKNOWN, "redis -9" },
    };
    char ver[80];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redisReply *r = parse_resp(hello(cases[i].server, cases[i].version));
        char name[80];
        snprintf(name, sizeof(name), "%s %s", cases[i].server, cases[i].version);
        test_cond(name, r && px_redis_server_check(r, ver, sizeof(ver)) == cases[i].want);
        test_streq(name, ver, cases[i].ver);
        freeReplyObject(r);
    }

    /* Redis 5 and older know no HELLO. */
    redisReply *r = parse_resp("-ERR unknown command `HELLO`, with args beginning with: `2`, \r\n");
    test_cond("no HELLO: older than 6.0", px_redis_server_check(r, ver, sizeof(ver)) == PX_SERVER_OLD);
    test_streq("no HELLO: what the log says", ver, "older than 6.0 (no HELLO)");
    freeReplyObject(r);
    static const char *unknown[] = {
        "-NOPERM this user has no permissions to run the 'hello' command\r\n",
        "-NOAUTH HELLO must be called with the client already authenticated\r\n",
        "$-1\r\n", "+OK\r\n",
        "*2\r\n$6\r\nserver\r\n$5\r\nredis\r\n",          /* no version */
        "*1\r\n$7\r\nversion\r\n",                          /* a name without its value */
    };
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        r = parse_resp(unknown[i]);
        test_cond(unknown[i], r && px_redis_server_check(r, ver, sizeof(ver)) == PX_SERVER_UNKNOWN);
        freeReplyObject(r);
    }
    test_cond("no reply (link lost)", px_redis_server_check(NULL, ver, sizeof(ver)) == PX_SERVER_UNKNOWN);
}

/* px_redis_read_password on a file holding 'text'. */
static int read_pw(const char *text, char **out)
{
    char path[] = "/tmp/test_redis_pw_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) return -2;
    close(fd);
    int rc = px_redis_read_password(path, out);
    unlink(path);
    return rc;
}

static void test_read_password(void)
{
    static const struct { const char *text, *want; } cases[] = {
        { "s3cret\n", "s3cret" }, { "s3cret", "s3cret" }, { "s3cret\r\n", "s3cret" },
        { "first\nsecond\n", "first" }, { " spaced \n", " spaced " },
        { "", NULL }, { "\n", NULL }, { "\r\n", NULL },     /* empty: no password, no AUTH */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *pw = (char *)"unset", name[64];
        int rc = read_pw(cases[i].text, &pw);
        snprintf(name, sizeof(name), "password file case %zu", i);
        test_cond(name, rc == 0 && (cases[i].want ? pw && strcmp(pw, cases[i].want) == 0
                                                  : pw == NULL));
        if (rc == 0) free(pw);
    }
    char *pw = (char *)"unset";
    errno = 0;
    test_cond("missing password file: -1, ENOENT, NULL",
              px_redis_read_password("/nonexistent/idemproxy/pw", &pw) == -1 && errno == ENOENT &&
              pw == NULL);
}

int main(void)
{
    test_server_check();
    test_read_password();
    return test_report();
}
