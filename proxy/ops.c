/*
 * ops.c - see ops.h. `inspect` only reads. `redrive` writes with one script
 * per dead letter, which does everything or nothing:
 *
 *   the dead letter is still there?  no: return 0 (another run took it)
 *   XDEL it, XADD its original fields (all but idemproxy's last four) to the
 *   source stream, and delete the done mark its dead-lettering wrote
 *
 * so two runs at once, or one run twice, redrive each dead letter once. The
 * script's keys are the dead-letter stream, the source stream and the done
 * mark: on a Redis Cluster they may sit in different slots, which a script
 * cannot touch together; then a claim stands in for it (redrive_steps).
 * Every command is routed by the key it is about, so on a cluster it goes to
 * the master of that key's slot.
 * `keys` only reads: XREVRANGE pages of one stream (below, "keys").
 */
#include "ops.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>
#include <hiredis/hiredis.h>

#include "claim.h"
#include "commit.h"
#include "event.h"
#include "log.h"

#define OPS_PAGE       1000   /* entries per XRANGE */
#define OPS_SCAN_MAX   100000 /* inspect: dead letters looked at, at most */
#define OPS_SHOW_BYTES 1000   /* inspect: a field value longer is cut */

/* 's' as text a terminal shows as it is (px_buf_escape): no escape
 * sequence or byte that is not UTF-8 of a producer's key, a worker's reason
 * or anything else read from Redis reaches it raw. One of four buffers, so
 * one printf can show up to four. */
static const char *show(const char *s)
{
    static px_buf ring[4];
    static unsigned next;
    px_buf *b = &ring[next++ % 4];
    px_buf_reset(b);
    px_buf_escape(b, s, strlen(s), PX_ESC_BACKSLASH);
    return b->data ? b->data : "";
}

/* A JSON string of 's' ('n' bytes): json-c escapes controls but copies
 * bytes as they are, so a byte that is not UTF-8 becomes the text \xNN
 * first, or the output would not be JSON. */
static json_object *jstr_len(const char *s, size_t n)
{
    if (px_utf8_valid(s, n)) return json_object_new_string_len(s, (int)n);
    px_buf b = { 0 };
    px_buf_escape(&b, s, n, PX_ESC_BYTES);
    json_object *o = json_object_new_string_len(b.data, (int)b.len);
    px_buf_deinit(&b);
    return o;
}

static json_object *jstr(const char *s)
{
    return jstr_len(s, strlen(s));
}

bool px_config_password(const px_config *c, const char *who, char **out)
{
    *out = NULL;
    if (c->password_file) {
        if (px_redis_read_password(c->password_file, out) != 0) {
            fprintf(stderr, "%s: redis.password_file %s: cannot read it: %s\n", who,
                    c->password_file, strerror(errno));
            return false;
        }
    } else if (c->redis_password) {
        *out = px_strdup(c->redis_password);
    }
    if (*out == NULL && c->redis_user) {
        fprintf(stderr, "%s: redis.password_file %s is empty: user \"%s\" needs a password "
                        "(without one idemproxy sends no AUTH; remove redis.username for that)\n",
                who,
                c->password_file ? c->password_file : "", c->redis_user);
        return false;
    }
    return true;
}

/* --- setup ----------------------------------------------------------------- */

/* The block of --stream (and --group when given), or NULL after saying why. */
static px_stream_conf *find_stream(px_config *c, const px_ops_args *a, const char *cmd)
{
    px_stream_conf *found = NULL;
    size_t n = 0;
    for (size_t i = 0; i < c->nstreams; i++) {
        px_stream_conf *sc = &c->streams[i];
        if (strcmp(sc->stream, a->stream) != 0) continue;
        if (a->group && !(sc->group && strcmp(sc->group, a->group) == 0)) continue;
        if (found == NULL) found = sc;
        n++;
    }
    if (found == NULL) {
        fprintf(stderr, "idemproxy %s: %s has no stream block for '%s'%s%s\n", cmd, c->path,
                a->stream, a->group ? " with group " : "", a->group ? a->group : "");
        return NULL;
    }
    if (n > 1) {
        fprintf(stderr, "idemproxy %s: %s reads '%s' with %zu groups; say which with --group\n",
                cmd, c->path, a->stream, n);
        return NULL;
    }
    return found;
}

/* The operator commands speak to Redis through the daemon's own connection
 * module (redis.h, link.c), on a private loop run until each reply is in: a
 * rediss:// url, redis.tls, an ACL user, a password file, redis.sentinel and
 * a name that resolves to several addresses work as they do for the daemon,
 * and the server version is checked the same way. One command at a time. */
typedef struct ops_conn {
    struct ev_loop *loop;
    px_redis *r;
    bool up;
    const char *err; /* why the last command has no reply */
} ops_conn;

static void ops_state_cb(px_redis *r, bool up, void *udata)
{
    (void)r;
    ((ops_conn *)udata)->up = up;
}

static void ops_deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ONE);
}

/* A copy of 'r' that outlives the callback (the link's replies live in its
 * arena), allocated as hiredis allocates, so freeReplyObject frees it. */
static redisReply *reply_dup(const redisReply *r)
{
    redisReply *c = px_calloc(1, sizeof(*c));
    c->type = r->type;
    c->integer = r->integer;
    if ((r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
         r->type == REDIS_REPLY_ERROR) &&
        r->str) {
        c->len = r->len;
        c->str = px_malloc(r->len + 1);
        memcpy(c->str, r->str, r->len);
        c->str[r->len] = '\0';
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements) {
        c->elements = r->elements;
        c->element = px_calloc(r->elements, sizeof(*c->element));
        for (size_t i = 0; i < r->elements; i++) c->element[i] = reply_dup(r->element[i]);
    }
    return c;
}

typedef struct ops_wait {
    bool done;
    redisReply *reply;
} ops_wait;

static void ops_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    ops_wait *w = priv;
    w->done = true;
    w->reply = reply ? reply_dup(reply) : NULL;
}

/* One command's reply (the caller frees it), or NULL with ctx->err set.
 * 'key' routes it on a cluster: the key the command is about (a script's
 * KEYS[1]). A page of 1,000 entries may take longer than a connect, hence
 * the extra 5 s. */
static redisReply *ops_argv(ops_conn *ctx, const char *key, int argc, const char **argv,
                            const size_t *lens)
{
    ops_wait w = { false, NULL };
    if (!ctx->up || px_redis_argv(ctx->r, key, 5000, ops_reply_cb, &w, argc, argv, lens) != PX_OK) {
        ctx->err = "the connection to Redis is down";
        return NULL;
    }
    while (!w.done) ev_run(ctx->loop, EVRUN_ONCE);
    if (w.reply == NULL) ctx->err = "no reply: the connection was lost or the command timed out";
    return w.reply;
}

static void ops_close(ops_conn *ctx)
{
    if (ctx == NULL) return;
    px_redis_destroy(ctx->r);
    ev_loop_destroy(ctx->loop);
    free(ctx);
}

/* A connected, authenticated connection in *out, or the exit code (1: Redis
 * unreachable or refusing, 2: the config cannot be used). */
static int connect_redis(px_config *c, const char *cmd, ops_conn **out)
{
    char who[64], *password;
    snprintf(who, sizeof(who), "idemproxy %s", cmd);
    if (!px_config_password(c, who, &password)) return 2;
    /* The connection's own lines (why a connect failed, TLS, AUTH) go to
     * stderr; its progress does not. */
    px_log_setup(PX_LOG_WARN, c->log_format);
    ops_conn *ctx = px_calloc(1, sizeof(*ctx));
    ctx->loop = ev_loop_new(EVFLAG_AUTO);
    px_redis_opts o;
    px_config_redis_opts(c, cmd, password, &o);
    o.max_array_bytes = 0; /* redrive writes the fields back: keep them whole */
    ctx->r = px_redis_create(ctx->loop, &o, ops_state_cb, ctx);
    /* The link retries with backoff; a sentinel lookup and then a connect
     * each take up to timeout_ms. */
    ev_timer deadline;
    ev_timer_init(&deadline, ops_deadline_cb, (double)(2 * c->timeout_ms + 1000) / 1000.0, 0.);
    ev_timer_start(ctx->loop, &deadline);
    while (!ctx->up && ev_is_active(&deadline)) ev_run(ctx->loop, EVRUN_ONCE);
    ev_timer_stop(ctx->loop, &deadline);
    px_free_secret(password);
    if (!ctx->up) {
        /* the url is not echoed: it may hold a password */
        fprintf(stderr, "idemproxy %s: cannot connect to Redis within %lld ms (the lines above say why)\n",
                cmd, 2 * c->timeout_ms + 1000);
        ops_close(ctx);
        return 1;
    }
    *out = ctx;
    return 0;
}

