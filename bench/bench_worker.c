/*
 * bench_worker.c - the worker of `make bench`.
 *
 * Normal mode: --threads N threads, each with its own NN_REP socket from the C
 * client (clients/c), each acking every delivery at once. Every delivery is
 * counted; when the payload carries the producer's "ts_us" (CLOCK_REALTIME, in
 * microseconds, stamped just before the XADD was sent), now - ts_us goes into
 * a histogram (hist.h). With --expect K, the CLOCK_MONOTONIC time at
 * which the K-th delivery arrived is recorded, so the orchestrator can time
 * "all unique keys delivered" without polling.
 *
 * Hold mode (--hold): --threads raw (AF_SP_RAW) NN_REP sockets, a thread
 * each, that receive deliveries and never answer, so idemproxy keeps them all
 * in flight: the "RSS with 10k deliveries in flight" measurement. idemproxy
 * sends at most 128 unanswered deliveries per connected worker, so 10k need
 * 79 sockets.
 *
 * It runs until SIGTERM or SIGINT, then prints one JSON line on stdout:
 *   {"deliveries":..,"redeliveries":..,"expect_mono":..,"first_mono":..,
 *    "last_mono":..,"max_gap_us":..,"lat_n":..,"p50_us":..,"p99_us":..,"p999_us":..,"max_us":..}
 * max_gap_us is the longest time between two deliveries: a stall shows there.
 * With --progress FILE it also rewrites FILE with the delivery count every
 * 100 ms (the hold mode's count, which idemproxy's metrics cannot show).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "hist.h"
#include "idemproxy_client.h"

static const char *endpoint = "ipc:///tmp/idemproxy.sock";
static long expect;
static atomic_int stop;
static atomic_long deliveries, redeliveries;
static atomic_ullong first_mono, last_mono, expect_mono, max_gap;

/* Count one delivery; record when the expected count is reached. */
static void counted(void)
{
    uint64_t t = now_us(CLOCK_MONOTONIC);
    unsigned long long zero = 0;
    atomic_compare_exchange_strong(&first_mono, &zero, t);
    unsigned long long prev = atomic_exchange(&last_mono, t), gap = prev && t > prev ? t - prev : 0;
    unsigned long long cur = atomic_load(&max_gap);
    while (gap > cur && !atomic_compare_exchange_weak(&max_gap, &cur, gap))
        ;
    long n = atomic_fetch_add(&deliveries, 1) + 1;
    if (expect > 0 && n == expect) atomic_store(&expect_mono, t);
}

static void *ack_thread(void *arg)
{
    hist *h = arg;
    idemproxy_client *c = idemproxy_client_connect(endpoint);
    if (c == NULL || c->err) {
        fprintf(stderr, "bench_worker: connect: %s\n", c ? c->errstr : "out of memory");
        exit(1);
    }
    while (!atomic_load(&stop)) {
        idemproxy_delivery *d;
        int rc = idemproxy_client_recv(c, 100, &d);
        if (rc == IDEMPROXY_CLIENT_EAGAIN) continue;
        if (rc != IDEMPROXY_CLIENT_OK) {
            fprintf(stderr, "bench_worker: recv: %s\n", c->errstr);
            continue;
        }
        uint64_t now = now_us(CLOCK_REALTIME), ts;
        counted();
        if (d->attempt > 1) atomic_fetch_add(&redeliveries, 1);
        if (payload_ts(d->payload, d->payload_len, &ts) == 0 && ts > 0)
            hist_add(h, now > ts ? now - ts : 0);
        if (idemproxy_client_ack(c, d) != IDEMPROXY_CLIENT_OK)
            fprintf(stderr, "bench_worker: ack: %s\n", c->errstr);
        idemproxy_delivery_free(d);
    }
    idemproxy_client_free(c);
    return NULL;
}

static void *hold_thread(void *arg)
{
    (void)arg;
    int s = nn_socket(AF_SP_RAW, NN_REP);
    if (s < 0) { fprintf(stderr, "bench_worker: nn_socket: %s\n", nn_strerror(errno)); exit(1); }
    int to = 100;
    if (nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof(to)) < 0 ||
        nn_connect(s, endpoint) < 0) {
        fprintf(stderr, "bench_worker: hold socket: %s\n", nn_strerror(errno));
        exit(1);
    }
    while (!atomic_load(&stop)) {
        void *buf = NULL;
        int n = nn_recv(s, &buf, NN_MSG, 0);
        if (n < 0) {
            if (errno != ETIMEDOUT && errno != EAGAIN && errno != EINTR)
                fprintf(stderr, "bench_worker: hold recv: %s\n", nn_strerror(errno));
            continue;
        }
        counted();              /* received, never answered */
        nn_freemsg(buf);
    }
    nn_close(s);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 4, hold = 0;
    const char *progress = NULL;
    static const struct option opts[] = {
        { "endpoint", required_argument, NULL, 'e' }, { "threads", required_argument, NULL, 't' },
        { "expect", required_argument, NULL, 'x' },   { "hold", no_argument, NULL, 'H' },
        { "progress", required_argument, NULL, 'p' }, { NULL, 0, NULL, 0 } };
    int o;
    while ((o = getopt_long(argc, argv, "e:t:x:Hp:", opts, NULL)) != -1) {
        switch (o) {
        case 'e': endpoint = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'x': expect = atol(optarg); break;
        case 'H': hold = 1; break;
        case 'p': progress = optarg; break;
        default:
            fprintf(stderr, "usage: bench_worker --endpoint EP [--threads N] [--expect K] [--hold]"
                            " [--progress FILE]\n");
            return 2;
        }
    }
    if (threads < 1) threads = 1;

    /* Signals go to this thread only, through sigtimedwait. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    pthread_t *tid = calloc((size_t)threads, sizeof(*tid));
    hist *h = calloc((size_t)threads, sizeof(*h));
    if (tid == NULL || h == NULL) { fprintf(stderr, "bench_worker: out of memory\n"); return 1; }
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&tid[i], NULL, hold ? hold_thread : ack_thread, &h[i]);
        if (rc != 0) { fprintf(stderr, "bench_worker: pthread_create: %s\n", strerror(rc)); return 1; }
    }
    /* The count goes to a temporary file renamed over 'progress', so a reader
     * never sees it truncated and empty (which read as 0 deliveries held). */
    char tmp[4096];
    if (progress) snprintf(tmp, sizeof(tmp), "%s.tmp", progress);
    struct timespec tick = { 0, 100 * 1000 * 1000 };
    while (sigtimedwait(&set, NULL, &tick) < 0) {
        if (progress) {
            FILE *f = fopen(tmp, "w");
            if (f) {
                fprintf(f, "%ld\n", atomic_load(&deliveries));
                if (fclose(f) == 0) rename(tmp, progress);
            }
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);

    static hist all;
    for (int i = 0; i < threads; i++) hist_merge(&all, &h[i]);
    printf("{\"deliveries\":%ld,\"redeliveries\":%ld,\"expect_mono\":%llu,\"first_mono\":%llu,"
           "\"last_mono\":%llu,\"max_gap_us\":%llu,",
           atomic_load(&deliveries), atomic_load(&redeliveries), atomic_load(&expect_mono),
           atomic_load(&first_mono), atomic_load(&last_mono), atomic_load(&max_gap));
    hist_print_json(&all);
    printf("}\n");
    free(tid);
    free(h);
    return 0;
}
