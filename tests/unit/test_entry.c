/*
 * test_entry.c - the always-on checks of an entry (proxy/entry.c, PX_ENSURE):
 * each violation aborts in every build, the release one included, with a
 * line that names it. Each case runs in a child process.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proxy.h"
#include "test.h"
#include "trace.h"

void px_proxy_read(px_entry *e) /* entry.c hands a new entry to the hub */
{
    (void)e;
}

void px_trace_entry_free(px_entry *e) /* entry.c frees an entry's span state */
{
    (void)e;
}

/* True when 'fn' aborts (SIGABRT) in a child. */
static bool aborts(void (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        fclose(stderr); /* the expected line, not in the test's output */
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static px_entry *entry(void)
{
    return px_calloc(1, sizeof(px_entry));
}

static void two_queues(void)
{
    px_queue a = { 0 }, b = { 0 };
    px_entry *e = entry();
    px_queue_push(&a, e);
    px_queue_push(&b, e);
}

static void queue_round_trip(void)
{
    px_queue a = { 0 }, b = { 0 };
    px_entry *e = entry();
    px_queue_push(&a, e);
    px_queue_push(&b, px_queue_pop(&a));
    px_queue_pop(&b);
    px_entry_free(e);
}

static void freed_with_reply_out(void)
{
    px_entry *e = entry();
    e->step.io = 1;
    px_entry_free(e);
}

static void freed_in_a_queue(void)
{
    px_queue a = { 0 };
    px_entry *e = entry();
    px_queue_push(&a, e);
    px_entry_free(e);
}

static void sent_without_lock(void)
{
    px_entry *e = entry();
    e->state = PX_E_SEND;
    px_entry_to(e, PX_E_SENT);
}

static void sent_with_lock(void)
{
    px_entry *e = entry();
    e->state = PX_E_SEND;
    e->claim.has_dedup = true;
    px_entry_to(e, PX_E_SENT);
    free(e);
}

/* GONE is where an entry goes, never a state it is in (entry.c's table):
 * px_entry_to marks it gone and leaves its last state, which the hub reads. */
static void test_gone(void)
{
    px_entry *e = entry();
    e->state = PX_E_XACK;
    px_entry_to(e, PX_E_GONE);
    test_cond("to GONE: marked gone", e->gone);
    test_cond("to GONE: its state stays the last one", e->state == PX_E_XACK);
    free(e);
}

int main(void)
{
    px_log_setup(PX_LOG_ERROR, PX_LOG_TEXT);
    test_cond("an entry pushed on a second queue aborts", aborts(two_queues));
    test_cond("popped, it may wait in another", !aborts(queue_round_trip));
    test_cond("freed with a reply still to come aborts", aborts(freed_with_reply_out));
    test_cond("freed while in a queue aborts", aborts(freed_in_a_queue));
    test_cond("SENT without its dedup lock aborts", aborts(sent_without_lock));
    test_cond("SENT holding it does not", !aborts(sent_with_lock));
    test_gone();
    return test_report();
}
