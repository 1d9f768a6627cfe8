/*
 * test_reader.c - the reader (proxy/reader.c) against a scripted stand-in for
 * its Redis links and the hub: each test answers the commands the reader sends,
 * in order, lost (the link stays up), late, or cut with the link mid-page, and
 * checks what it asks next and what it makes of the entries. The integration
 * and chaos suites stay the proof against real Redis; here a replay, a lost
 * reclaim or a takeover takes a few timer ticks, with no server.
 *
 * The stand-in replaces redis.h's calls, the hub's (px_proxy_read,
 * px_proxy_find, ...), step.h's hold and config.c's link options; reader.o,
 * entry.o, decide.o, hooks.o, log.o and px.o are the real ones.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "deliver.h"
#include "reader.h"
#include "trace.h"
#include "step.h"
#include "test.h"

/* --- the links --------------------------------------------------------------- */

struct px_redis {
    bool up;
    px_redis_state_cb *state_cb;
    void *udata;
};

typedef struct cmd {
    px_redis *link;
    px_redis_cb *cb;
    void *priv;
    int argc;
    char *argv[16]; /* the first 15 arguments, and the last */
    bool answered;
} cmd;

static cmd cmds[512];
static int ncmds;
static px_redis commands = { .up = true }; /* the command link (px->redis) */
static px_redis *reader_link;              /* the reader's own, made by px_redis_create */

px_redis *px_redis_create(struct ev_loop *loop, const px_redis_opts *opts, px_redis_state_cb *state_cb,
                          void *udata)
{
    (void)loop;
    (void)opts;
    reader_link = px_calloc(1, sizeof(*reader_link));
    reader_link->state_cb = state_cb;
    reader_link->udata = udata;
    return reader_link;
}

static void answer(cmd *c, redisReply *reply);

/* As link.c: the teardown answers every pending command with no reply. */
void px_redis_destroy(px_redis *r)
{
    for (int i = 0; i < ncmds; i++)
        if (cmds[i].link == r && !cmds[i].answered) answer(&cmds[i], NULL);
    if (r == reader_link) reader_link = NULL;
    free(r);
}

bool px_redis_is_up(const px_redis *r)
{
    return r->up;
}

bool px_redis_key_up(const px_redis *r, const char *key, size_t len)
{
    (void)key;
    (void)len;
    return r->up;
}

void px_script_init(px_script *s)
{
    snprintf(s->sha, sizeof(s->sha), "keep");
}

static int record(px_redis *r, px_redis_cb *cb, void *priv, int argc, const char **argv,
                  const size_t *lens)
{
    if (!r->up) return PX_ERR;
    if (ncmds == (int)(sizeof(cmds) / sizeof(cmds[0]))) abort();
    cmd *c = &cmds[ncmds++];
    *c = (cmd){ .link = r, .cb = cb, .priv = priv, .argc = argc };
    for (int i = 0; i < argc && i < 15; i++)
        c->argv[i] = lens ? px_strndup(argv[i], lens[i]) : px_strdup(argv[i]);
    if (argc > 15) c->argv[15] = lens ? px_strndup(argv[argc - 1], lens[argc - 1]) : px_strdup(argv[argc - 1]);
    if (cb == NULL) c->answered = true;
    return PX_OK;
}

int px_redis_argv(px_redis *r, const char *key, long long extra_ms, px_redis_cb *cb, void *priv,
                  int argc, const char **argv, const size_t *lens)
{
    (void)key;
    (void)extra_ms;
    return record(r, cb, priv, argc, argv, lens);
}

int px_redis_strv(px_redis *r, const char *key, px_redis_cb *cb, void *priv, int argc, const char **argv)
{
    (void)key;
    return record(r, cb, priv, argc, argv, NULL);
}

/* Recorded as "EVALSHA keep <nkeys> args...". */
int px_redis_script(px_redis *r, px_script *s, px_redis_cb *cb, void *priv, int nkeys, int argc,
                    const char **argv, const size_t *lens)
{
    const char *a[16];
    size_t l[16];
    char n[8];
    snprintf(n, sizeof(n), "%d", nkeys);
    a[0] = "EVALSHA", a[1] = s->sha, a[2] = n;
    for (int i = 0; i < 3; i++) l[i] = strlen(a[i]);
    for (int i = 0; i < argc && i < 13; i++) a[3 + i] = argv[i], l[3 + i] = lens[i];
    return record(r, cb, priv, 3 + argc, a, l);
}

