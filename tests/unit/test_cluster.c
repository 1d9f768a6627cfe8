/*
 * test_cluster.c - the pure part of proxy/cluster.c: hash slots (checked
 * against CLUSTER KEYSLOT of Redis 7.0), MOVED/ASK parsing and CLUSTER SLOTS
 * parsing, with replies built by hiredis' own protocol reader.
 */
#include <stdlib.h>

#include <hiredis/hiredis.h>

#include "cluster.h"
#include "test.h"

static void test_slots(void)
{
    static const struct { const char *key; unsigned slot; } cases[] = {
        /* CLUSTER KEYSLOT on redis-server 7.0.15 */
        { "foo", 12182 }, { "bar", 5061 }, { "hello", 866 }, { "123456789", 12739 },
        { "{user1000}.following", 3443 }, { "{user1000}.followers", 3443 },
        { "foo{}{bar}", 8363 },        /* empty first tag: the whole key */
        { "foo{{bar}}zap", 4015 },     /* the tag is "{bar" */
        { "foo{bar}{zap}", 5061 },     /* the first tag only: "bar" */
        { "{}foo", 9500 },
        { "orders:{0}", 13907 }, { "orders:{7}", 1716 },
        { "lock:{abc}", 7638 }, { "done:{abc}", 7638 },   /* hash_tag: one slot */
        { "lock:abc", 6323 }, { "done:abc", 1922 },       /* without: two */
        { "\xc3\xa9", 10180 }, { "", 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[80];
        snprintf(name, sizeof(name), "slot of '%s'", cases[i].key);
        test_cond(name, px_cluster_slot(cases[i].key, strlen(cases[i].key)) == cases[i].slot);
    }
    test_cond("a NUL inside the key counts", px_cluster_slot("a\0b", 3) != px_cluster_slot("a", 1));
}

static void test_redirect(void)
{
    px_redirect r;
    test_cond("MOVED", px_cluster_redirect("MOVED 3999 127.0.0.1:6381", &r) && !r.ask &&
                       r.slot == 3999 && strcmp(r.addr, "127.0.0.1:6381") == 0);
    test_cond("ASK", px_cluster_redirect("ASK 12182 10.0.0.7:7000", &r) && r.ask &&
                     r.slot == 12182 && strcmp(r.addr, "10.0.0.7:7000") == 0);
    test_cond("IPv6 host", px_cluster_redirect("MOVED 1 ::1:7000", &r) && strcmp(r.addr, "::1:7000") == 0);
    static const char *bad[] = {
        "MOVED", "MOVED 12", "MOVED x 127.0.0.1:1", "MOVED 16384 127.0.0.1:1", "MOVED 1 host",
        "MOVED 1 host:0", "MOVED 1 host:70000", "MOVED 1 :7000", "ERR unknown command", "MOVEDX 1 a:1",
        "TRYAGAIN Multiple keys request during rehashing of slot", "CLUSTERDOWN The cluster is down",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) test_cond(bad[i], !px_cluster_redirect(bad[i], &r));
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

static void test_parse_slots(void)
{
    /* Two ranges as Redis 7 writes them: master, then replicas (ignored); the
     * second master has no known host ("") and is on the node asked. */
    redisReply *r = parse_resp(
        "*2\r\n"
        "*4\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$3\r\nid1\r\n*0\r\n"
        "*4\r\n$9\r\n127.0.0.1\r\n:7003\r\n$3\r\nid4\r\n*0\r\n"
        "*3\r\n:5461\r\n:16383\r\n*3\r\n$0\r\n\r\n:7001\r\n$3\r\nid2\r\n");
    px_slot_range *v;
    int n = px_cluster_parse_slots(r, "10.1.2.3", &v);
    test_cond("two ranges", n == 2);
    if (n == 2) {
        test_cond("first range", v[0].start == 0 && v[0].end == 5460);
        test_streq("first master", v[0].addr, "127.0.0.1:7000");
        test_cond("second range", v[1].start == 5461 && v[1].end == 16383);
        test_streq("empty host is the node asked", v[1].addr, "10.1.2.3:7001");
    }
    free(v);
    freeReplyObject(r);

    r = parse_resp("*0\r\n");
    test_cond("no slots yet: zero ranges", px_cluster_parse_slots(r, "h", &v) == 0);
    free(v);
    freeReplyObject(r);

    static const char *bad[] = {
        "-ERR This instance has cluster support disabled\r\n",
        "+OK\r\n",
        "*1\r\n:1\r\n",                                               /* not a range */
        "*1\r\n*2\r\n:0\r\n:10\r\n",                                  /* no master */
        "*1\r\n*3\r\n:10\r\n:5\r\n*2\r\n$1\r\nh\r\n:1\r\n",           /* end before start */
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",        /* past the last slot */
        "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n:1\r\n:1\r\n",                 /* host not a string */
        "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n$1\r\n1\r\n",       /* port not an integer */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = parse_resp(bad[i]);
        char name[40];
        snprintf(name, sizeof(name), "bad slot map %zu", i);
        test_cond(name, r != NULL && px_cluster_parse_slots(r, "h", &v) == -1 && v == NULL);
        freeReplyObject(r);
    }
    test_cond("NULL reply (link lost)", px_cluster_parse_slots(NULL, "h", &v) == -1);
}

static void test_split_addr(void)
{
    char host[64];
    int port;
    test_cond("host:port", px_cluster_split_addr("redis-0.redis:6379", host, sizeof(host), &port) &&
                           strcmp(host, "redis-0.redis") == 0 && port == 6379);
    test_cond("IPv6", px_cluster_split_addr("fe80::1:7000", host, sizeof(host), &port) &&
                      strcmp(host, "fe80::1") == 0 && port == 7000);
    test_cond("[IPv6]", px_cluster_split_addr("[::1]:7002", host, sizeof(host), &port) &&
                        strcmp(host, "::1") == 0 && port == 7002);
    test_cond("no port", !px_cluster_split_addr("localhost", host, sizeof(host), &port));
    test_cond("port 0", !px_cluster_split_addr("h:0", host, sizeof(host), &port));
    test_cond("port junk", !px_cluster_split_addr("h:12a", host, sizeof(host), &port));
    test_cond("host too long", !px_cluster_split_addr("abcdefghij:1", host, 8, &port));
}

int main(void)
{
    test_slots();
    test_redirect();
    test_parse_slots();
    test_split_addr();
    return test_report();
}
