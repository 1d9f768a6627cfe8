/*
 * test_addr.c - the one "host:port" splitter (addr.c), used by the metrics
 * listener, `idemproxy health`, config.c (metrics.listen, the tcp:// endpoint,
 * redis.cluster seeds) and the cluster router (MOVED/ASK, CLUSTER SLOTS).
 * Each row pins one answer, the cases where the four splitters it replaced
 * disagreed among them.
 */
#include <string.h>

#include "addr.h"
#include "test.h"

#define OPT  PX_ADDR_HOST_OPTIONAL
#define BARE PX_ADDR_BARE_IPV6

typedef struct acase {
    const char *in;
    unsigned    flags;
    const char *host;       /* NULL: refused */
    int         port;
} acase;

static const acase cases[] = {
    /* the usual forms */
    { "127.0.0.1:9464", 0, "127.0.0.1", 9464 },
    { "redis-0.redis:6379", 0, "redis-0.redis", 6379 },
    { "localhost:1", 0, "localhost", 1 },
    { "h:65535", 0, "h", 65535 },
    { "h:06379", 0, "h", 6379 },                 /* five digits, a leading zero */
    { "[::1]:7002", 0, "::1", 7002 },
    { "[::]:9464", OPT, "::", 9464 },
    { "[fe80::1%eth0]:7000", 0, "fe80::1%eth0", 7000 },
    /* an empty host: a listen address only */
    { ":9464", OPT, "", 9464 },
    { ":9464", 0, NULL, 0 },
    { ":9464", BARE, NULL, 0 },
    { "[]:9464", OPT, NULL, 0 },                 /* empty brackets are not "no host" */
    /* IPv6 without brackets: as Redis Cluster writes it */
    { "fe80::1:7000", BARE, "fe80::1", 7000 },
    { "::1:7000", BARE, "::1", 7000 },
    { "fe80::1:7000", 0, NULL, 0 },
    { "::1:7000", OPT, NULL, 0 },
    /* the port */
    { "localhost", 0, NULL, 0 },
    { "localhost:", 0, NULL, 0 },
    { "h:0", 0, NULL, 0 },
    { "h:65536", 0, NULL, 0 },
    { "h:99999", 0, NULL, 0 },
    { "h:006379", 0, NULL, 0 },                  /* six digits */
    { "h:12a", 0, NULL, 0 },
    { "h:http", 0, NULL, 0 },                    /* no service names */
    { "h:+7000", BARE, NULL, 0 },                /* slots.c's strtol took a sign */
    { "h: 7000", BARE, NULL, 0 },                /* and a blank */
    { "h:-1", BARE, NULL, 0 },
    { "[::1]", 0, NULL, 0 },
    { "[::1]:", 0, NULL, 0 },
    /* brackets */
    { "[::1]x:7000", BARE, NULL, 0 },            /* the strrchr splitters took "[::1]x" */
    { "[::1:7000", BARE, NULL, 0 },              /* and "[::1" */
    { "::1]:7000", BARE, NULL, 0 },
    { "a]:7000", 0, NULL, 0 },
    { "[::1]7000", 0, NULL, 0 },
    { "[[::1]:7000", 0, NULL, 0 },                /* a bracket inside the brackets: "[::1" */
    { "[[x]:7000", BARE, NULL, 0 },               /* did not round-trip ("[x:7000" is refused) */
    { "", OPT | BARE, NULL, 0 },
};

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const acase *c = &cases[i];
        char name[120], host[64] = "untouched";
        int port = -7;
        bool ok = px_addr_split(c->in, host, sizeof(host), &port, c->flags);
        snprintf(name, sizeof(name), "'%s' flags %u", c->in, c->flags);
        if (c->host) {
            test_cond(name, ok && strcmp(host, c->host) == 0 && port == c->port);
        } else {
            test_cond(name, !ok && strcmp(host, "untouched") == 0 && port == -7);
        }
    }
    char host[8];
    int port;
    test_cond("NULL", !px_addr_split(NULL, host, sizeof(host), &port, OPT | BARE));
}

/* 'hostsize' counts the NUL: a host of hostsize - 1 characters fits, one more does not. */
static void test_sizes(void)
{
    char host[8];
    int port = 0;
    test_cond("7 characters fit in 8", px_addr_split("abcdefg:1", host, 8, &port, 0) &&
                                           strcmp(host, "abcdefg") == 0 && port == 1);
    test_cond("8 do not", !px_addr_split("abcdefgh:1", host, 8, &port, 0));
    test_cond("[v6] counted without brackets", px_addr_split("[1:2::3]:1", host, 8, &port, 0) &&
                                                   strcmp(host, "1:2::3") == 0);
    test_cond("bare v6 too", !px_addr_split("1:2:3::45:1", host, 8, &port, BARE));
    /* The daemon's buffers: a 253-character DNS name fits, 256 characters do not. */
    char big[PX_ADDR_HOST_MAX], in[400];
    memset(in, 'a', 253);
    strcpy(in + 253, ":6379");
    test_cond("a 253-character name fits PX_ADDR_HOST_MAX",
              px_addr_split(in, big, sizeof(big), &port, 0) && strlen(big) == 253);
    memset(in, 'a', 256);
    strcpy(in + 256, ":6379");
    test_cond("256 characters do not", !px_addr_split(in, big, sizeof(big), &port, 0));
}

int main(void)
{
    test_cases();
    test_sizes();
    return test_report();
}