/* --- the hub's part ------------------------------------------------------------ */

static struct ev_loop *loop;
static px_config config;
static px_stream_conf sconf;
static px_proxy proxy;
static px_stream stream;
static char taken_ids[512], trimmed_ids[512];

/* The windows' holds on the workers' answers (deliver.c): opened less ended. */
static int holds;
void px_deliver_hold(px_proxy *px)
{
    (void)px;
    holds++;
}

void px_deliver_unhold(px_proxy *px)
{
    (void)px;
    holds--;
}

/* px_entry_create (entry.c) made it: tracked, and on to its claim. */
void px_proxy_read(px_entry *e)
{
    px_stream *st = e->st;
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    st->tracked++;
    st->px->tracked++;
}

px_entry *px_proxy_find(px_stream *st, const char *id)
{
    for (px_entry *e = st->head; e; e = e->next)
        if (strcmp(e->id, id) == 0) return e;
    return NULL;
}

size_t px_proxy_room(px_proxy *px)
{
    return px->tracked < (size_t)px->conf->max_inflight ? (size_t)px->conf->max_inflight - px->tracked : 0;
}

size_t px_proxy_room_for(px_stream *st)
{
    return px_proxy_room(st->px);
}

void px_trace_entry_free(px_entry *e)
{
    (void)e;
}

void px_proxy_taken_over(px_entry *e)
{
    e->delivery.taken = true;
    strcat(strcat(taken_ids, e->id), " ");
}

void px_proxy_trimmed(px_stream *st, const char *id, bool ack)
{
    (void)st;
    (void)ack;
    strcat(strcat(trimmed_ids, id), " ");
}

void px_step_io_hold(px_entry *e)
{
    e->step.io++;
}

bool px_step_io_done(px_entry *e)
{
    e->step.io--;
    return !e->gone;
}

void px_config_redis_opts(const px_config *c, const char *name, const char *password, px_redis_opts *o)
{
    (void)c;
    (void)password;
    *o = (px_redis_opts){ .name = name };
}

/* An entry finished: off the list (the hub frees it at io 0). */
static void finish(const char *id)
{
    px_entry *e = px_proxy_find(&stream, id);
    if (e == NULL) return;
    if (e->prev) e->prev->next = e->next;
    else stream.head = e->next;
    if (e->next) e->next->prev = e->prev;
    stream.tracked--;
    proxy.tracked--;
    px_entry_free(e);
}

/* --- replies --------------------------------------------------------------------- */

static redisReply *r_new(int type)
{
    redisReply *r = px_calloc(1, sizeof(*r));
    r->type = type;
    return r;
}

static redisReply *r_str(const char *s)
{
    redisReply *r = r_new(REDIS_REPLY_STRING);
    r->str = px_strdup(s);
    r->len = strlen(s);
    return r;
}

static redisReply *r_int(long long v)
{
    redisReply *r = r_new(REDIS_REPLY_INTEGER);
    r->integer = v;
    return r;
}

static redisReply *r_err(const char *s)
{
    redisReply *r = r_str(s);
    r->type = REDIS_REPLY_ERROR;
    return r;
}

/* An array of 'n' replies. */
static redisReply *r_arr(size_t n, ...)
{
    redisReply *r = r_new(REDIS_REPLY_ARRAY);
    r->elements = n;
    r->element = px_calloc(n ? n : 1, sizeof(*r->element));
    va_list ap;
    va_start(ap, n);
    for (size_t i = 0; i < n; i++) r->element[i] = va_arg(ap, redisReply *);
    va_end(ap);
    return r;
}

/* A stream entry "id" with one field. */
static redisReply *r_entry(const char *id)
{
    return r_arr(2, r_str(id), r_arr(2, r_str("payload"), r_str("{}")));
}

/* XREADGROUP's reply: the stream and its entries (an array of r_entry). */
static redisReply *r_page(redisReply *entries)
{
    return r_arr(1, r_arr(2, r_str("s"), entries));
}

/* XPENDING's line for one entry. */
static redisReply *r_pending(const char *id, long long count)
{
    return r_arr(4, r_str(id), r_str("c1"), r_int(1000), r_int(count));
}

static void answer(cmd *c, redisReply *reply)
{
    c->answered = true;
    if (c->cb) c->cb(c->link, reply, c->priv);
    if (reply) freeReplyObject(reply);
}

/* --- the script ---------------------------------------------------------------------- */

