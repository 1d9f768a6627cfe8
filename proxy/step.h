/*
 * step.h - the Redis commands about one entry, and the steps they make up
 * (step.c). Every command about an entry goes through here; claim.c and
 * commit.c say what the commands are, this module keeps the entry alive for
 * their replies and runs each step's completion. Its contract:
 *
 *  - An entry is never freed while io > 0. Each command about it counts in
 *    e->step.io until its reply is in, or the link's teardown answers it with no
 *    reply. px_entry_finish marks the entry gone and frees it only at io 0;
 *    otherwise the last reply frees it, and no handler of a gone entry runs.
 *  - XACK batches hold their entries too: px_step_io_hold for each entry of a
 *    batch sent, px_step_io_done for each when the batch's reply is in.
 *  - A step's completion runs exactly once. px_step_begin(e, done), then the
 *    step's commands, then px_step_end(e): 'done' runs when the last reply is
 *    in, or in px_step_end if every reply is in already (or nothing could be
 *    sent), never while commands are still being added. Before it, each
 *    reply that is not an error goes to the command's handler 'on'.
 *    e->step.failed tells 'done' that a reply was lost, an error or never
 *    sent; e->step.hard and e->step.redis_error that an error was one retrying
 *    does not cure (decide.c's px_decide_error_passes).
 *  - A command outside a step (a lease extension) counts in io only.
 *
 * A handler or a completion may start the next step, or hand the entry back
 * to proxy.c, which may finish it.
 */
#ifndef PX_STEP_H
#define PX_STEP_H

#include "proxy.h"

/* What a reply about an entry says, read out of it (never an error reply). */
typedef void px_reply_fn(px_entry *e, redisReply *r);

void px_step_begin(px_entry *e, px_step_fn *done);
void px_step_end(px_entry *e);

/* A step's command about 'key', routed by it in a cluster: the key whose slot
 * holds what the command reads or writes, named by the caller, never found at
 * an argument's position (an EVAL's key is its fourth). */
void px_step_cmd(px_entry *e, const char *key, px_reply_fn *on, int argc, const char **argv,
                 const size_t *lens);
/* Script 's' on KEYS[1] 'key' with ARGV 'arg1' and 'arg2' (NULL: one ARGV);
 * part of the current step when 'step', else counted in io only. */
void px_step_script(px_entry *e, px_script *s, px_reply_fn *on, bool step, const char *key,
                    const char *arg1, const char *arg2);

/* Every command about an entry gets a number, one more than the last, and
 * the time it was sent (px_mono_ms: queued in this loop turn, written at its
 * end, or never). px_step_next_seq is the number the next one gets; inside a
 * reply handler ('on'), px_step_replying says which command it answers, so
 * claim.c knows which token a reply confirms and from when
 * (docs/guarantee.md). */
typedef struct px_step_sent {
    uint64_t seq;     /* the command's number */
    uint64_t sent_ms; /* px_mono_ms when it was sent */
} px_step_sent;
uint64_t px_step_next_seq(void);
px_step_sent px_step_replying(void);

/* A command about 'e' sent outside this module (an XACK batch): held while
 * its reply is awaited. px_step_io_done drops the hold: false when 'e' is
 * gone (and then freed if that was its last), so the caller leaves it be. */
void px_step_io_hold(px_entry *e);
bool px_step_io_done(px_entry *e);

#endif
