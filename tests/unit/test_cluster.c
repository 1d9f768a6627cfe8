/*
 * test_cluster.c - the pure part of proxy/cluster.c: hash slots (checked
 * against CLUSTER KEYSLOT of Redis 7.0), MOVED/ASK parsing and CLUSTER SLOTS
 * parsing, with replies built by hiredis' own protocol reader. And the router
 * itself on a libev loop, against fake cluster nodes on real sockets in this
 * process, where a test decides what each node answers and when.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ev.h>
#include <hiredis/hiredis.h>

#include "cluster.h"
#include "log.h"
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
        "MOVED 1 host:0", "MOVED 1 host:70000", "MOVED 1 :7000", "MOVED 1 host:+7000",
        "ERR unknown command", "MOVEDX 1 a:1",
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
    char why[200];
    /* Two ranges as Redis 7 writes them: master, then replicas (ignored); the
     * second master has no known host ("") and is on the node asked. */
    redisReply *r = parse_resp(
        "*2\r\n"
        "*4\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$3\r\nid1\r\n*0\r\n"
        "*4\r\n$9\r\n127.0.0.1\r\n:7003\r\n$3\r\nid4\r\n*0\r\n"
        "*3\r\n:5461\r\n:16383\r\n*3\r\n$0\r\n\r\n:7001\r\n$3\r\nid2\r\n");
    px_slot_range *v;
    int n = px_cluster_parse_slots(r, "10.1.2.3", &v, why, sizeof(why));
    test_cond("two ranges", n == 2);
    test_streq("every range kept: no reason", why, "");
    if (n == 2) {
        test_cond("first range", v[0].start == 0 && v[0].end == 5460);
        test_streq("first master", v[0].addr, "127.0.0.1:7000");
        test_cond("second range", v[1].start == 5461 && v[1].end == 16383);
        test_streq("empty host is the node asked", v[1].addr, "10.1.2.3:7001");
    }
    free(v);
    freeReplyObject(r);

    r = parse_resp("*0\r\n");
    test_cond("no slots yet: zero ranges", px_cluster_parse_slots(r, "h", &v, why, sizeof(why)) == 0);
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
        test_cond(name, r != NULL && px_cluster_parse_slots(r, "h", &v, why, sizeof(why)) == -1 && v == NULL);
        freeReplyObject(r);
    }
    test_cond("NULL reply (link lost)", px_cluster_parse_slots(NULL, "h", &v, why, sizeof(why)) == -1);
}

/* Ranges a misbehaving server may send whose address no link can dial: each
 * is refused with a reason, and the well-formed range beside it is kept. */
