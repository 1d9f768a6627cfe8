/*
 * example_worker.c - an idemproxy worker built on idemproxy_client.h.
 *
 * It connects to idemproxy (which may start later: nanomsg keeps dialing),
 * answers every delivery and prints one line per delivery on stdout,
 * "<key> attempt=<n>", flushed once the answer is handed to nanomsg (at once
 * for a delivery it leaves unanswered). Everything else goes to stderr.
 * SIGTERM or SIGINT: the delivery in hand is finished, then it exits 0.
 *
 * The environment turns it into a test double:
 *   IDEMPROXY_ENDPOINT   endpoint when --endpoint is not given
 *   WORKER_DELAY_MS      work this long before answering each delivery
 *   WORKER_RETRY_KEYS    k1,k2: answer RETRY while attempt <= WORKER_RETRY_TIMES (1)
 *   WORKER_RETRY_AFTER_MS  those RETRYs ask for a redelivery after this many ms
 *   WORKER_DROP_KEYS     k3: answer DROP, reason "dropped by worker"
 *   WORKER_NOACK_KEYS    k4: never answer (the next receive abandons it, so
 *                        idemproxy's ack timeout fires)
 *   WORKER_CRASH_KEYS    k5: exit(3) on receipt, unanswered, as a crash would
 *   WORKER_MAX_BYTES     app.max_entry_bytes, if it was raised (-1: no limit)
 *   WORKER_VERBOSE=1     describe each delivery on stderr
 *   WORKER_SLOW_KEYS     k6: work WORKER_SLOW_MS (1000) on these before answering
 *   WORKER_DEADLINE_KEYS k7: work WORKER_SLOW_MS on these, but no longer than
 *                        idemproxy_delivery_remaining_ms(d) (C cannot stop the
 *                        handler: the work stops itself at the deadline) and
 *                        answer RETRY
 *   WORKER_REPORT        a file: one JSON object per handled delivery is appended
 *                        (key, stream, entry_id, attempt, fencing_token,
 *                        deadline_unix_ms, payload, fields, status, start_ms, end_ms,
 *                        traceparent, tracestate, span_trace_id, span_parent_id,
 *                        remaining_ms: the time left at the start, -1 without a
 *                        deadline; stopped: "deadline" when the work stopped there);
 *                        the shared client scenario reads it (tests/integration/
 *                        test_clients.py), so every language writes the same
 *   WORKER_RECEIVED      a file: "<key> attempt=<n>" is appended (one write(2))
 *                        as each delivery arrives, before any work, so one in
 *                        hand at a kill -9 is on record (tests/fault counts
 *                        every delivery per key from it)
 * The C client hands over the trace context as strings only (no OpenTelemetry
 * API in C to depend on): this worker starts its handler's span itself, a child
 * of d->traceparent (handler_span below), as a tracer of the application's
 * would; span_trace_id and span_parent_id in the report are that span's.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>

#include "idemproxy_client.h"

static volatile sig_atomic_t stop;

static void stop_cb(int sig)
{
    (void) sig;
    stop = 1;
}

/* True when 'key' is one of the comma-separated names in 'list' (may be NULL). */
static int in_list(const char *list, const char *key)
{
    size_t klen = strlen(key);

    while (list != NULL && *list != '\0') {
        const char *end = strchr(list, ',');
        size_t len = end ? (size_t) (end - list) : strlen(list);

        if (len == klen && memcmp(list, key, len) == 0)
            return 1;
        list = end ? end + 1 : NULL;
    }
    return 0;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);

    return v != NULL && *v != '\0' ? strtol(v, NULL, 10) : dflt;
}

