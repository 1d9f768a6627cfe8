/*
 * fuzz_sentinel.c - libFuzzer target for what a sentinel (or a master asked
 * ROLE) sends back (proxy/sentinel_reply.c).
 *
 * The input as RESP (hiredis' reader, the daemon's reply arena) and, whole,
 * as the text of a +switch-master message. The oracles, beyond no crash:
 *  1. an address accepted (get-master-addr-by-name, or a switch) is a host
 *     with no NUL, blank or control byte and a port 1-65535, and it round
 *     trips: written back as [ip, port] (or as a switch text) and read
 *     again, it is the same host and port;
 *  2. the host is the sentinel's bytes, all of them: a reply's ip element
 *     exactly, a switch text's fourth word exactly;
 *  3. ROLE is master only when its first element is exactly "master".
 */
#include "resp.h"
#include "sentinel.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static void check_host(const char *host, int port)
{
    for (const char *p = host; *p; p++)
        FUZZ_CHECK((unsigned char)*p > ' ' && *p != 0x7f, "host has byte %02x", (unsigned char)*p);
    FUZZ_CHECK(host[0] != '\0', "an empty host");
    FUZZ_CHECK(port >= 1 && port <= 65535, "port %d", port);
}

static void check_addr(const redisReply *r)
{
    char host[256], why[200];
    int port = 0;
    px_sn_addr a = px_sentinel_parse_addr(r, host, sizeof(host), &port, why, sizeof(why));
    FUZZ_CHECK(a == PX_SN_ADDR_OK || why[0], "refused without a reason");
    if (a != PX_SN_ADDR_OK) return;
    check_host(host, port);
    const redisReply *ip = r->element[0];
    FUZZ_CHECK(strlen(host) == ip->len && memcmp(host, ip->str, ip->len) == 0, "host is not the ip");
    resp_out o = { 0 };
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    resp_head(&o, '*', 2);
    resp_cstr(&o, host);
    resp_cstr(&o, p);
    resp_read rr;
    resp_read_open(&rr, o.d, o.n);
    char host2[256];
    int port2 = 0;
    FUZZ_CHECK(rr.reply && px_sentinel_parse_addr(rr.reply, host2, sizeof(host2), &port2, why,
                                                  sizeof(why)) == PX_SN_ADDR_OK &&
                   strcmp(host2, host) == 0 && port2 == port,
               "round trip of %s:%d", host, port);
    resp_read_close(&rr);
    free(o.d);
}

static void switch_round_trip(const char *host, int port)
{
    char text[400], host2[256];
    int port2 = 0;
    int n = snprintf(text, sizeof(text), "mymaster 10.0.0.1 6379 %s %d", host, port);
    FUZZ_CHECK(px_sentinel_parse_switch(text, (size_t)n, "mymaster", host2, sizeof(host2), &port2) &&
                   strcmp(host2, host) == 0 && port2 == port,
               "round trip of %s:%d", host, port);
}

/* The fourth word of 'msg' ('len' bytes, words split at blanks) is 'host'. */
static bool fourth_word(const char *msg, size_t len, const char *host)
{
    size_t i = 0;
    for (int w = 0; w < 4; w++) {
        while (i < len && msg[i] == ' ') i++;
        size_t start = i;
        while (i < len && msg[i] != ' ') i++;
        if (w == 3) return i - start == strlen(host) && memcmp(msg + start, host, i - start) == 0;
    }
    return false;
}

static void check_message(const redisReply *r)
{
    char host[256];
    int port = 0;
    if (!px_sentinel_parse_message(r, "mymaster", host, sizeof(host), &port)) return;
    check_host(host, port);
    const redisReply *t = r->element[2];
    FUZZ_CHECK(fourth_word(t->str, t->len, host), "host %s is not the text's", host);
    switch_round_trip(host, port);
}

static void check_role(const redisReply *r)
{
    char role[32];
    bool m = px_sentinel_role_master(r, role, sizeof(role));
    if (m)
        FUZZ_CHECK(r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
                       r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len == 6 &&
                       memcmp(r->element[0]->str, "master", 6) == 0,
                   "master, but the reply does not say so");
    FUZZ_CHECK(memchr(role, '\0', sizeof(role)) != NULL, "role not terminated");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char host[256];
    int port = 0;
    const char *text = (const char *)data;
    if (px_sentinel_parse_switch(text, size, "mymaster", host, sizeof(host), &port)) {
        check_host(host, port);
        FUZZ_CHECK(fourth_word(text, size, host), "host %s is not the text's", host);
        switch_round_trip(host, port);
    }

    if (resp_huge(data, size)) return 0;
    resp_read rr;
    resp_read_open(&rr, data, size);
    if (rr.reply) {
        check_addr(rr.reply);
        check_message(rr.reply);
        check_role(rr.reply);
    }
    resp_read_close(&rr);
    return 0;
}