static void test_parse_slots_bad_addresses(void)
{
    char why[200];
    char longhost[400];
    memset(longhost, 'a', 300);
    longhost[300] = '\0';
    static const struct { const char *what, *host; size_t hostlen; long long port; } cases[] = {
        { "a host with '['", "[::1", 4, 7001 },
        { "a host with ']'", "::1]", 4, 7001 },
        { "port 0", "h", 1, 0 },
        { "port 65536", "h", 1, 65536 },
        { "a negative port", "h", 1, -1 },
        { "a host with a NUL", "h\0x", 3, 7001 },
        { "a host with a blank", "h x", 3, 7001 },
        { "a host with a control byte", "h\nx", 3, 7001 },
        { "a host of 300 bytes", NULL, 300, 7001 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *host = cases[i].host ? cases[i].host : longhost;
        char resp[1024];
        int k = snprintf(resp, sizeof(resp),
                         "*2\r\n*3\r\n:0\r\n:99\r\n*2\r\n$1\r\ng\r\n:7000\r\n"
                         "*3\r\n:100\r\n:16383\r\n*2\r\n$%zu\r\n",
                         cases[i].hostlen);
        memcpy(resp + k, host, cases[i].hostlen);
        k += (int)cases[i].hostlen;
        k += snprintf(resp + k, sizeof(resp) - (size_t)k, "\r\n:%lld\r\n", cases[i].port);
        redisReader *rd = redisReaderCreate();
        void *reply = NULL;
        redisReaderFeed(rd, resp, (size_t)k);
        if (redisReaderGetReply(rd, &reply) != REDIS_OK) reply = NULL;
        redisReaderFree(rd);
        px_slot_range *v = NULL;
        int n = reply ? px_cluster_parse_slots(reply, "10.1.2.3", &v, why, sizeof(why)) : -2;
        char name[80];
        snprintf(name, sizeof(name), "%s: refused, the good range kept", cases[i].what);
        test_cond(name, n == 1 && v[0].start == 0 && v[0].end == 99 && strcmp(v[0].addr, "g:7000") == 0);
        snprintf(name, sizeof(name), "%s: the reason names the range", cases[i].what);
        test_cond(name, n < 0 || strncmp(why, "slots 100-16383: ", 17) == 0);
        free(v);
        if (reply) freeReplyObject(reply);
    }
}

/* --- fake cluster nodes ------------------------------------------------------
 * A listening socket on the test's loop; each connection's commands (RESP
 * arrays of bulk strings) go to the node's handler, which writes replies. */

typedef struct fake_node fake_node;
typedef struct fake_conn {
    fake_node *node;
    int        fd;
    ev_io      w;
    char       buf[8192];
    size_t     len;
    struct fake_conn *next;
} fake_conn;

struct fake_node {
    int        port, lfd;
    ev_io      accept_w;
    fake_conn *conns;
    void     (*on_cmd)(fake_node *n, fake_conn *c, int argc, char **argv);
    void      *data;
};

static void fake_send(fake_conn *c, const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(c->fd, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* One complete command at the start of buf: its arguments (NUL-terminated in
 * place) and the bytes it took; 0 while incomplete. */
static size_t fake_parse(char *buf, size_t len, int *argc, char **argv, int max)
{
    char *p = buf, *end = buf + len;
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (len == 0 || *p != '*' || nl == NULL) return 0;
    int n = atoi(p + 1);
    p = nl + 1;
    for (int i = 0; i < n; i++) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL || *p != '$') return 0;
        long l = atol(p + 1);
        p = nl + 1;
        if (end - p < l + 2) return 0;
        if (i < max) argv[i] = p;
        p[l] = '\0';
        p += l + 2;
    }
    *argc = n < max ? n : max;
    return (size_t)(p - buf);
}

static void fake_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    fake_conn *c = w->data;
    ssize_t r = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len - 1);
    if (r <= 0) { ev_io_stop(loop, w); close(c->fd); c->fd = -1; return; }
    c->len += (size_t)r;
    for (;;) {
        char *argv[16];
        int argc = 0;
        size_t used = fake_parse(c->buf, c->len, &argc, argv, 16);
        if (used == 0) break;
        if (c->node->on_cmd) c->node->on_cmd(c->node, c, argc, argv);
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
    }
}

static void fake_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    fake_node *n = w->data;
    int fd = accept(n->lfd, NULL, NULL);
    if (fd < 0) return;
    fake_conn *c = calloc(1, sizeof(*c));
    c->node = n;
    c->fd = fd;
    c->next = n->conns;
    n->conns = c;
    ev_io_init(&c->w, fake_read_cb, fd, EV_READ);
    c->w.data = c;
    ev_io_start(loop, &c->w);
}

static void fake_listen(struct ev_loop *loop, fake_node *n)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof(a);
    n->lfd = socket(AF_INET, SOCK_STREAM, 0);
    bind(n->lfd, (struct sockaddr *)&a, sizeof(a));
    listen(n->lfd, 16);
    getsockname(n->lfd, (struct sockaddr *)&a, &al);
    n->port = ntohs(a.sin_port);
    ev_io_init(&n->accept_w, fake_accept_cb, n->lfd, EV_READ);
    n->accept_w.data = n;
    ev_io_start(loop, &n->accept_w);
}

/* Close every connection and stop listening: connects are refused from now on. */
static void fake_close(struct ev_loop *loop, fake_node *n)
{
    while (n->conns) {
        fake_conn *c = n->conns;
        n->conns = c->next;
        if (c->fd >= 0) { ev_io_stop(loop, &c->w); close(c->fd); }
        free(c);
    }
    if (n->lfd >= 0) { ev_io_stop(loop, &n->accept_w); close(n->lfd); n->lfd = -1; }
}

/* Run the loop until *flag or 'secs' pass; every turn, the largest number of
 * slots seen pointing at a freed node goes into *stale (when given). */
static void run_until(struct ev_loop *loop, const bool *flag, double secs, px_redis *r, size_t *stale)
{
    ev_tstamp end = ev_time() + secs;
    while ((flag == NULL || !*flag) && ev_time() < end) {
        ev_run(loop, EVRUN_ONCE | EVRUN_NOWAIT);
        if (r && stale) {
            size_t s = px_cluster_stale_slots(px_redis_router(r));
            if (s > *stale) *stale = s;
        }
        usleep(1000);
    }
}