/* Sleeps 'ms' in full even if a signal arrives: the work in hand is finished. */
static void work(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    while (ms > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void describe(const idemproxy_delivery *d)
{
    size_t i;

    fprintf(stderr, "delivery %s %s key=%s attempt=%u fencing=%llu deadline=%llu\n",
            d->stream, d->entry_id, d->key, d->attempt,
            (unsigned long long) d->fencing_token,
            (unsigned long long) d->deadline_unix_ms);
    for (i = 0; i < d->nfields; i++)
        fprintf(stderr, "  %s = %.*s\n", d->fields[i].name,
                (int) d->fields[i].value_len, (const char *) d->fields[i].value);
    fprintf(stderr, "  payload = %.*s\n", (int) d->payload_len, (const char *) d->payload);
}

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Writes 'len' bytes of 's' as a JSON string. */
static void json_str(FILE *f, const char *s, size_t len)
{
    size_t i;

    fputc('"', f);
    for (i = 0; i < len; i++) {
        unsigned char ch = (unsigned char) s[i];

        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* The handler's span, started as a child of the delivery's W3C traceparent
 * ("00-<32 hex trace id>-<16 hex span id>-<2 hex flags>"): its trace id and its
 * parent's span id, both "" when the traceparent is absent or malformed (a new
 * root then). Its own span id would be a fresh random one; a real tracer would
 * also export it. */
struct handler_span {
    char trace_id[33];
    char parent_id[17];
};

static int lower_hex(const char *s, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

static struct handler_span handler_span(const char *tp)
{
    struct handler_span sp = {"", ""};

    if (strlen(tp) == 55 && strncmp(tp, "00-", 3) == 0 && tp[35] == '-' && tp[52] == '-' &&
        lower_hex(tp + 3, 32) && lower_hex(tp + 36, 16) && lower_hex(tp + 53, 2) &&
        strspn(tp + 3, "0") < 32 && strspn(tp + 36, "0") < 16) {
        memcpy(sp.trace_id, tp + 3, 32);
        memcpy(sp.parent_id, tp + 36, 16);
    }
    return sp;
}

/* Appends one JSON line about 'd' to the file named by WORKER_REPORT. */
static void report(const idemproxy_delivery *d, const char *status, long long start, long long end,
                   long long remaining, const char *stopped)
{
    struct handler_span sp = handler_span(d->traceparent);
    const char *path = getenv("WORKER_REPORT");
    FILE *f;
    size_t i;

    if (path == NULL || *path == '\0' || (f = fopen(path, "a")) == NULL)
        return;
    fputs("{\"key\":", f);
    json_str(f, d->key, strlen(d->key));
    fputs(",\"stream\":", f);
    json_str(f, d->stream, strlen(d->stream));
    fputs(",\"entry_id\":", f);
    json_str(f, d->entry_id, strlen(d->entry_id));
    fprintf(f, ",\"attempt\":%u,\"fencing_token\":%llu,\"deadline_unix_ms\":%llu,\"payload\":",
            d->attempt, (unsigned long long) d->fencing_token,
            (unsigned long long) d->deadline_unix_ms);
    json_str(f, (const char *) d->payload, d->payload_len);
    fputs(",\"fields\":{", f);
    for (i = 0; i < d->nfields; i++) {
        if (i)
            fputc(',', f);
        json_str(f, d->fields[i].name, strlen(d->fields[i].name));
        fputc(':', f);
        json_str(f, (const char *) d->fields[i].value, d->fields[i].value_len);
    }
    fputs("},\"traceparent\":", f);
    json_str(f, d->traceparent, strlen(d->traceparent));
    fputs(",\"tracestate\":", f);
    json_str(f, d->tracestate, strlen(d->tracestate));
    fprintf(f, ",\"span_trace_id\":\"%s\",\"span_parent_id\":\"%s\"", sp.trace_id, sp.parent_id);
    fprintf(f, ",\"status\":\"%s\",\"start_ms\":%lld,\"end_ms\":%lld", status, start, end);
    fprintf(f, ",\"remaining_ms\":%lld,\"stopped\":\"%s\"}\n", remaining, stopped);
    fclose(f);
}

/* Appends "<key> attempt=<n>" to the file named by WORKER_RECEIVED, in one
 * write(2): it is in the file even if the worker is killed the next moment. */
static void received(const idemproxy_delivery *d)
{
    const char *path = getenv("WORKER_RECEIVED");
    char line[1100];
    int fd, n;

    if (path == NULL || *path == '\0')
        return;
    n = snprintf(line, sizeof(line), "%s attempt=%u\n", d->key, d->attempt);
    if (n < 0 || (size_t) n >= sizeof(line))
        n = snprintf(line, sizeof(line), "%.1000s... attempt=%u\n", d->key, d->attempt);
    if ((fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644)) < 0)
        return;
    if (write(fd, line, (size_t) n) != n)
        fprintf(stderr, "example_worker: %s: short write\n", path);
    close(fd);
}

/* How the environment asks 'd' to be answered: "ack", "retry" or "drop". */
static const char *decide(const idemproxy_delivery *d)
{
    if (in_list(getenv("WORKER_DROP_KEYS"), d->key))
        return "drop";
    if (in_list(getenv("WORKER_RETRY_KEYS"), d->key) &&
        d->attempt <= env_long("WORKER_RETRY_TIMES", 1))
        return "retry";
    return "ack";
}

/* Sends the answer 'status' names; returns what the client returned. */
static int answer(idemproxy_client *c, const idemproxy_delivery *d, const char *status)
{
    if (strcmp(status, "drop") == 0)
        return idemproxy_client_drop(c, d, "dropped by worker");
    if (strcmp(status, "retry") == 0 && env_long("WORKER_RETRY_AFTER_MS", 0) > 0)
        return idemproxy_client_retry_after(c, d, (uint32_t) env_long("WORKER_RETRY_AFTER_MS", 0),
                                            "retry requested by worker");
    if (strcmp(status, "retry") == 0)
        return idemproxy_client_retry(c, d, "retry requested by worker");
    return idemproxy_client_ack(c, d);
}

int main(int argc, char **argv)
{
    const char *endpoint = getenv("IDEMPROXY_ENDPOINT");
    long delay_ms = env_long("WORKER_DELAY_MS", 0);
    long max_bytes = env_long("WORKER_MAX_BYTES", 0);
    int verbose = env_long("WORKER_VERBOSE", 0) != 0;
    struct sigaction sa;
    idemproxy_client *c;
    int i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--endpoint") == 0 && i + 1 < argc) {
            endpoint = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--endpoint URL]   (default %s)\n",
                    argv[0], IDEMPROXY_CLIENT_DEFAULT_ENDPOINT);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }

    /* No SA_RESTART: the signal interrupts a waiting idemproxy_client_recv. nanomsg's
     * own threads block every signal, so this thread is the one that gets it. */
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = stop_cb;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    c = idemproxy_client_connect(endpoint);
    if (c == NULL || c->err) {
        fprintf(stderr, "example_worker: %s\n", c ? c->errstr : "out of memory");
        idemproxy_client_free(c);
        return 1;
    }
    if (max_bytes != 0 && idemproxy_client_set_max_entry_bytes(c, (int) max_bytes) != IDEMPROXY_CLIENT_OK)
        fprintf(stderr, "example_worker: WORKER_MAX_BYTES: %s\n", c->errstr);
    fprintf(stderr, "example_worker: waiting for deliveries on %s\n",
            endpoint ? endpoint : IDEMPROXY_CLIENT_DEFAULT_ENDPOINT);

    while (!stop) {
        idemproxy_delivery *d;
        int rc = idemproxy_client_recv(c, 1000, &d);

        if (rc == IDEMPROXY_CLIENT_EAGAIN) {
            if (c->err != 0)    /* a delivery past its deadline, answered RETRY */
                fprintf(stderr, "example_worker: %s\n", c->errstr);
            continue;
        }
        if (rc != IDEMPROXY_CLIENT_OK) {
            fprintf(stderr, "example_worker: %s\n", c->errstr);
            if (c->err == EBADF || c->err == ETERM)
                break;
            continue;
        }
        received(d);
        if (verbose)
            describe(d);
        if (in_list(getenv("WORKER_CRASH_KEYS"), d->key)) {
            fprintf(stderr, "example_worker: crashing on %s as asked\n", d->key);
            exit(3);
        }
        if (!in_list(getenv("WORKER_NOACK_KEYS"), d->key)) {
            long long start = now_ms();
            long long remaining = idemproxy_delivery_remaining_ms(d);
            const char *status = decide(d), *stopped = "";

            work(delay_ms);
            if (in_list(getenv("WORKER_SLOW_KEYS"), d->key))
                work(env_long("WORKER_SLOW_MS", 1000));
            if (in_list(getenv("WORKER_DEADLINE_KEYS"), d->key)) {
                long slow = env_long("WORKER_SLOW_MS", 1000);
                long long left = idemproxy_delivery_remaining_ms(d);

                if (left >= 0 && left <= slow) {
                    work((long) left);
                    status = "retry";
                    stopped = "deadline";
                } else {
                    work(slow);
                }
            }
            /* Recorded before it is sent: a kill between the two may leave an
             * answer recorded and never sent, never the other way round. */
            report(d, status, start, now_ms(), remaining, stopped);
            if ((*stopped ? idemproxy_client_retry(c, d, "stopped at the deadline")
                          : answer(c, d, status)) != IDEMPROXY_CLIENT_OK)
                fprintf(stderr, "example_worker: %s\n", c->errstr);
        }
        printf("%s attempt=%u\n", d->key, d->attempt);
        fflush(stdout);
        idemproxy_delivery_free(d);
    }
    idemproxy_client_free(c);
    return 0;
}