/* Run a command about 'key'; NULL after printing the error (a lost link or an error reply). */
static redisReply *call(ops_conn *ctx, const char *cmd, const char *key, int argc,
                        const char **argv, const size_t *lens)
{
    redisReply *r = ops_argv(ctx, key, argc, argv, lens);
    if (r == NULL) {
        fprintf(stderr, "idemproxy %s: %s: %s\n", cmd, argv[0], ctx->err);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "idemproxy %s: %s: %s\n", cmd, argv[0], show(r->str));
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

static redisReply *call2(ops_conn *ctx, const char *cmd, const char *a0, const char *a1)
{
    const char *argv[] = { a0, a1 };
    size_t lens[] = { strlen(a0), strlen(a1) };
    return call(ctx, cmd, a1, 2, argv, lens);
}

/* "1700000000000-3" or "1700000000000": digits, optionally '-' and digits. */
static bool valid_id(const char *id)
{
    const char *p = id;
    if (!isdigit((unsigned char)*p)) return false;
    while (isdigit((unsigned char)*p)) p++;
    if (*p == '\0') return true;
    if (*p++ != '-' || !isdigit((unsigned char)*p)) return false;
    while (isdigit((unsigned char)*p)) p++;
    return *p == '\0' && strlen(id) < 48;
}

/* The id right after 'id' (ms-seq), for the next page of an XRANGE. */
static void next_id(const char *id, char *out, size_t size)
{
    unsigned long long ms = 0, seq = 0;
    if (sscanf(id, "%llu-%llu", &ms, &seq) != 2) {
        snprintf(out, size, "%s", id);
        return;
    }
    if (seq == UINT64_MAX) snprintf(out, size, "%llu-0", ms + 1);
    else snprintf(out, size, "%llu-%llu", ms, seq + 1);
}

/* --- an entry as the daemon sees it ---------------------------------------- */

/* idemproxy's own fields of a dead letter are its last four, in this order,
 * after the entry's fields as they were (commit.c, dead_letter_add; every
 * version wrote them so). They are read there and only there, never by name:
 * a producer may write fields of the same names, and those are the entry's
 * (they go back with it when it is redriven). */
static const char *const own_fields[] = { "idemproxy-reason", "idemproxy-stream",
                                          "idemproxy-entry-id", "idemproxy-attempts" };
#define OWN_N 4

typedef struct dl_meta {
    const char *reason, *stream, *entry_id, *attempts;
    size_t nelem; /* elements before them: the entry's fields */
} dl_meta;

/* Whether 'f' (a field/value array) ends as a dead letter idemproxy wrote;
 * its fields in 'm'. */
static bool dl_meta_of(const redisReply *f, dl_meta *m)
{
    if (f->type != REDIS_REPLY_ARRAY || f->elements < 2 * OWN_N || f->elements % 2) return false;
    size_t base = f->elements - 2 * OWN_N;
    const char *v[OWN_N];
    for (size_t i = 0; i < OWN_N; i++) {
        const redisReply *k = f->element[base + 2 * i], *x = f->element[base + 2 * i + 1];
        if (k->type != REDIS_REPLY_STRING || x->type != REDIS_REPLY_STRING ||
            k->len != strlen(own_fields[i]) || memcmp(k->str, own_fields[i], k->len) != 0)
            return false;
        v[i] = x->str;
    }
    *m = (dl_meta){ v[0], v[1], v[2], v[3], base };
    return true;
}

/* A px_entry over the first 'nelem' elements of the field/value array 'f'
 * (an entry's, or the entry's part of its dead letter), its key rendered by
 * px_event_prepare as the daemon renders it. Returns false with 'why' when
 * the key cannot be rendered (bad input); the caller frees e->fields, e->key
 * and e->lock_key. */
static bool prepare(px_entry *e, const px_stream_conf *sc, const px_config *c, const char *id,
                    const redisReply *f, size_t nelem, char *why, size_t whylen)
{
    memset(e, 0, sizeof(*e));
    e->id = (char *)id;
    e->payload_idx = -1;
    e->fields = px_calloc(nelem / 2 + 1, sizeof(px_field));
    for (size_t i = 0; i + 1 < nelem; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        px_field *x = &e->fields[e->nfields];
        x->name = k->str;
        x->name_len = k->len;
        x->value = v->str;
        x->value_len = v->len;
        e->bytes += k->len + v->len;
        if (sc->payload_field && e->payload_idx < 0 && strcmp(k->str, sc->payload_field) == 0)
            e->payload_idx = (int)e->nfields;
        e->nfields++;
    }
    return px_event_prepare(e, sc, c->max_entry_bytes, why, whylen) == PX_OK;
}

static void entry_deinit(px_entry *e)
{
    free(e->fields);
    free(e->key);
    free(e->lock_key);
    e->fields = NULL;
    e->key = NULL;
    e->lock_key = NULL;
}

/* --- key state ------------------------------------------------------------- */

typedef struct key_state {
    bool done;
    long long done_ttl; /* ms; -1: no expiry */
    px_done_mark mark;  /* what the done mark says: its time and fingerprint, if any */
    bool locked;
    char *token;          /* the holder's token; owned */
    long long lease_left; /* ms; -1: no expiry */
    char *other;          /* single layout: a value that is neither D nor L:...; owned */
    bool fence_on;
    bool fence_set;
    long long fence;
} key_state;

static void key_state_deinit(key_state *k)
{
    free(k->token);
    free(k->other);
}

/* GET and PTTL of 'name': false on an error; *val NULL when absent. */
static bool get_ttl(ops_conn *ctx, const char *cmd, const char *name, char **val, long long *ttl)
{
    *val = NULL;
    *ttl = -2;
    redisReply *r = call2(ctx, cmd, "GET", name);
    if (r == NULL) return false;
    if (r->type == REDIS_REPLY_STRING) *val = px_strndup(r->str, r->len);
    freeReplyObject(r);
    if ((r = call2(ctx, cmd, "PTTL", name)) == NULL) {
        free(*val);
        *val = NULL;
        return false;
    }
    *ttl = r->type == REDIS_REPLY_INTEGER ? r->integer : -2;
    freeReplyObject(r);
    return true;
}

/* Read the state of e's key (its names set by px_event_set_key). */
static bool read_key_state(ops_conn *ctx, const px_stream_conf *sc, const px_entry *e,
                           key_state *k)
{
    memset(k, 0, sizeof(*k));
    char *v;
    long long ttl;
    if (sc->layout == PX_LAYOUT_SINGLE) {
        if (!get_ttl(ctx, "inspect", e->done_name, &v, &ttl)) return false;
        if (v && v[0] == 'D') { /* "D", or "D:<ms>[:<fingerprint>]" */
            k->done = true;
            k->done_ttl = ttl;
            k->mark = px_decide_done_mark(v);
        } else if (v && strncmp(v, "L:", 2) == 0) {
            k->locked = true;
            k->token = px_strdup(v + 2);
            k->lease_left = ttl;
        } else if (v) {
            k->other = px_strdup(v);
        }
        free(v);
    } else {
        if (!get_ttl(ctx, "inspect", e->done_name, &v, &ttl)) return false;
        if (v) {
            k->done = true;
            k->done_ttl = ttl;
            k->mark = px_decide_done_mark(v);
        }
        free(v);
        if (!get_ttl(ctx, "inspect", e->lock_name, &v, &ttl)) return false;
        if (v) {
            k->locked = true;
            k->token = v;
            k->lease_left = ttl;
        }
    }
    if (sc->fencing) {
        k->fence_on = true;
        redisReply *r = call2(ctx, "inspect", "GET", PX_FENCE_KEY);
        if (r == NULL) return false;
        if (r->type == REDIS_REPLY_STRING) {
            k->fence_set = true;
            k->fence = atoll(r->str);
        }
        freeReplyObject(r);
    }
    return true;
}

static void print_ttl(long long ms, const char *what)
{
    if (ms < 0) printf("%s never expires", what);
    else printf("%s expires in %lld ms", what, ms);
}

static void print_key_state(const px_stream_conf *sc, const px_entry *e, const key_state *k)
{
    printf("key: %s\n", show(e->key));
    if (sc->layout == PX_LAYOUT_SINGLE)
        printf("  layout single, state key %s\n", show(e->done_name));
    else
        printf("  layout split, lock key %s, done key %s\n", show(e->lock_name), show(e->done_name));
    printf("  state: ");
    if (k->done) {
        printf("done, ");
        if (k->mark.has_ms) {
            uint64_t now = px_now_ms();
            printf("marked at %llu (%.1f s ago), ", (unsigned long long)k->mark.ms,
                   now > k->mark.ms ? (double)(now - k->mark.ms) / 1000.0 : 0.0);
        }
        if (k->mark.has_fp) {
            char hex[17];
            px_hash64_hex(k->mark.fp, hex);
            printf("fingerprint %s, ", hex);
        }
        print_ttl(k->done_ttl, "done mark");
        if (k->locked) printf("; and still locked by token %s, lease left %lld ms", show(k->token), k->lease_left);
    } else if (k->locked) {
        printf("locked by token %s, lease left %lld ms (not done)", show(k->token), k->lease_left);
    } else if (k->other) {
        printf("not done, not locked: the key holds '%s', not a value idemproxy writes", show(k->other));
    } else {
        printf("not done, not locked");
    }
    printf("\n");
    if (k->fence_on) {
        if (k->fence_set)
            printf("  fencing counter: %lld (%s, one counter for every lock)\n", k->fence, PX_FENCE_KEY);
        else
            printf("  fencing counter: not set yet (%s)\n", PX_FENCE_KEY);
    }
}

static json_object *key_state_json(const px_stream_conf *sc, const px_entry *e, const key_state *k)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "key", jstr(e->key));
    json_object_object_add(o, "layout", json_object_new_string(sc->layout == PX_LAYOUT_SINGLE ? "single" : "split"));
    json_object_object_add(o, "lock_name", jstr(e->lock_name));
    json_object_object_add(o, "done_name", jstr(e->done_name));
    json_object_object_add(o, "done", json_object_new_boolean(k->done));
    json_object_object_add(o, "done_ttl_ms", k->done ? json_object_new_int64(k->done_ttl) : NULL);
    /* the done mark's time (ms since the epoch) and fingerprint, when it holds them */
    json_object_object_add(o, "done_at_ms",
                           k->mark.has_ms ? json_object_new_int64((int64_t)k->mark.ms) : NULL);
    char hex[17];
    px_hash64_hex(k->mark.fp, hex);
    json_object_object_add(o, "fingerprint", k->mark.has_fp ? jstr(hex) : NULL);
    json_object_object_add(o, "locked", json_object_new_boolean(k->locked));
    json_object_object_add(o, "lock_token", k->locked ? jstr(k->token) : NULL);
    json_object_object_add(o, "lease_left_ms", k->locked ? json_object_new_int64(k->lease_left) : NULL);
    if (k->other) json_object_object_add(o, "other_value", jstr(k->other));
    if (k->fence_on)
        json_object_object_add(o, "fence", k->fence_set ? json_object_new_int64(k->fence) : NULL);
    return o;
}