static const char *arg(const cmd *c, int i)
{
    return i < c->argc && i < 15 ? c->argv[i] : "";
}

static const char *last(const cmd *c)
{
    return c->argv[c->argc <= 15 ? c->argc - 1 : 15];
}

static bool is(const cmd *c, const char *name, const char *a1)
{
    return strcmp(c->argv[0], name) == 0 && (a1 == NULL || (c->argc > 1 && strcmp(c->argv[1], a1) == 0));
}

/* The oldest unanswered command named 'name' (and 'a1' when not NULL). */
static cmd *pending(const char *name, const char *a1)
{
    for (int i = 0; i < ncmds; i++)
        if (!cmds[i].answered && cmds[i].cb && is(&cmds[i], name, a1)) return &cmds[i];
    return NULL;
}

/* Runs the loop (timers) until such a command is out, for at most 5 s. */
static cmd *await(const char *name, const char *a1)
{
    double until = ev_time() + 5.0;
    cmd *c;
    while ((c = pending(name, a1)) == NULL && ev_time() < until) ev_run(loop, EVRUN_ONCE);
    if (c == NULL) fprintf(stderr, "no %s %s came\n", name, a1 ? a1 : "");
    return c;
}

/* Was a command named 'name' sent since command number 'from'? */
static bool sent_since(int from, const char *name)
{
    for (int i = from; i < ncmds; i++)
        if (is(&cmds[i], name, NULL)) return true;
    return false;
}

/* The count a set_count (the keep script with a count) wrote for 'id', or NULL. */
static const char *count_set(int from, const char *id)
{
    for (int i = from; i < ncmds; i++)
        if (is(&cmds[i], "EVALSHA", NULL) && cmds[i].argc == 8 && strcmp(last(&cmds[i]), id) == 0)
            return cmds[i].argv[6];
    return NULL;
}

/* A history read is an XREADGROUP without BLOCK; its cursor is its last argument. */
static bool history_read(const cmd *c)
{
    return c && is(c, "XREADGROUP", NULL) && strcmp(arg(c, 6), "STREAMS") == 0;
}

static void setup(int max_inflight, long long claim_idle_ms)
{
    for (int i = 0; i < ncmds; i++)
        for (int j = 0; j < 16; j++) free(cmds[i].argv[j]);
    memset(cmds, 0, sizeof(cmds));
    ncmds = 0;
    taken_ids[0] = trimmed_ids[0] = '\0';
    config = (px_config){ .max_inflight = max_inflight, .max_entry_bytes = 1 << 20 };
    static char s[] = "s", g[] = "g", c1[] = "c1", zero[] = "0";
    sconf = (px_stream_conf){ .stream = s, .group = g, .consumer = c1, .start = zero, .claim_idle_ms = claim_idle_ms };
    proxy = (px_proxy){ .loop = loop, .conf = &config, .redis = &commands };
    stream = (px_stream){ .px = &proxy, .conf = &sconf };
    commands.up = true;
    px_reader_start(&stream);
}

/* Link up, the group made: the reader replays its history from "0". */
static void start_history(void)
{
    reader_link->up = true;
    reader_link->state_cb(reader_link, true, reader_link->udata);
    answer(await("XGROUP", "CREATE"), r_err("BUSYGROUP Consumer Group name already exists"));
}

/* Up to the live read: an empty history. */
static cmd *start_live(void)
{
    start_history();
    cmd *h = await("XREADGROUP", NULL);
    test_cond("the replay starts from 0", history_read(h) && strcmp(last(h), "0") == 0);
    answer(h, r_page(r_arr(0)));
    cmd *live = await("XREADGROUP", NULL);
    test_cond("then reads new entries", live && strcmp(last(live), ">") == 0);
    return live;
}

/* As the daemon stops: the reader, then what is still out on the command
 * link (answered with no reply), then the entries, then the reader's memory. */
static void teardown(void)
{
    proxy.stopping = true;
    px_reader_stop(&stream);
    for (int i = 0; i < ncmds; i++)
        if (!cmds[i].answered) answer(&cmds[i], NULL);
    while (stream.head) finish(stream.head->id);
    px_reader_free(&stream);
}

/* --- the tests ----------------------------------------------------------------------- */

/* A live read lost while the link stays up (Redis handed 1-1 out, counted
 * once): the reader starts over and replays; the replay counts it again and
 * neither count was a delivery a worker saw: attempt 0, Redis' count set back
 * to 1 (the read that no worker saw stays counted once: the replay's own). */
