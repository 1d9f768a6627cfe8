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
 * Concurrency mode (--concurrency K): ONE connection with K handlers, the shape
 * of the clients here (a worker with concurrency K on one socket): one raw
 * (AF_SP_RAW) NN_REP socket; the receiving thread takes each request with its
 * SP header (nn_recvmsg, msg_control NN_MSG) as soon as one of the K handler
 * threads is free and hands it over; the handler decodes the Delivery (for
 * attempt and ts_us), counts it and answers with the same header
 * (nn_sendmsg): `08 01`, an Ack with status ACK (docs/protocol.md). At most K
 * deliveries are taken from the socket and unanswered; the rest wait in
 * nanomsg's pipe, in idemproxy's window for this one worker.
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
#include "idemproxy/v1/idemproxy.pb-c.h"

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

/* --concurrency: requests taken from the one socket, waiting for a handler. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t  work, room;      /* a request queued; a handler is free */
    int             busy;            /* taken and not yet answered (at most 'cap') */
    int             cap, head, n;
    void          **body, **ctl;     /* ring of 'cap' requests: body and SP header */
    int            *len;
} q = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
        0, 0, 0, 0, NULL, NULL, NULL };
static int conc_sock = -1;

static void *handler_thread(void *arg)
{
    hist *h = arg;
    static const uint8_t ack[] = { 0x08, 0x01 };     /* Ack { status: ACK } */
    for (;;) {
        pthread_mutex_lock(&q.mu);
        while (q.n == 0 && !atomic_load(&stop)) pthread_cond_wait(&q.work, &q.mu);
        if (q.n == 0) { pthread_mutex_unlock(&q.mu); return NULL; }
        void *body = q.body[q.head], *ctl = q.ctl[q.head];
        int len = q.len[q.head];
        q.head = (q.head + 1) % q.cap;
        q.n--;
        pthread_mutex_unlock(&q.mu);

        uint64_t now = now_us(CLOCK_REALTIME), ts;
        Idemproxy__V1__Delivery *d = idemproxy__v1__delivery__unpack(NULL, (size_t)len, body);
        nn_freemsg(body);
        if (d == NULL) {
            fprintf(stderr, "bench_worker: an undecodable Delivery\n");
        } else {
            counted();
            if (d->attempt > 1) atomic_fetch_add(&redeliveries, 1);
            if (payload_ts(d->payload.data, d->payload.len, &ts) == 0 && ts > 0)
                hist_add(h, now > ts ? now - ts : 0);
            idemproxy__v1__delivery__free_unpacked(d, NULL);
        }
        struct nn_iovec iov = { (void *)ack, sizeof(ack) };
        struct nn_msghdr hdr = { &iov, 1, &ctl, NN_MSG };
        if (nn_sendmsg(conc_sock, &hdr, 0) < 0) {   /* on success nanomsg owns ctl */
            fprintf(stderr, "bench_worker: send: %s\n", nn_strerror(errno));
            nn_freemsg(ctl);
        }
        pthread_mutex_lock(&q.mu);
        q.busy--;
        pthread_cond_signal(&q.room);
        pthread_mutex_unlock(&q.mu);
    }
}

/* The receiving thread of --concurrency: a request is taken only for a free handler. */
static void *recv_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        pthread_mutex_lock(&q.mu);
        while (q.busy == q.cap && !atomic_load(&stop)) {
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 100 * 1000 * 1000;
            if (t.tv_nsec >= 1000000000L) { t.tv_sec++; t.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&q.room, &q.mu, &t);
        }
        pthread_mutex_unlock(&q.mu);
        if (atomic_load(&stop)) break;
        void *body = NULL, *ctl = NULL;
        struct nn_iovec iov = { &body, NN_MSG };
        struct nn_msghdr hdr = { &iov, 1, &ctl, NN_MSG };
        int n = nn_recvmsg(conc_sock, &hdr, 0);
        if (n < 0) {
            if (errno != ETIMEDOUT && errno != EAGAIN && errno != EINTR)
                fprintf(stderr, "bench_worker: recv: %s\n", nn_strerror(errno));
            continue;
        }
        pthread_mutex_lock(&q.mu);
        int at = (q.head + q.n) % q.cap;
        q.body[at] = body;
        q.ctl[at] = ctl;
        q.len[at] = n;
        q.n++;
        q.busy++;
        pthread_cond_signal(&q.work);
        pthread_mutex_unlock(&q.mu);
    }
    pthread_mutex_lock(&q.mu);
    pthread_cond_broadcast(&q.work);              /* handlers see 'stop' */
    pthread_mutex_unlock(&q.mu);
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
    int threads = 4, hold = 0, concurrency = 0;
    const char *progress = NULL;
    static const struct option opts[] = {
        { "endpoint", required_argument, NULL, 'e' }, { "threads", required_argument, NULL, 't' },
        { "expect", required_argument, NULL, 'x' },   { "hold", no_argument, NULL, 'H' },
        { "progress", required_argument, NULL, 'p' }, { "concurrency", required_argument, NULL, 'c' },
        { NULL, 0, NULL, 0 } };
    int o;
    while ((o = getopt_long(argc, argv, "e:t:x:Hp:c:", opts, NULL)) != -1) {
        switch (o) {
        case 'e': endpoint = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'x': expect = atol(optarg); break;
        case 'H': hold = 1; break;
        case 'p': progress = optarg; break;
        case 'c': concurrency = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: bench_worker --endpoint EP [--threads N | --concurrency K | --hold]"
                            " [--expect K] [--progress FILE]\n");
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (concurrency > 0) {                 /* one socket, K handlers and a receiving thread */
        hold = 0;
        threads = concurrency + 1;
        q.cap = concurrency;
        q.body = calloc((size_t)q.cap, sizeof(void *));
        q.ctl = calloc((size_t)q.cap, sizeof(void *));
        q.len = calloc((size_t)q.cap, sizeof(int));
        conc_sock = nn_socket(AF_SP_RAW, NN_REP);
        int to = 100;
        if (q.body == NULL || q.ctl == NULL || q.len == NULL || conc_sock < 0 ||
            nn_setsockopt(conc_sock, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof(to)) < 0 ||
            nn_connect(conc_sock, endpoint) < 0) {
            fprintf(stderr, "bench_worker: concurrency socket: %s\n", nn_strerror(errno));
            return 1;
        }
    }

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
        void *(*fn)(void *) = concurrency > 0 ? (i == 0 ? recv_thread : handler_thread)
                              : hold ? hold_thread : ack_thread;
        int rc = pthread_create(&tid[i], NULL, fn, &h[i]);
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
    if (conc_sock >= 0) nn_close(conc_sock);

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