/* Issue 15, item 10: a MOVED naming a node that the slot map does not list
 * (a known node whose link is down, here a seed that is not a master) lands
 * right after a map reply, in the same read: the map's cleanup, due on the
 * next loop turn, must not free the node the slot table now points at. */
typedef struct moved_case {
    int  port, other;            /* this node's and the MOVED target's ports */
    bool hold_slots;             /* keep the next CLUSTER SLOTS reply */
    char held[256];
    int  moved_j;
} moved_case;

static void node_p(fake_node *n, fake_conn *c, int argc, char **argv)
{
    moved_case *m = n->data;
    char out[512];
    if (argc >= 1 && strcasecmp(argv[0], "PING") == 0) {
        fake_send(c, "+PONG\r\n");
    } else if (argc >= 2 && strcasecmp(argv[0], "CLUSTER") == 0) {
        char map[200];
        snprintf(map, sizeof(map), "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", m->port);
        if (m->hold_slots) { snprintf(m->held, sizeof(m->held), "%s", map); m->hold_slots = false; }
        else fake_send(c, map);
    } else if (argc >= 2 && strcmp(argv[1], "j") == 0 && m->moved_j++ == 0) {
        snprintf(out, sizeof(out), "-MOVED %u 127.0.0.1:%d\r\n", px_cluster_slot("j", 1), m->port);
        fake_send(c, out);              /* to itself: only to make the router ask for the map */
    } else if (argc >= 2 && strcmp(argv[1], "k") == 0 && m->held[0]) {
        /* The held map and a MOVED to the other node, in one write. */
        snprintf(out, sizeof(out), "%s-MOVED %u 127.0.0.1:%d\r\n", m->held, px_cluster_slot("k", 1),
                 m->other);
        m->held[0] = '\0';
        fake_send(c, out);
    } else {
        fake_send(c, "$-1\r\n");
    }
}

typedef struct got { bool done; bool nil; } got;

static void got_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    got *g = priv;
    g->done = true;
    g->nil = reply && reply->type == REDIS_REPLY_NIL;
}

static void test_moved_to_unmapped_node(void)
{
    struct ev_loop *loop = EV_DEFAULT;
    moved_case m = {0};
    fake_node p = { .on_cmd = node_p, .data = &m }, q = { .on_cmd = NULL };   /* q never answers */
    fake_listen(loop, &p);
    fake_listen(loop, &q);
    m.port = p.port;
    m.other = q.port;
    char sp[32], sq[32];
    snprintf(sp, sizeof(sp), "127.0.0.1:%d", p.port);
    snprintf(sq, sizeof(sq), "127.0.0.1:%d", q.port);
    const char *seeds[] = { sp, sq };
    px_redis_opts o = { .name = "test", .timeout_ms = 5000, .seeds = seeds, .nseeds = 2 };
    px_redis *r = px_redis_create(loop, &o, NULL, NULL);
    for (int i = 0; i < 5000 && !px_redis_is_up(r); i++) run_until(loop, NULL, 0.001, NULL, NULL);
    test_cond("cluster up on the fake node", px_redis_is_up(r));
    /* q's PING is still unanswered, so the first map's cleanup kept it. Now q
     * goes away: its link is down and idle between reconnects (0.1, 0.3, 0.7,
     * 1.5, 3.1 s), a known node that is no master. */
    fake_close(loop, &q);
    run_until(loop, NULL, 2.0, NULL, NULL);

    got gj = {0}, gk = {0};
    size_t stale = 0;
    m.hold_slots = true;               /* the refresh that MOVED j causes: held */
    const char *j[] = { "GET", "j" }, *k[] = { "GET", "k" };
    test_cond("GET j sent", px_redis_strv(r, "j", got_cb, &gj, 2, j) == PX_OK);
    run_until(loop, &gj.done, 3.0, r, &stale);
    for (int i = 0; i < 3000 && !m.held[0]; i++) run_until(loop, NULL, 0.001, NULL, NULL);
    test_cond("GET j answered after its MOVED", gj.done && gj.nil);
    test_cond("a map reply held back", m.held[0] != '\0');
    test_cond("GET k sent", px_redis_strv(r, "k", got_cb, &gk, 2, k) == PX_OK);
    run_until(loop, &gk.done, 3.0, r, &stale);
    test_cond("GET k answered once the map is asked again", gk.done && gk.nil);
    test_cond("no slot ever pointed at a freed node", stale == 0);
    if (stale) fprintf(stderr, "  %zu slots pointed at a freed node\n", stale);
    px_redis_destroy(r);
    fake_close(loop, &p);
    run_until(loop, NULL, 0.05, NULL, NULL);
}