static void test_replay_after_lost_read(void)
{
    setup(16, 30000);
    cmd *live = start_live();
    answer(live, NULL);
    answer(await("XGROUP", "CREATE"), r_err("BUSYGROUP Consumer Group name already exists"));
    cmd *h = await("XREADGROUP", NULL);
    test_cond("a lost read: the history again from 0", history_read(h) && strcmp(last(h), "0") == 0);
    int from = ncmds;
    answer(h, r_page(r_arr(1, r_entry("1-1"))));
    px_entry *e = px_proxy_find(&stream, "1-1");
    test_cond("the replay brings the entry back", e != NULL);
    test_cond("its claim waits for its count", e && e->delivery.counts_wait != 0);
    cmd *p = await("XPENDING", NULL);
    test_cond("its count is asked on the command link", p && p->link == &commands);
    answer(p, r_arr(1, r_pending("1-1", 2)));
    test_cond("neither the lost read nor the replay is charged", e && e->delivery.attempt == 0);
    test_cond("the claim goes ahead", e && e->delivery.counts_wait == 0);
    test_streq("Redis' count set back", count_set(from, "1-1"), "1");
    cmd *next = await("XREADGROUP", NULL);
    test_cond("the replay goes on after 1-1", history_read(next) && strcmp(last(next), "1-1") == 0);
    answer(next, r_page(r_arr(0)));
    next = await("XREADGROUP", NULL);
    test_cond("a whole replay: new entries", next && strcmp(last(next), ">") == 0);
    teardown();
}

/* A reclaim whose reply is lost (it took 7-1 from another consumer, count 2):
 * no reclaim goes out before the history is replayed, and the replay (count
 * 3) charges the one delivery a worker saw: attempt 1. */
static void test_lost_reclaim_then_replay(void)
{
    setup(16, 200); /* XAUTOCLAIM every 0.1 s */
    cmd *live = start_live();
    int from = ncmds;
    answer(await("XAUTOCLAIM", NULL), NULL);
    int lost = ncmds;
    for (double until = ev_time() + 0.3; ev_time() < until;) ev_run(loop, EVRUN_ONCE); /* 3 ticks */
    test_cond("no replay while the live read is out", !history_read(pending("XREADGROUP", NULL)));
    answer(live, r_new(REDIS_REPLY_NIL)); /* its BLOCK ends */
    cmd *h = await("XREADGROUP", NULL);
    test_cond("the replay a lost reclaim asked for", history_read(h) && strcmp(last(h), "0") == 0);
    test_cond("no reclaim between the loss and the replay", !sent_since(lost, "XAUTOCLAIM"));
    answer(h, r_page(r_arr(1, r_entry("7-1"))));
    answer(await("XPENDING", NULL), r_arr(1, r_pending("7-1", 3)));
    px_entry *e = px_proxy_find(&stream, "7-1");
    test_cond("the lost reclaim is not charged, the delivery before it is", e && e->delivery.attempt == 1);
    test_streq("Redis' count set back to 2", count_set(from, "7-1"), "2");
    answer(await("XREADGROUP", NULL), r_page(r_arr(0)));
    cmd *next = await("XREADGROUP", NULL);
    test_cond("then new entries", next && strcmp(last(next), ">") == 0);
    test_cond("and reclaims again", await("XAUTOCLAIM", NULL) != NULL);
    teardown();
}

/* A reclaim sent while live, answered (5-1) once a replay has begun and its
 * page filled the room: the replay goes on from its own place (1-2), not from
 * the reclaimed id (3ebcdc6: it skipped our entries between). */
static void test_reclaim_during_replay(void)
{
    setup(2, 200);
    cmd *live = start_live();
    cmd *reclaim = await("XAUTOCLAIM", NULL);
    answer(live, NULL); /* a read lost, the link up: start over, replay */
    answer(await("XGROUP", "CREATE"), r_err("BUSYGROUP Consumer Group name already exists"));
    cmd *h = await("XREADGROUP", NULL);
    test_cond("replaying", history_read(h) && strcmp(last(h), "0") == 0);
    answer(h, r_page(r_arr(2, r_entry("1-1"), r_entry("1-2"))));
    test_cond("no room: no read out", pending("XREADGROUP", NULL) == NULL);
    answer(reclaim, r_arr(3, r_str("0-0"), r_arr(1, r_entry("5-1")), r_arr(0)));
    test_cond("the reclaimed entry is taken", px_proxy_find(&stream, "5-1") != NULL);
    finish("1-1");
    finish("1-2");
    finish("5-1");
    px_reader_kick(&stream);
    cmd *next = pending("XREADGROUP", NULL);
    test_cond("the replay goes on from its own place", history_read(next) && strcmp(last(next), "1-2") == 0);
    teardown();
}