static void print_json(json_object *o)
{
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                         JSON_C_TO_STRING_NOSLASHESCAPE));
}

/* A field's name or value, escaped as show() does, a long one cut. */
static void print_value(const char *s, size_t n)
{
    size_t show_n = n > OPS_SHOW_BYTES ? OPS_SHOW_BYTES : n;
    while (show_n < n && show_n > 0 && ((unsigned char)s[show_n] & 0xC0) == 0x80) show_n--;
    px_buf b = { 0 };
    px_buf_escape(&b, s, show_n, PX_ESC_BACKSLASH);
    fputs(b.data ? b.data : "", stdout);
    px_buf_deinit(&b);
    if (show_n < n) printf("... (%zu bytes)", n);
}

/* --- inspect --------------------------------------------------------------- */

static int inspect_key(ops_conn *ctx, const px_stream_conf *sc, const px_ops_args *a)
{
    px_entry e;
    memset(&e, 0, sizeof(e));
    px_event_set_key(&e, sc, a->key, strlen(a->key));
    key_state k;
    int rc = 1;
    if (read_key_state(ctx, sc, &e, &k)) {
        rc = 0;
        if (a->json) {
            json_object *o = key_state_json(sc, &e, &k);
            json_object_object_add(o, "stream", json_object_new_string(sc->stream));
            print_json(o);
            json_object_put(o);
        } else {
            printf("stream: %s\n", sc->stream);
            print_key_state(sc, &e, &k);
        }
    }
    key_state_deinit(&k);
    free(e.key);
    return rc;
}

typedef struct dead_found {
    char *id, *reason, *attempts;
} dead_found;

/* The dead letters of entry 'id' of stream 'sc': XRANGE from the entry's own
 * time (a dead letter is written after its entry), at most OPS_SCAN_MAX. */
static bool find_dead(ops_conn *ctx, const px_stream_conf *sc, const char *id, dead_found **out,
                      size_t *n, bool *all)
{
    *out = NULL;
    *n = 0;
    *all = true;
    char start[64];
    unsigned long long ms = strtoull(id, NULL, 10);
    snprintf(start, sizeof(start), "%llu-0", ms);
    size_t looked = 0;
    for (;;) {
        const char *argv[] = { "XRANGE", sc->dead_letter, start, "+", "COUNT", "1000" };
        size_t lens[6];
        for (int i = 0; i < 6; i++) lens[i] = strlen(argv[i]);
        redisReply *r = call(ctx, "inspect", sc->dead_letter, 6, argv, lens);
        if (r == NULL) return false;
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
            freeReplyObject(r);
            return true;
        }
        for (size_t i = 0; i < r->elements; i++) {
            redisReply *ent = r->element[i];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 2) continue;
            const char *eid = ent->element[0]->str;
            dl_meta m;
            if (dl_meta_of(ent->element[1], &m) && strcmp(m.entry_id, id) == 0 &&
                strcmp(m.stream, sc->stream) == 0) {
                *out = px_realloc(*out, (*n + 1) * sizeof(**out));
                (*out)[*n] = (dead_found){ px_strdup(eid), px_strdup(m.reason),
                                           px_strdup(m.attempts) };
                (*n)++;
            }
            next_id(eid, start, sizeof(start));
        }
        looked += r->elements;
        bool last = r->elements < OPS_PAGE;
        freeReplyObject(r);
        if (last) return true;
        if (looked >= OPS_SCAN_MAX) {
            *all = false;
            return true;
        }
    }
}