/* Issue 16: a command routes by the key its caller names, never by its second
 * argument. Two masters, each with half the slots; XINFO GROUPS <stream> must
 * reach the stream's master, though "GROUPS" hashes to the other one. */
typedef struct route_map { int port[2]; } route_map;
typedef struct route_node { route_map *map; int xinfo; } route_node;

static void node_half(fake_node *n, fake_conn *c, int argc, char **argv)
{
    route_node *rn = n->data;
    if (argc >= 1 && strcasecmp(argv[0], "PING") == 0) {
        fake_send(c, "+PONG\r\n");
    } else if (argc >= 2 && strcasecmp(argv[0], "CLUSTER") == 0) {
        char map[300];
        snprintf(map, sizeof(map), "*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
                 "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
                 rn->map->port[0], rn->map->port[1]);
        fake_send(c, map);
    } else if (argc >= 1 && strcasecmp(argv[0], "XINFO") == 0) {
        rn->xinfo++;
        fake_send(c, "*0\r\n");
    } else {
        fake_send(c, "$-1\r\n");
    }
}

static void test_explicit_routing_key(void)
{
    struct ev_loop *loop = EV_DEFAULT;
    route_map map;
    route_node ra = { &map, 0 }, rb = { &map, 0 };
    fake_node a = { .on_cmd = node_half, .data = &ra }, b = { .on_cmd = node_half, .data = &rb };
    fake_listen(loop, &a);
    fake_listen(loop, &b);
    map.port[0] = a.port;
    map.port[1] = b.port;
    /* A stream on the other half from "GROUPS". */
    bool groups_on_a = px_cluster_slot("GROUPS", 6) < 8192;
    char stream[16] = "";
    for (int i = 0; i < 100 && !stream[0]; i++) {
        char s[16];
        snprintf(s, sizeof(s), "orders-%d", i);
        if ((px_cluster_slot(s, strlen(s)) < 8192) != groups_on_a) snprintf(stream, sizeof(stream), "%s", s);
    }
    char sa[32];
    snprintf(sa, sizeof(sa), "127.0.0.1:%d", a.port);
    const char *seeds[] = { sa };
    px_redis_opts o = { .name = "test", .timeout_ms = 5000, .seeds = seeds, .nseeds = 1 };
    px_redis *r = px_redis_create(loop, &o, NULL, NULL);
    for (int i = 0; i < 5000 && !px_redis_is_up(r); i++) run_until(loop, NULL, 0.001, NULL, NULL);
    test_cond("two-master cluster up", px_redis_is_up(r));
    got g = {0};
    const char *xinfo[] = { "XINFO", "GROUPS", stream };
    test_cond("XINFO GROUPS sent", px_redis_strv(r, stream, got_cb, &g, 3, xinfo) == PX_OK);
    run_until(loop, &g.done, 3.0, NULL, NULL);
    route_node *owner = groups_on_a ? &rb : &ra, *other = groups_on_a ? &ra : &rb;
    test_cond("XINFO GROUPS answered", g.done);
    test_cond("XINFO GROUPS went to the stream's master", owner->xinfo == 1 && other->xinfo == 0);
    if (!(owner->xinfo == 1 && other->xinfo == 0))
        fprintf(stderr, "  stream %s: its master saw %d, the other %d\n", stream, owner->xinfo, other->xinfo);
    px_redis_destroy(r);
    fake_close(loop, &a);
    fake_close(loop, &b);
    run_until(loop, NULL, 0.05, NULL, NULL);
}

/* A key made beside a user's key ("idemproxy:...{tag}..."): in its slot, with
 * braces or none, an empty tag, a lone closing brace. */
static void test_tag(void)
{
    static const char *const names[] = { "room", "{orders}.events", "a{}b", "a}b{c}", "x}", "{}", "s{", "" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        px_buf b = { 0 };
        px_buf_appends(&b, "idemproxy:window:{");
        px_cluster_tag(names[i], &b);
        px_buf_printf(&b, "}:%s", names[i]);
        char what[80];
        snprintf(what, sizeof(what), "the tag of \"%s\" is in its slot", names[i]);
        test_cond(what, px_cluster_slot(b.data, b.len) == px_cluster_slot(names[i], strlen(names[i])));
        px_buf_deinit(&b);
    }
}

int main(void)
{
    px_log_setup(PX_LOG_WARN, PX_LOG_TEXT);
    test_slots();
    test_redirect();
    test_parse_slots();
    test_parse_slots_bad_addresses();
    test_moved_to_unmapped_node();
    test_explicit_routing_key();
    test_tag();
    return test_report();
}