/* A refresh's keep script reports an id another consumer took over (our
 * refreshes were lost): that entry, and only it, is let go. */
static void test_takeover(void)
{
    setup(16, 300); /* refreshes every 0.1 s */
    cmd *live = start_live();
    answer(live, r_page(r_arr(2, r_entry("2-1"), r_entry("2-2"))));
    cmd *eval = await("EVAL", NULL);
    test_cond("the refresh names both entries", eval && eval->argc == 9);
    answer(eval, r_arr(1, r_str("2-1")));
    test_streq("the one taken over is let go", taken_ids, "2-1 ");
    px_entry *e = px_proxy_find(&stream, "2-2");
    test_cond("the other is still ours", e && !e->delivery.taken);
    teardown();
}

/* A history page cut mid-reply with its link: the reader starts over when
 * the link is back, and neither the cut read nor the replay is charged. */
static void test_history_cut(void)
{
    setup(16, 30000);
    start_history();
    cmd *h = await("XREADGROUP", NULL);
    int from = ncmds;
    reader_link->up = false; /* as link.c: the pending command answered NULL, then the state */
    answer(h, NULL);
    reader_link->state_cb(reader_link, false, reader_link->udata);
    test_cond("nothing is read while the link is down", pending("XREADGROUP", NULL) == NULL);
    start_history();
    h = await("XREADGROUP", NULL);
    test_cond("the history from 0 again", history_read(h) && strcmp(last(h), "0") == 0);
    answer(h, r_page(r_arr(1, r_entry("3-1"))));
    answer(await("XPENDING", NULL), r_arr(1, r_pending("3-1", 3)));
    px_entry *e = px_proxy_find(&stream, "3-1");
    test_cond("one delivery before the two reads", e && e->delivery.attempt == 1);
    test_streq("Redis' count set back to 2", count_set(from, "3-1"), "2");
    teardown();
}

/* The batch window waits in Redis: after a short live page, a BLPOP on the
 * window key with the window as its timeout, and the next read queued behind
 * it on the reader's link. Not answered by the window's end: a PING on the
 * command link wakes Redis, at most three. A refusal (NOPERM) keeps the window
 * local on that link (the next read waits for the timer, no BLPOP) until the
 * link is up again. While a window is out the workers' answers are held
 * (commit_ms 5 allows it), and every way it ends (nil, no reply, an error)
 * ends the hold. */
