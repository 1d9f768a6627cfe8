/*
 * step.c - commands about one entry, and steps (see step.h for the contract).
 */
#include "step.h"

#include <stdlib.h>
#include <string.h>

#include "decide.h"

typedef struct cmd_ctx {
    px_entry *e;
    px_reply_fn *on;
    bool step;
    px_step_sent sent;    /* its number and when it was sent */
    struct cmd_ctx *next; /* in ctx_pool */
} cmd_ctx;

static uint64_t next_seq = 1; /* the number of the next command */
static px_step_sent replying; /* the command whose reply a handler is reading */

uint64_t px_step_next_seq(void)
{
    return next_seq;
}

px_step_sent px_step_replying(void)
{
    return replying;
}

/* Contexts are reused, as redis.c reuses its command records: a few commands
 * per entry would otherwise be a malloc and a free each. */
static cmd_ctx *ctx_pool;

static void ctx_put(cmd_ctx *ctx)
{
    ctx->next = ctx_pool;
    ctx_pool = ctx;
}

void px_step_io_hold(px_entry *e)
{
    e->step.io++;
}

bool px_step_io_done(px_entry *e)
{
    PX_ASSERT(e->step.io > 0);
    e->step.io--;
    if (!e->gone) return true;
    if (e->step.io == 0) px_entry_free(e);
    return false;
}

/* Runs the completion once every reply of the step is in; it is cleared
 * before it runs, so it cannot run twice, even if it begins the next step. */
static void step_check(px_entry *e)
{
    if (e->step.pending == 0 && e->step.done) {
        px_step_fn *done = e->step.done;
        e->step.done = NULL;
        done(e);
    }
}

void px_step_begin(px_entry *e, px_step_fn *done)
{
    PX_ASSERT(e->step.done == NULL && e->step.pending == 0);
    e->step.pending = 1; /* held until px_step_end, so replies cannot finish early */
    e->step.failed = false;
    e->step.hard = false;
    e->step.done = done;
}

void px_step_end(px_entry *e)
{
    e->step.pending--;
    step_check(e);
}

static void entry_reply_cb(px_redis *r, redisReply *reply, void *priv)
{
    (void)r;
    cmd_ctx ctx = *(cmd_ctx *)priv;
    px_entry *e = ctx.e;
    ctx_put(priv);
    if (!px_step_io_done(e)) return;
    if (ctx.step && (reply == NULL || reply->type == REDIS_REPLY_ERROR)) {
        e->step.failed = true;
        if (reply && !px_decide_error_passes(reply->str)) {
            e->step.hard = true;
            free(e->step.redis_error);
            e->step.redis_error = px_strndup(reply->str, reply->len < 200 ? reply->len : 200);
        }
    } else if (reply && reply->type != REDIS_REPLY_ERROR && ctx.on) {
        replying = ctx.sent;
        ctx.on(e, reply);
        replying = (px_step_sent){ 0 };
    }
    if (ctx.step) {
        e->step.pending--;
        step_check(e);
    }
}

static cmd_ctx *ctx_new(px_entry *e, px_reply_fn *on, bool step)
{
    cmd_ctx *ctx = ctx_pool;
    if (ctx) ctx_pool = ctx->next;
    else ctx = px_malloc(sizeof(*ctx));
    ctx->e = e;
    ctx->on = on;
    ctx->step = step;
    ctx->sent = (px_step_sent){ next_seq++, px_mono_ms() };
    px_step_io_hold(e);
    if (step) e->step.pending++;
    return ctx;
}

/* The command could not be sent: as if its reply were lost, at once. */
static void ctx_unsent(cmd_ctx *ctx)
{
    px_entry *e = ctx->e;
    e->step.io--;
    if (ctx->step) {
        e->step.pending--;
        e->step.failed = true;
    }
    ctx_put(ctx);
}

void px_step_cmd(px_entry *e, const char *key, px_reply_fn *on, int argc, const char **argv,
                 const size_t *lens)
{
    cmd_ctx *ctx = ctx_new(e, on, true);
    if (px_redis_argv(e->st->px->redis, key, 0, entry_reply_cb, ctx, argc, argv, lens) != PX_OK)
        ctx_unsent(ctx);
}

void px_step_script(px_entry *e, px_script *s, px_reply_fn *on, bool step, const char *key,
                    const char *arg1, const char *arg2)
{
    cmd_ctx *ctx = ctx_new(e, on, step);
    const char *argv[3] = { key, arg1, arg2 };
    size_t lens[3] = { strlen(key), strlen(arg1), arg2 ? strlen(arg2) : 0 };
    if (px_redis_script(e->st->px->redis, s, entry_reply_cb, ctx, 1, arg2 ? 3 : 2, argv, lens) != PX_OK)
        ctx_unsent(ctx);
}