static int inspect_entry(ops_conn *ctx, const px_config *c, const px_stream_conf *sc,
                         const px_ops_args *a)
{
    int rc = 1;
    const char *id = a->entry;
    redisReply *entry = NULL, *pend = NULL;
    dead_found *dead = NULL;
    size_t ndead = 0;
    bool dead_all = true, have_key = false, have_lk = false;
    char why[512] = "";
    char *mark_val = NULL, *lk_val = NULL;
    long long mark_ttl, lk_ttl = -2;
    px_buf mark = { 0 };
    px_entry e;
    memset(&e, 0, sizeof(e));
    key_state k;
    memset(&k, 0, sizeof(k));
    json_object *o = NULL;

    /* the entry itself */
    const char *xr[] = { "XRANGE", sc->stream, id, id };
    size_t xl[] = { 6, strlen(sc->stream), strlen(id), strlen(id) };
    if ((entry = call(ctx, "inspect", sc->stream, 4, xr, xl)) == NULL) goto out;
    redisReply *fields = entry->type == REDIS_REPLY_ARRAY && entry->elements == 1 &&
                                 entry->element[0]->elements >= 2
                             ? entry->element[0]->element[1]
                             : NULL;

    /* its pending info in the group */
    const char *pend_err = NULL;
    if (sc->group) {
        const char *xp[] = { "XPENDING", sc->stream, sc->group, id, id, "1" };
        size_t pl[6];
        for (int i = 0; i < 6; i++) pl[i] = strlen(xp[i]);
        pend = ops_argv(ctx, sc->stream, 6, xp, pl);
        if (pend == NULL) {
            fprintf(stderr, "idemproxy inspect: XPENDING: %s\n", ctx->err);
            goto out;
        }
        if (pend->type == REDIS_REPLY_ERROR) {
            if (strncmp(pend->str, "NOGROUP", 7) != 0) {
                fprintf(stderr, "idemproxy inspect: XPENDING: %s\n", show(pend->str));
                goto out;
            }
            pend_err = "the group does not exist (yet)";
        }
    }
    redisReply *pinfo = pend && pend->type == REDIS_REPLY_ARRAY && pend->elements == 1 &&
                                pend->element[0]->elements >= 4
                            ? pend->element[0]
                            : NULL;

    /* its dead letters and the mark that says one was written */
    if (sc->dead_letter) {
        if (!find_dead(ctx, sc, id, &dead, &ndead, &dead_all)) goto out;
        px_dl_mark_name(sc, id, &mark);
        if (!get_ttl(ctx, "inspect", mark.data, &mark_val, &mark_ttl)) goto out;
    }

    /* its key: from the entry, or from its dead letter's copy of the fields */
    redisReply *dl_fields = NULL;
    dl_meta dm = { 0 };
    if (fields == NULL && ndead > 0) {
        const char *dr[] = { "XRANGE", sc->dead_letter, dead[0].id, dead[0].id };
        size_t dll[] = { 6, strlen(sc->dead_letter), strlen(dead[0].id), strlen(dead[0].id) };
        redisReply *d = call(ctx, "inspect", sc->dead_letter, 4, dr, dll);
        if (d == NULL) goto out;
        freeReplyObject(entry); /* keep one reply alive: reuse 'entry' */
        entry = d;
        if (d->type == REDIS_REPLY_ARRAY && d->elements == 1 && d->element[0]->elements >= 2 &&
            dl_meta_of(d->element[0]->element[1], &dm) && dm.nelem > 0)
            dl_fields = d->element[0]->element[1];
    }
    redisReply *kf = fields ? fields : dl_fields;
    if (kf) {
        have_key = prepare(&e, sc, c, id, kf, fields ? fields->elements : dm.nelem, why,
                           sizeof(why));
        if (have_key && !read_key_state(ctx, sc, &e, &k)) goto out;
        if (have_key && e.lock_key) {
            if (!get_ttl(ctx, "inspect", e.lock_key, &lk_val, &lk_ttl)) goto out;
            have_lk = true;
        }
    }
    rc = 0;

    if (a->json) {
        o = json_object_new_object();
        json_object_object_add(o, "stream", json_object_new_string(sc->stream));
        json_object *je = NULL;
        if (fields) {
            je = json_object_new_object();
            json_object_object_add(je, "id", json_object_new_string(id));
            json_object *jf = json_object_new_object();
            for (size_t i = 0; i + 1 < fields->elements; i += 2) {
                json_object *name = jstr_len(fields->element[i]->str, fields->element[i]->len);
                json_object_object_add(jf, json_object_get_string(name),
                                       jstr_len(fields->element[i + 1]->str,
                                                fields->element[i + 1]->len));
                json_object_put(name);
            }
            json_object_object_add(je, "fields", jf);
        }
        json_object_object_add(o, "entry", je);
        json_object_object_add(o, "group", sc->group ? json_object_new_string(sc->group) : NULL);
        json_object *jp = NULL;
        if (pinfo) {
            jp = json_object_new_object();
            json_object_object_add(jp, "consumer", jstr(pinfo->element[1]->str));
            json_object_object_add(jp, "idle_ms", json_object_new_int64(pinfo->element[2]->integer));
            json_object_object_add(jp, "deliveries", json_object_new_int64(pinfo->element[3]->integer));
        }
        json_object_object_add(o, "pending", jp);
        json_object_object_add(o, "key", have_key ? key_state_json(sc, &e, &k) : NULL);
        if (kf && !have_key) json_object_object_add(o, "key_error", jstr(why));
        if (have_lk) {
            json_object *jl = json_object_new_object();
            json_object_object_add(jl, "name", jstr(e.lock_key));
            json_object_object_add(jl, "token", lk_val ? jstr(lk_val) : NULL);
            json_object_object_add(jl, "lease_left_ms", lk_val ? json_object_new_int64(lk_ttl) : NULL);
            json_object_object_add(o, "lock_key", jl);
        }
        json_object *jd = json_object_new_array();
        for (size_t i = 0; i < ndead; i++) {
            json_object *x = json_object_new_object();
            json_object_object_add(x, "id", jstr(dead[i].id));
            json_object_object_add(x, "reason", jstr(dead[i].reason));
            /* a count, or null when a hand-written dead letter holds no count */
            char *end;
            errno = 0;
            long long att = strtoll(dead[i].attempts, &end, 10);
            bool num = dead[i].attempts[0] >= '0' && dead[i].attempts[0] <= '9' && !*end && !errno;
            json_object_object_add(x, "attempts", num ? json_object_new_int64(att) : NULL);
            json_object_array_add(jd, x);
        }
        json_object_object_add(o, "dead_letters", jd);
        json_object_object_add(o, "dead_letters_all_scanned", json_object_new_boolean(dead_all));
        json_object_object_add(o, "dead_letter_mark", mark_val ? jstr(mark_val) : NULL);
        print_json(o);
        goto out;
    }

    if (fields) {
        printf("entry: %s in stream %s\n", id, sc->stream);
        for (size_t i = 0; i + 1 < fields->elements; i += 2) {
            printf("  field ");
            print_value(fields->element[i]->str, fields->element[i]->len);
            printf(": ");
            print_value(fields->element[i + 1]->str, fields->element[i + 1]->len);
            printf("\n");
        }
    } else {
        printf("entry: %s is not in the stream %s (never added, trimmed or deleted)\n", id, sc->stream);
    }
    if (sc->group == NULL) printf("pending: no group (stream read without a group)\n");
    else if (pend_err) printf("pending: no (%s: %s)\n", sc->group, pend_err);
    else if (pinfo)
        printf("pending: consumer %s, idle %lld ms, delivery count %lld (group %s)\n",
               show(pinfo->element[1]->str), pinfo->element[2]->integer, pinfo->element[3]->integer,
               sc->group);
    else printf("pending: no (not pending in group %s)\n", sc->group);
    if (have_key) {
        if (fields == NULL) printf("(key rendered from the dead letter's copy of the fields)\n");
        print_key_state(sc, &e, &k);
        if (have_lk) {
            printf("lock_key: %s: ", show(e.lock_key));
            if (lk_val) printf("held by token %s, lease left %lld ms\n", show(lk_val), lk_ttl);
            else printf("free\n");
        }
    } else if (kf) {
        printf("key: none, bad input: %s\n", show(why));
    }
    if (sc->dead_letter == NULL) {
        printf("dead letters: no dead_letter stream configured\n");
    } else {
        if (ndead == 0) printf("dead letters: none in %s\n", sc->dead_letter);
        for (size_t i = 0; i < ndead; i++)
            printf("dead letter %s in %s: reason %s, attempts %s\n", show(dead[i].id),
                   sc->dead_letter, show(dead[i].reason), show(dead[i].attempts));
        if (!dead_all)
            printf("(looked at the first %d dead letters from the entry's time only)\n", OPS_SCAN_MAX);
        if (mark_val) {
            printf("dead-letter mark: written (%s, dead letter %s, ", show(mark.data), show(mark_val));
            print_ttl(mark_ttl, "mark");
            printf(")\n");
        } else {
            printf("dead-letter mark: none (%s)\n", show(mark.data));
        }
    }
out:
    json_object_put(o);
    if (entry) freeReplyObject(entry);
    if (pend) freeReplyObject(pend);
    for (size_t i = 0; i < ndead; i++) {
        free(dead[i].id);
        free(dead[i].reason);
        free(dead[i].attempts);
    }
    free(dead);
    free(mark_val);
    free(lk_val);
    px_buf_deinit(&mark);
    key_state_deinit(&k);
    entry_deinit(&e);
    return rc;
}

int px_cmd_inspect(px_config *c, const px_ops_args *a)
{
    px_stream_conf *sc = find_stream(c, a, "inspect");
    if (sc == NULL) return 2;
    if (a->entry && !valid_id(a->entry)) {
        fprintf(stderr, "idemproxy inspect: --entry %s is not a stream entry id (ms-seq)\n", a->entry);
        return 2;
    }
    if (a->key && a->key[0] == '\0') {
        fprintf(stderr, "idemproxy inspect: --key is empty\n");
        return 2;
    }
    ops_conn *ctx;
    int rc = connect_redis(c, "inspect", &ctx);
    if (rc != 0) return rc;
    rc = a->key ? inspect_key(ctx, sc, a) : inspect_entry(ctx, c, sc, a);
    ops_close(ctx);
    return rc;
}

/* --- redrive --------------------------------------------------------------- */

/* KEYS: dead-letter stream, source stream[, done mark]. ARGV: the dead
 * letter's id, what the done mark's value to delete starts with ("" = whatever
 * it holds; single layout "D", never a lock's "L:"), the
 * source stream's name. The entry's fields are all but the last four pairs,
 * idemproxy's (dl_meta_of), whatever their names. */
static const char redrive_lua[] =
    "local e = redis.call('xrange', KEYS[1], ARGV[1], ARGV[1]) "
    "if #e == 0 then return 0 end "
    "local f, out = e[1][2], {} "
    "local n = #f - 8 "
    "if n < 2 or f[n + 1] ~= 'idemproxy-reason' or f[n + 3] ~= 'idemproxy-stream' "
    "   or f[n + 4] ~= ARGV[3] or f[n + 5] ~= 'idemproxy-entry-id' "
    "   or f[n + 7] ~= 'idemproxy-attempts' then return 0 end "
    "for i = 1, n do out[i] = f[i] end "
    "redis.call('xdel', KEYS[1], ARGV[1]) "
    "local id = redis.call('xadd', KEYS[2], '*', unpack(out)) "
    "local v = KEYS[3] and redis.call('get', KEYS[3]) "
    "if v and (ARGV[2] == '' or string.sub(v, 1, #ARGV[2]) == ARGV[2]) then "
    "  redis.call('del', KEYS[3]) end "
    "return id";