static void test_window(void)
{
    setup(16, 30000);
    sconf.linger_ms = 5;
    sconf.commit_ms = 5;
    config.ack_timeout_ms = 30000;
    config.streams = &sconf;
    config.nstreams = 1;
    holds = 0;
    cmd *live = start_live();
    answer(live, r_page(r_arr(1, r_entry("1-1"))));
    cmd *b = pending("BLPOP", NULL);
    test_cond("a short page: the window waits in Redis", b && b->link == reader_link);
    test_cond("... and holds the answers", holds == 1);
    test_streq("on the window key, in the stream's slot", b ? arg(b, 1) : NULL, "idemproxy:window:{s}:s");
    test_streq("for the window", b ? arg(b, 2) : NULL, "0.005");
    cmd *next = pending("XREADGROUP", NULL);
    test_cond("the next read queued behind it", next && b && next > b && next->link == reader_link);
    int from = ncmds;
    double until = ev_time() + 0.05;
    while (ev_time() < until) ev_run(loop, EVRUN_ONCE);
    int pings = 0;
    for (int i = from; i < ncmds; i++) pings += is(&cmds[i], "PING", NULL) && cmds[i].link == &commands;
    test_cond("past its end: Redis woken, at most three times", pings == 3);
    test_cond("... and the hold over: answers do not wait for a late window", holds == 0);
    answer(b, r_new(REDIS_REPLY_NIL));
    test_cond("its end ends no hold twice", holds == 0);
    answer(next, r_page(r_arr(1, r_entry("1-2"))));
    b = pending("BLPOP", NULL);
    next = pending("XREADGROUP", NULL);
    test_cond("held again", holds == 1);
    answer(b, r_new(REDIS_REPLY_NIL)); /* on time: no PING follows */
    test_cond("its end ends the hold", holds == 0);
    from = ncmds;
    until = ev_time() + 0.03;
    while (ev_time() < until) ev_run(loop, EVRUN_ONCE);
    test_cond("a window answered in time: Redis not woken", !sent_since(from, "PING"));
    answer(next, r_page(r_arr(1, r_entry("1-5"))));
    /* The link drops with a window out, as link.c does it: the state
     * callback first, then every pending command answered with no reply. */
    b = pending("BLPOP", NULL);
    next = pending("XREADGROUP", NULL);
    test_cond("a window and its read out", b && next);
    reader_link->up = false;
    reader_link->state_cb(reader_link, false, reader_link->udata);
    answer(b, NULL);
    test_cond("dropped: the hold ends", holds == 0);
    answer(next, NULL);
    from = ncmds;
    until = ev_time() + 0.03;
    while (ev_time() < until) ev_run(loop, EVRUN_ONCE);
    test_cond("dropped with a window out: Redis not woken", !sent_since(from, "PING"));
    reader_link->up = true;
    reader_link->state_cb(reader_link, true, reader_link->udata);
    answer(await("XGROUP", "CREATE"), r_err("BUSYGROUP Consumer Group name already exists"));
    cmd *h = await("XREADGROUP", NULL);
    test_cond("up again: the replay", history_read(h));
    answer(h, r_page(r_arr(0)));
    live = await("XREADGROUP", NULL);
    answer(live, r_page(r_arr(1, r_entry("1-6"))));
    b = pending("BLPOP", NULL);
    test_cond("the next short page: a window again", b != NULL);
    next = pending("XREADGROUP", NULL);
    test_cond("held again", holds == 1);
    answer(b, r_err("NOPERM User app has no permissions to run the 'blpop' command"));
    test_cond("refused: the hold ends", holds == 0);
    answer(next, r_page(r_arr(1, r_entry("1-3"))));
    test_cond("refused: no BLPOP on this link", pending("BLPOP", NULL) == NULL);
    test_cond("the window waits here: no read yet", pending("XREADGROUP", NULL) == NULL);
    next = await("XREADGROUP", NULL);
    test_cond("the read after the window's timer", next != NULL);
    answer(next, NULL); /* the link drops: every pending command lost */
    reader_link->up = false;
    reader_link->state_cb(reader_link, false, reader_link->udata);
    live = start_live();
    answer(live, r_page(r_arr(1, r_entry("1-4"))));
    b = pending("BLPOP", NULL);
    test_cond("up again: the window waits in Redis again, held", b != NULL && holds == 1);
    sconf.commit_ms = 2; /* shorter than the window: no answer may wait for its end */
    answer(b, r_new(REDIS_REPLY_NIL));
    answer(pending("XREADGROUP", NULL), r_page(r_arr(1, r_entry("1-7"))));
    b = pending("BLPOP", NULL);
    test_cond("a window longer than a stream's commit_ms holds nothing", b != NULL && holds == 0);
    answer(b, r_new(REDIS_REPLY_NIL));
    test_cond("... and its end ends none", holds == 0);
    /* Two stream blocks share the workers' connections: the smaller
     * commit_ms decides, whichever stream's window it is. */
    px_stream_conf two[2] = { sconf, sconf };
    two[0].commit_ms = 5;
    two[1].commit_ms = 0;
    sconf.commit_ms = 5;
    config.streams = two;
    config.nstreams = 2;
    answer(pending("XREADGROUP", NULL), r_page(r_arr(1, r_entry("1-8"))));
    b = pending("BLPOP", NULL);
    test_cond("another stream's commit_ms 0: no hold", b != NULL && holds == 0);
    answer(b, r_new(REDIS_REPLY_NIL));
    two[1].commit_ms = 100;
    answer(pending("XREADGROUP", NULL), r_page(r_arr(1, r_entry("1-9"))));
    b = pending("BLPOP", NULL);
    test_cond("both at least the window: held", b != NULL && holds == 1);
    answer(b, r_new(REDIS_REPLY_NIL));
    config.streams = &sconf;
    config.nstreams = 1;
    teardown();
}

int main(void)
{
    loop = ev_default_loop(0);
    px_log_setup(PX_LOG_ERROR, PX_LOG_TEXT); /* quiet */
    px_reader_init();
    test_replay_after_lost_read();
    test_lost_reclaim_then_replay();
    test_reclaim_during_replay();
    test_takeover();
    test_history_cut();
    test_window();
    return test_report();
}