/* Whether dead-lettering wrote a done mark: a refusal (busy), a conflict and a Redis
 * error did not (proxy.c), so a done mark found then is another copy's. */
static bool wrote_done(const char *reason)
{
    return strcmp(reason, "busy") != 0 && strncmp(reason, "redis error: ", 13) != 0 &&
           strncmp(reason, "conflict: ", 10) != 0;
}

/* Whether entry 'eid' is still pending in the stream's group: 1 yes, 0 no
 * (or group-less: nothing to ask), -1 an error (said on stderr). The daemon
 * XACKs a dead-lettered entry only once its dead letter and its done mark
 * are both confirmed, and after a lost reply writes the done mark again; a
 * done mark redrive cleared before that comes back, and the redriven entry
 * is skipped as a copy. Once acked, an entry is never committed again. */
static int still_pending(ops_conn *ctx, const px_stream_conf *sc, const char *eid)
{
    if (sc->group == NULL) return 0;
    const char *argv[] = { "XPENDING", sc->stream, sc->group, eid, eid, "1" };
    size_t lens[6];
    for (int i = 0; i < 6; i++) lens[i] = strlen(argv[i]);
    redisReply *r = ops_argv(ctx, sc->stream, 6, argv, lens);
    if (r == NULL) {
        fprintf(stderr, "idemproxy redrive: XPENDING: %s\n", ctx->err);
        return -1;
    }
    /* an error (no group or stream yet, an id that is none): nothing pending */
    int pending = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    freeReplyObject(r);
    return pending;
}

/* On a Redis Cluster whose dead-letter stream, source stream and done mark
 * sit in different slots, no one script can touch them together: a dead
 * letter is redriven in four steps, each a command on one slot.
 *
 *   1. the dead letter is still there and its claim (px_dl_redrive_claim_name,
 *      in the dead-letter stream's slot) is free? take it (SET NX, expiring
 *      after OPS_CLAIM_MS); else another run has it: skipped
 *   2. the claim still ours? make it last (PERSIST); else skipped, untouched
 *   3. delete the done mark, as redrive_lua does
 *   4. XADD the entry's fields to the source stream
 *   5. XDEL the dead letter and free the claim
 *
 * So two runs at once redrive it once. The done mark goes before the XADD:
 * the other way round, the daemon could read the new entry, find the old
 * mark and skip it as a copy. A run that dies before step 2 leaves the dead
 * letter where it was, claimed until the claim expires; one that stalls past
 * that finds at step 2 that another run has it, and touches nothing (the
 * other run's entry may have been handled since: clearing its done mark
 * would let a copy through). From step 2 on the entry may come back to the
 * stream (an XADD whose reply is lost may have been applied), so the claim
 * does not expire: a later run, or a purge, would add it twice or delete a
 * dead letter whose entry is back. Such a dead letter is skipped with a line
 * that says so, until an operator removes the claim (or the dead letter).
 * The line a failed run prints says what was done. */
#define OPS_CLAIM_MS 600000

static const char claim_lua[] = /* 1 ours, 0 another run's, 2 a half-redriven one's */
    "if #redis.call('xrange', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end "
    "if redis.call('set', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return 1 end "
    "if redis.call('pttl', KEYS[2]) == -1 then return 2 end "
    "return 0";
static const char hold_lua[] = /* KEYS: the claim. ARGV: our token */
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('persist', KEYS[1]) return 1";
static const char clear_done_lua[] = /* KEYS: done mark. ARGV: as redrive_lua's ARGV[2] */
    "local v = redis.call('get', KEYS[1]) "
    "if v and (ARGV[1] == '' or string.sub(v, 1, #ARGV[1]) == ARGV[1]) then "
    "  redis.call('del', KEYS[1]) end "
    "return 1";
static const char finish_lua[] =
    "redis.call('xdel', KEYS[1], ARGV[1]) "
    "if redis.call('get', KEYS[2]) == ARGV[2] then redis.call('del', KEYS[2]) end "
    "return 1";

/* --purge: KEYS dead-letter stream, its claim; ARGV the dead letter's id. A
 * dead letter a redrive has claimed is left to it (0). */
static const char purge_lua[] = "if redis.call('exists', KEYS[2]) == 1 then return 0 end "
                                "return redis.call('xdel', KEYS[1], ARGV[1])";

/* EVAL 'body' with 'nkeys' of the 'n' NUL-terminated keys and args in 'kv'
 * (at most 6), routed by the first key. */
static redisReply *eval(ops_conn *ctx, const char *body, int nkeys, int n, const char *const *kv)
{
    char nk[8];
    snprintf(nk, sizeof(nk), "%d", nkeys);
    const char *argv[9] = { "EVAL", body, nk };
    size_t lens[9];
    for (int i = 0; i < n; i++) argv[3 + i] = kv[i];
    for (int i = 0; i < 3 + n; i++) lens[i] = strlen(argv[i]);
    return call(ctx, "redrive", kv[0], 3 + n, argv, lens);
}

/* The steps above for dead letter 'dlid' whose entry's fields are the first
 * 'nelem' elements of 'f'; 'done' the done mark to clear, or NULL. 1
 * redriven, 0 another run has it, -1 an error (said on stderr). */
static int redrive_steps(ops_conn *ctx, const px_stream_conf *sc, const char *dlid,
                         const redisReply *f, size_t nelem, const char *done, const char *token)
{
    px_buf claim = { 0 };
    px_dl_redrive_claim_name(sc, dlid, &claim);
    char ttl[24];
    snprintf(ttl, sizeof(ttl), "%d", OPS_CLAIM_MS);
    const char *done_at = NULL; /* the step that failed, once the claim is ours */
    bool held = false;          /* the claim may no longer expire (step 2) */
    int rc = -1;
    redisReply *r = eval(ctx, claim_lua, 2, 5,
                         (const char *const[]){ sc->dead_letter, claim.data, dlid, token, ttl });
    if (r == NULL) goto out;
    long long got = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    if (got == 2 && (r = call2(ctx, "redrive", "GET", claim.data)) != NULL) {
        fprintf(stderr, "idemproxy redrive: dead letter %s is half redriven by run %s (claim %s), "
                        "which is going on or has stopped: once it is gone, its entry may be back in "
                        "%s; look there, then XDEL the dead letter and DEL the claim (or DEL only "
                        "the claim to redrive it again)\n",
                show(dlid), show(r->type == REDIS_REPLY_STRING ? r->str : "?"), show(claim.data),
                sc->stream);
        freeReplyObject(r);
    }
    if (got != 1) {
        rc = 0;
        goto out;
    }
    done_at = "nothing else was done yet";
    held = true; /* a lost reply may have made it last */
    if ((r = eval(ctx, hold_lua, 1, 2, (const char *const[]){ claim.data, token })) == NULL) goto out;
    bool ours = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ours) { /* it ran out and another run has it: touch nothing */
        held = false;
        rc = 0;
        goto out;
    }
    if (done) {
        const char *prefix = sc->layout == PX_LAYOUT_SINGLE ? "D" : "";
        done_at = "its done mark may have been cleared, the entry was not added back";
        if ((r = eval(ctx, clear_done_lua, 1, 2, (const char *const[]){ done, prefix })) == NULL)
            goto out;
        freeReplyObject(r);
    }
    done_at = "the entry may have been added back: look in the stream";
    const char **argv = px_calloc(nelem + 3, sizeof(*argv));
    size_t *lens = px_calloc(nelem + 3, sizeof(*lens));
    argv[0] = "XADD";
    argv[1] = sc->stream;
    argv[2] = "*";
    for (int i = 0; i < 3; i++) lens[i] = strlen(argv[i]);
    for (size_t i = 0; i < nelem; i++) {
        argv[3 + i] = f->element[i]->str;
        lens[3 + i] = f->element[i]->len;
    }
    r = call(ctx, "redrive", sc->stream, (int)nelem + 3, argv, lens);
    free(argv);
    free(lens);
    if (r == NULL) goto out;
    freeReplyObject(r);
    done_at = "the entry was added back to the stream: delete the dead letter (XDEL) and the claim, "
              "do not redrive it again";
    r = eval(ctx, finish_lua, 2, 4, (const char *const[]){ sc->dead_letter, claim.data, dlid, token });
    if (r == NULL) goto out;
    freeReplyObject(r);
    rc = 1;
out:
    if (rc < 0 && done_at && held)
        fprintf(stderr, "idemproxy redrive: dead letter %s is half redriven (%s); it stays in %s, "
                        "claimed by %s until the claim %s is deleted\n",
                show(dlid), done_at, sc->dead_letter, show(token), show(claim.data));
    else if (rc < 0 && done_at)
        fprintf(stderr, "idemproxy redrive: dead letter %s is half redriven (%s); it stays in %s, "
                        "claimed by %s for %d s\n",
                show(dlid), done_at, sc->dead_letter, show(claim.data), OPS_CLAIM_MS / 1000);
    px_buf_deinit(&claim);
    return rc;
}

int px_cmd_redrive(px_config *c, const px_ops_args *a)
{
    px_stream_conf *sc = find_stream(c, a, "redrive");
    if (sc == NULL) return 2;
    if (sc->dead_letter == NULL) {
        fprintf(stderr, "idemproxy redrive: stream %s has no dead_letter stream in %s\n", sc->stream,
                c->path);
        return 2;
    }
    if (a->entry && !valid_id(a->entry)) {
        fprintf(stderr, "idemproxy redrive: --entry %s is not a stream entry id (ms-seq)\n", a->entry);
        return 2;
    }
    ops_conn *ctx;
    int rc = connect_redis(c, "redrive", &ctx);
    if (rc != 0) return rc;

    const char *verb = a->purge ? (a->dry_run ? "would purge" : "purged")
                                : (a->dry_run ? "would redrive" : "redriven");
    char token[128], host[64] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(token, sizeof(token), "%s:%d:%llu", host, (int)getpid(),
             (unsigned long long)px_now_ms());
    unsigned long long looked = 0, chosen = 0, skipped = 0, other = 0;
    /* From the start, --entry too: a dead letter's id is the dead-letter
     * stream's clock (on a cluster another master's), and an entry's id may be
     * ahead of it (a producer's own id), so its dead letter can sort first. */
    char start[64] = "-";
    bool stop = false, took_one = false; /* took_one: --entry's one dead letter was found */
    rc = 0;
    while (!stop) {
        const char *argv[] = { "XRANGE", sc->dead_letter, start, "+", "COUNT", "1000" };
        size_t lens[6];
        for (int i = 0; i < 6; i++) lens[i] = strlen(argv[i]);
        redisReply *page = call(ctx, "redrive", sc->dead_letter, 6, argv, lens);
        if (page == NULL) {
            rc = 1;
            break;
        }
        size_t got = page->type == REDIS_REPLY_ARRAY ? page->elements : 0;
        for (size_t i = 0; i < got && !stop; i++) {
            redisReply *ent = page->element[i];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 2) continue;
            const char *dlid = ent->element[0]->str;
            redisReply *f = ent->element[1];
            next_id(dlid, start, sizeof(start));
            if (++looked % 1000 == 0)
                printf("redrive: %llu looked at, %s %llu, skipped %llu\n", looked, verb, chosen, skipped);
            dl_meta m;
            if (!dl_meta_of(f, &m) || strcmp(m.stream, sc->stream) != 0) {
                other++;
                continue;
            }
            const char *reason = m.reason, *eid = m.entry_id;
            if ((a->reason && strstr(reason, a->reason) == NULL) ||
                (a->entry && strcmp(dlid, a->entry) != 0 && strcmp(eid, a->entry) != 0)) {
                other++;
                continue;
            }
            if (a->entry && took_one) { /* two groups' dead letters, or a second after its mark expired */
                fprintf(stderr, "idemproxy redrive: dead letter %s holds entry %s too; --entry takes one: "
                                "name it by its own id\n",
                        show(dlid), show(eid));
                other++;
                continue;
            }
            took_one = true;
            if (a->max >= 0 && (long long)chosen >= a->max) {
                stop = true;
                break;
            }
            if (a->purge) {
                if (a->dry_run) {
                    printf("%s %s (entry %s, reason %s)\n", verb, show(dlid), show(eid), show(reason));
                    chosen++;
                    continue;
                }
                px_buf claim = { 0 };
                px_dl_redrive_claim_name(sc, dlid, &claim);
                redisReply *r = eval(ctx, purge_lua, 2, 3,
                                     (const char *const[]){ sc->dead_letter, claim.data, dlid });
                px_buf_deinit(&claim);
                if (r == NULL) {
                    rc = 1;
                    stop = true;
                    break;
                }
                bool gone = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
                freeReplyObject(r);
                if (!gone) { /* another run took it, or a redrive has claimed it */
                    printf("skip %s (entry %s): purged or claimed by another run\n", show(dlid),
                           show(eid));
                    skipped++;
                    continue;
                }
                printf("%s %s (entry %s, reason %s)\n", verb, show(dlid), show(eid), show(reason));
                chosen++;
                continue;
            }
            if (m.nelem == 0) {
                printf("skip %s (entry %s): it holds no fields of the entry, only a reference "
                       "(reason %s)\n",
                       show(dlid), show(eid), show(reason));
                skipped++;
                continue;
            }
            px_entry e;
            char why[512];
            bool keyed = prepare(&e, sc, c, eid, f, m.nelem, why, sizeof(why));
            bool clear = keyed && wrote_done(reason);
            if (a->dry_run) {
                printf("would redrive %s (entry %s, ", show(dlid), show(eid));
                if (keyed) printf("key %s%s", show(e.key), clear ? ", its done mark to be cleared" : "");
                else printf("no key: %s", show(why));
                printf(", reason %s)\n", show(reason));
                chosen++;
                entry_deinit(&e);
                continue;
            }
            int pending = still_pending(ctx, sc, eid);
            if (pending != 0) {
                entry_deinit(&e);
                if (pending < 0) {
                    rc = 1;
                    stop = true;
                    break;
                }
                printf("skip %s (entry %s): the entry is still pending in group %s, its dead "
                       "letter not yet confirmed; run again later\n",
                       show(dlid), show(eid), show(sc->group));
                skipped++;
                continue;
            }
            /* One script when its keys share a slot (always on one server). */
            int done;
            if (!px_redis_same_slot(ctx->r, sc->dead_letter, sc->stream) ||
                (clear && !px_redis_same_slot(ctx->r, sc->dead_letter, e.done_name))) {
                done = redrive_steps(ctx, sc, dlid, f, m.nelem, clear ? e.done_name : NULL, token);
            } else {
                const char *ev[] = { "EVAL", redrive_lua, clear ? "3" : "2", sc->dead_letter,
                                     sc->stream, clear ? e.done_name : "", dlid,
                                     sc->layout == PX_LAYOUT_SINGLE ? "D" : "", sc->stream };
                int evc = 0;
                const char *args[10];
                size_t al[10];
                for (size_t j = 0; j < sizeof(ev) / sizeof(*ev); j++) {
                    if (!clear && j == 5) continue; /* no third key */
                    args[evc] = ev[j];
                    al[evc++] = strlen(ev[j]);
                }
                redisReply *r = call(ctx, "redrive", sc->dead_letter, evc, args, al);
                done = r == NULL ? -1 : r->type == REDIS_REPLY_STRING;
                if (r) freeReplyObject(r);
            }
            entry_deinit(&e);
            if (done < 0) {
                rc = 1;
                stop = true;
                break;
            }
            if (done) chosen++;
            else skipped++; /* another run took it */
        }
        freeReplyObject(page);
        if (got < OPS_PAGE) break;
    }
    if (a->dry_run)
        printf("%s %llu, skip %llu (%llu dead letters not selected)\n", verb, chosen, skipped, other);
    else
        printf("%s %llu, skipped %llu (%llu dead letters not selected)\n", verb, chosen, skipped, other);
    if (rc == 0 && a->entry && chosen + skipped == 0)
        fprintf(stderr, "idemproxy redrive: no dead letter of %s in %s has the id %s or holds entry %s\n",
                sc->stream, sc->dead_letter, a->entry, a->entry);
    ops_close(ctx);
    return rc;
}

/* --- keys: a dry run of the templates over the stream's last entries --------
 * XREVRANGE in pages, read only (no group, nothing written). Each entry is
 * prepared as the daemon prepares it (px_event_prepare: key, lock_key and
 * fingerprint), and per key only this is kept, in an open-addressing table
 * that doubles at half full: the key's 64-bit hash, its copies, its earliest
 * and latest entry ids and one fingerprint hash. So memory is at most 224
 * bytes per distinct key (a slot of 56 bytes, the table at least a quarter
 * full; half as much again while it doubles): 15 MB for 100,000 distinct
 * keys, plus one page of entries; the key
 * texts shown (top keys, conflicts, far-apart copies, at most 10 each) are
 * rendered again from their earliest entry, one XRANGE each, at the end. */

#define KEYS_DEFAULT_COUNT 10000
#define KEYS_SHOW          10 /* keys listed per finding, and top keys */
#define KEYS_REASONS       32 /* render-error reasons told apart; the rest lumped */

typedef struct keys_slot {
    uint64_t kh;                  /* px_hash64 of the key; 0: an empty slot (a hash 0 is 1) */
    uint64_t fp;                  /* the fingerprint of the first copy read (the latest) */
    uint64_t first_ms, first_seq; /* the earliest copy's entry id */
    uint64_t last_ms, last_seq;   /* the latest copy's entry id */
    uint32_t copies;
    bool conflict; /* some copy's fingerprint differs */
} keys_slot;

_Static_assert(sizeof(keys_slot) <= 56, "keys_slot: the memory bound above counts 56 bytes");

typedef struct keys_table {
    keys_slot *v;
    size_t cap, n; /* cap a power of two */
} keys_table;

static keys_slot *keys_find(keys_table *t, uint64_t kh)
{
    if (2 * (t->n + 1) > t->cap) { /* keep it at most half full */
        size_t cap = t->cap ? 2 * t->cap : 1024;
        keys_slot *v = px_calloc(cap, sizeof(*v));
        for (size_t i = 0; i < t->cap; i++) {
            if (t->v[i].kh == 0) continue;
            size_t j = t->v[i].kh & (cap - 1);
            while (v[j].kh) j = (j + 1) & (cap - 1);
            v[j] = t->v[i];
        }
        free(t->v);
        t->v = v;
        t->cap = cap;
    }
    size_t j = kh & (t->cap - 1);
    while (t->v[j].kh && t->v[j].kh != kh) j = (j + 1) & (t->cap - 1);
    if (t->v[j].kh == 0) {
        t->v[j].kh = kh;
        t->n++;
    }
    return &t->v[j];
}

typedef struct keys_reason {
    char *norm;    /* the reason with digit runs as '#': what tells reasons apart */
    char *example; /* the first such reason, as it was */
    char example_id[48];
    unsigned long long n;
} keys_reason;

typedef struct keys_report {
    unsigned long long entries, errors, conflicts, beyond, other_errors;
    keys_table keys;
    keys_table locks; /* lock_key hashes: only kh is used */
    keys_reason reasons[KEYS_REASONS];
    size_t nreasons;
    char other_id[48]; /* an entry whose reason was not told apart */
} keys_report;

static uint64_t hash_nz(const char *s)
{
    uint64_t h = px_hash64(s, strlen(s));
    return h ? h : 1;
}

static void keys_error(keys_report *k, const char *id, const char *why)
{
    k->errors++;
    px_buf norm = { 0 };
    for (const char *p = why; *p; p++) {
        if (isdigit((unsigned char)*p)) {
            while (isdigit((unsigned char)p[1])) p++;
            px_buf_append(&norm, "#", 1);
        } else {
            px_buf_append(&norm, p, 1);
        }
    }
    for (size_t i = 0; i < k->nreasons; i++)
        if (strcmp(k->reasons[i].norm, norm.data) == 0) {
            k->reasons[i].n++;
            px_buf_deinit(&norm);
            return;
        }
    if (k->nreasons == KEYS_REASONS) {
        if (k->other_errors++ == 0) snprintf(k->other_id, sizeof(k->other_id), "%s", id);
        px_buf_deinit(&norm);
        return;
    }
    keys_reason *r = &k->reasons[k->nreasons++];
    r->norm = px_strdup(norm.data);
    r->example = px_strdup(why);
    snprintf(r->example_id, sizeof(r->example_id), "%s", id);
    r->n = 1;
    px_buf_deinit(&norm);
}

/* One entry, prepared as the daemon does; 'whole' (the whole event as
 * fingerprint) stands in when the stream has none. */
static void keys_entry(keys_report *k, const px_config *c, const px_stream_conf *sc,
                       const px_stream_conf *whole, const redisReply *en)
{
    if (en->type != REDIS_REPLY_ARRAY || en->elements != 2 ||
        en->element[0]->type != REDIS_REPLY_STRING || en->element[1]->type != REDIS_REPLY_ARRAY)
        return;
    const char *id = en->element[0]->str;
    const redisReply *f = en->element[1];
    unsigned long long ms = 0, seq = 0;
    if (sscanf(id, "%llu-%llu", &ms, &seq) != 2) return;
    k->entries++;
    px_entry e;
    char why[512];
    bool ok = prepare(&e, whole, c, id, f, f->elements, why, sizeof(why));
    if (!ok && whole != sc && strncmp(why, "fingerprint ", 12) == 0) { /* not the daemon's */
        entry_deinit(&e);
        ok = prepare(&e, sc, c, id, f, f->elements, why, sizeof(why));
    }
    if (!ok) {
        keys_error(k, id, why);
        entry_deinit(&e);
        return;
    }
    keys_slot *s = keys_find(&k->keys, hash_nz(e.key));
    if (s->copies++ == 0) { /* read newest first: the first read is the latest */
        s->fp = e.fp;
        s->last_ms = ms;
        s->last_seq = seq;
    } else if (e.has_fp && e.fp != s->fp) {
        s->conflict = true;
    }
    s->first_ms = ms;
    s->first_seq = seq;
    if (e.lock_key) keys_find(&k->locks, hash_nz(e.lock_key));
    entry_deinit(&e);
}

/* The key of the entry 'ms-seq', rendered again (owned), or NULL. */
static char *keys_text(ops_conn *ctx, const px_config *c, const px_stream_conf *sc,
                       uint64_t ms, uint64_t seq)
{
    char id[48];
    snprintf(id, sizeof(id), "%llu-%llu", (unsigned long long)ms, (unsigned long long)seq);
    const char *argv[] = { "XRANGE", sc->stream, id, id };
    size_t lens[] = { 6, strlen(sc->stream), strlen(id), strlen(id) };
    redisReply *r = call(ctx, "keys", sc->stream, 4, argv, lens);
    char *key = NULL;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2 &&
        r->element[0]->element[1]->type == REDIS_REPLY_ARRAY) {
        const redisReply *f = r->element[0]->element[1];
        px_entry e;
        char why[512];
        if (prepare(&e, sc, c, id, f, f->elements, why, sizeof(why))) key = px_strdup(e.key);
        entry_deinit(&e);
    }
    if (r) freeReplyObject(r);
    return key;
}

/* Which keys a list shows, worst first. */
typedef enum { KL_TOP,
               KL_CONFLICT,
               KL_BEYOND } keys_list;

static uint64_t keys_rank(const keys_slot *s, keys_list l)
{
    return l == KL_BEYOND ? s->last_ms - s->first_ms : s->copies;
}

static bool keys_in(const keys_slot *s, keys_list l, uint64_t ttl)
{
    if (s->kh == 0) return false;
    if (l == KL_CONFLICT) return s->conflict;
    if (l == KL_BEYOND) return s->last_ms - s->first_ms > ttl;
    return s->copies > 1;
}

/* Up to KEYS_SHOW slots of list 'l', worst first, into 'out'; their count. */
static size_t keys_pick(const keys_table *t, keys_list l, uint64_t ttl, const keys_slot **out)
{
    size_t n = 0;
    for (size_t i = 0; i < t->cap; i++) {
        const keys_slot *s = &t->v[i];
        if (!keys_in(s, l, ttl)) continue;
        size_t j = n < KEYS_SHOW ? n++ : KEYS_SHOW;
        if (j == KEYS_SHOW) {
            if (keys_rank(s, l) <= keys_rank(out[KEYS_SHOW - 1], l)) continue;
            j = KEYS_SHOW - 1;
        }
        while (j > 0 && keys_rank(out[j - 1], l) < keys_rank(s, l)) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = s;
    }
    return n;
}

static void keys_id(char *buf, size_t size, uint64_t ms, uint64_t seq)
{
    snprintf(buf, size, "%llu-%llu", (unsigned long long)ms, (unsigned long long)seq);
}

static json_object *keys_list_json(ops_conn *ctx, const px_config *c, const px_stream_conf *sc,
                                   const keys_table *t, keys_list l)
{
    const keys_slot *pick[KEYS_SHOW];
    size_t n = keys_pick(t, l, (uint64_t)sc->done_ttl_ms, pick);
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < n; i++) {
        char first[48], last[48];
        keys_id(first, sizeof(first), pick[i]->first_ms, pick[i]->first_seq);
        keys_id(last, sizeof(last), pick[i]->last_ms, pick[i]->last_seq);
        char *key = keys_text(ctx, c, sc, pick[i]->first_ms, pick[i]->first_seq);
        json_object *o = json_object_new_object();
        json_object_object_add(o, "key", key ? jstr(key) : NULL);
        json_object_object_add(o, "copies", json_object_new_int64(pick[i]->copies));
        json_object_object_add(o, "first_entry", jstr(first));
        json_object_object_add(o, "last_entry", jstr(last));
        json_object_object_add(o, "apart_ms",
                               json_object_new_int64((int64_t)(pick[i]->last_ms - pick[i]->first_ms)));
        json_object_array_add(a, o);
        free(key);
    }
    return a;
}

static unsigned long long keys_count(const keys_table *t, keys_list l, uint64_t ttl)
{
    unsigned long long n = 0;
    for (size_t i = 0; i < t->cap; i++) n += keys_in(&t->v[i], l, ttl);
    return n;
}

static void keys_print_list(json_object *a, const char *what)
{
    size_t n = json_object_array_length(a);
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(a, i), *k;
        json_object_object_get_ex(o, "key", &k);
        long long copies = json_object_get_int64(json_object_object_get(o, "copies"));
        long long apart = json_object_get_int64(json_object_object_get(o, "apart_ms"));
        printf("    %-32s %lld copies", k ? show(json_object_get_string(k)) : "(trimmed since)", copies);
        if (strcmp(what, "beyond") == 0) printf(", %.1f s apart", (double)apart / 1000.0);
        printf(" (entries %s .. %s)\n", json_object_get_string(json_object_object_get(o, "first_entry")),
               json_object_get_string(json_object_object_get(o, "last_entry")));
    }
}

static void keys_print(const px_stream_conf *sc, json_object *o, long long asked)
{
#define NUM(name) ((long long)json_object_get_int64(json_object_object_get(o, name)))
    printf("stream %s%s%s: %lld entries read (the last %lld asked for), %lld distinct keys\n",
           show(sc->stream), sc->group ? ", group " : "", sc->group ? show(sc->group) : "",
           NUM("entries"), asked, NUM("distinct_keys"));
    bool any = NUM("render_errors") || NUM("conflicts") || NUM("beyond_ttl");
    printf("%s\n", any ? "findings, worst first:" : "no findings");
    if (NUM("render_errors")) {
        printf("  %lld entries whose key cannot be rendered (bad input: on_missing_key):\n",
               NUM("render_errors"));
        json_object *r = json_object_object_get(o, "render_error_reasons");
        for (size_t i = 0; i < json_object_array_length(r); i++) {
            json_object *x = json_object_array_get_idx(r, i);
            printf("    %6lld  %s (e.g. entry %s)\n",
                   (long long)json_object_get_int64(json_object_object_get(x, "count")),
                   show(json_object_get_string(json_object_object_get(x, "reason"))),
                   json_object_get_string(json_object_object_get(x, "example_entry")));
        }
    }
    if (NUM("conflicts")) {
        printf("  %lld keys whose copies carry different payloads (by %s): conflicts\n",
               NUM("conflicts"), sc->fingerprint ? "the fingerprint" : "the whole event");
        keys_print_list(json_object_object_get(o, "conflict_keys"), "conflict");
    }
    if (NUM("beyond_ttl")) {
        printf("  %lld keys whose copies arrived further apart than done_ttl_ms (%lld ms): "
               "the later copies would be handled again\n",
               NUM("beyond_ttl"), (long long)sc->done_ttl_ms);
        keys_print_list(json_object_object_get(o, "beyond_ttl_keys"), "beyond");
    }
    json_object *top = json_object_object_get(o, "top_keys");
    if (json_object_array_length(top)) {
        printf("most repeated keys:\n");
        keys_print_list(top, "top");
    }
    json_object *lk = json_object_object_get(o, "lock_keys");
    if (lk) printf("lock_key: %lld distinct values\n", (long long)json_object_get_int64(lk));
#undef NUM
}

int px_cmd_keys(px_config *c, const px_ops_args *a)
{
    px_stream_conf *sc = find_stream(c, a, "keys");
    if (sc == NULL) return 2;
    long long want = a->max >= 0 ? a->max : KEYS_DEFAULT_COUNT;
    /* Without a fingerprint, copies are compared by the whole event. */
    char err[256];
    px_template *wt = sc->fp_tpl ? NULL : px_template_compile("#event", err, sizeof(err), NULL);
    px_stream_conf whole = *sc;
    if (wt) whole.fp_tpl = wt;
    ops_conn *ctx;
    int rc = connect_redis(c, "keys", &ctx);
    if (rc != 0) {
        if (wt) px_template_destroy(wt);
        return rc;
    }
    keys_report k = { 0 };
    char end[64] = "+";
    while ((long long)k.entries < want) {
        char count[24];
        long long left = want - (long long)k.entries;
        snprintf(count, sizeof(count), "%lld", left < OPS_PAGE ? left : OPS_PAGE);
        const char *argv[] = { "XREVRANGE", sc->stream, end, "-", "COUNT", count };
        size_t lens[6];
        for (int i = 0; i < 6; i++) lens[i] = strlen(argv[i]);
        redisReply *page = call(ctx, "keys", sc->stream, 6, argv, lens);
        if (page == NULL) {
            rc = 1;
            break;
        }
        size_t n = page->type == REDIS_REPLY_ARRAY ? page->elements : 0;
        for (size_t i = 0; i < n; i++) keys_entry(&k, c, sc, wt ? &whole : sc, page->element[i]);
        if (n > 0 && page->element[n - 1]->type == REDIS_REPLY_ARRAY &&
            page->element[n - 1]->elements == 2)
            snprintf(end, sizeof(end), "(%s", page->element[n - 1]->element[0]->str);
        freeReplyObject(page);
        if (n == 0 || (long long)n < atoll(count)) break;
    }
    if (rc == 0) {
        uint64_t ttl = (uint64_t)sc->done_ttl_ms;
        k.conflicts = keys_count(&k.keys, KL_CONFLICT, ttl);
        k.beyond = keys_count(&k.keys, KL_BEYOND, ttl);
        json_object *o = json_object_new_object();
        json_object_object_add(o, "stream", jstr(sc->stream));
        json_object_object_add(o, "group", sc->group ? jstr(sc->group) : NULL);
        json_object_object_add(o, "entries", json_object_new_int64((int64_t)k.entries));
        json_object_object_add(o, "distinct_keys", json_object_new_int64((int64_t)k.keys.n));
        json_object_object_add(o, "render_errors", json_object_new_int64((int64_t)k.errors));
        json_object *jr = json_object_new_array();
        for (size_t i = 0; i < k.nreasons; i++) {
            json_object *x = json_object_new_object();
            json_object_object_add(x, "reason", jstr(k.reasons[i].example));
            json_object_object_add(x, "count", json_object_new_int64((int64_t)k.reasons[i].n));
            json_object_object_add(x, "example_entry", jstr(k.reasons[i].example_id));
            json_object_array_add(jr, x);
        }
        if (k.other_errors) {
            json_object *x = json_object_new_object();
            json_object_object_add(x, "reason", jstr("(other reasons)"));
            json_object_object_add(x, "count", json_object_new_int64((int64_t)k.other_errors));
            json_object_object_add(x, "example_entry", jstr(k.other_id));
            json_object_array_add(jr, x);
        }
        json_object_object_add(o, "render_error_reasons", jr);
        json_object_object_add(o, "fingerprint", sc->fingerprint ? jstr(sc->fingerprint) : NULL);
        json_object_object_add(o, "conflicts", json_object_new_int64((int64_t)k.conflicts));
        json_object_object_add(o, "conflict_keys", keys_list_json(ctx, c, sc, &k.keys, KL_CONFLICT));
        json_object_object_add(o, "done_ttl_ms", json_object_new_int64(sc->done_ttl_ms));
        json_object_object_add(o, "beyond_ttl", json_object_new_int64((int64_t)k.beyond));
        json_object_object_add(o, "beyond_ttl_keys", keys_list_json(ctx, c, sc, &k.keys, KL_BEYOND));
        json_object_object_add(o, "top_keys", keys_list_json(ctx, c, sc, &k.keys, KL_TOP));
        json_object_object_add(o, "lock_keys",
                               sc->lock_tpl ? json_object_new_int64((int64_t)k.locks.n) : NULL);
        if (a->json) print_json(o);
        else keys_print(sc, o, want);
        json_object_put(o);
        rc = k.errors || k.conflicts || k.beyond ? 3 : 0;
    }
    for (size_t i = 0; i < k.nreasons; i++) {
        free(k.reasons[i].norm);
        free(k.reasons[i].example);
    }
    free(k.keys.v);
    free(k.locks.v);
    if (wt) px_template_destroy(wt);
    ops_close(ctx);
    return rc;
}
