/*
 * sp_transport.c - what the app socket costs idemproxy per delivery, with
 * nanomsg 1.1.5 (what the daemon links) and with NNG (what a move would
 * link), on the same work: the daemon's side of deliver.c, nothing else.
 *
 *   sp_transport nanomsg|nng|nng-threads [N] [WINDOW] [BYTES]
 *
 * The parent is the daemon: a raw REQ socket bound on ipc://, driven as
 * deliver.c drives it (non-blocking sends and receives, woken by the socket's
 * pollable receive/send descriptors), each request carrying its 32-bit
 * request id in the SP header, at most WINDOW unanswered. A forked child is
 * the worker: a cooked REP socket of the same library that answers each
 * request with 8 bytes. N requests of BYTES bytes (defaults 200000, 64, 200:
 * a small Delivery and its Ack). It prints one line: requests per second,
 * then CPU per request in microseconds, user + system of every thread, for
 * the daemon's side and the worker's.
 *
 * nng-threads is NNG without the polled descriptors (a receiving thread, see
 * nng_threads): how much of NNG's cost is that hand-off.
 *
 * The NNG side needs libnng-dev (Debian 12: NNG 1.5.2); built without it
 * (make -C bench sp_transport NNG=0), only nanomsg runs.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#ifndef WITH_NNG
#define WITH_NNG 1
#endif
#if WITH_NNG
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(const struct rusage *r)
{
    return (double)r->ru_utime.tv_sec + (double)r->ru_utime.tv_usec / 1e6 +
           (double)r->ru_stime.tv_sec + (double)r->ru_stime.tv_usec / 1e6;
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "sp_transport: %s: %s\n", what, err);
    exit(1);
}

/* Nothing moved: sleep on the receive descriptor, and on the send one when a
 * send was refused for room, as deliver.c's watchers do. Returns 1 when
 * nothing woke it within 100 ms (a lost wake-up: counted as a stall). */
static long stalls;
static int wait_for(int rfd, int sfd, bool blocked)
{
    struct pollfd p[2] = { { rfd, POLLIN, 0 }, { sfd, POLLIN, 0 } };
    return poll(p, blocked ? 2 : 1, 100) == 0;
}

/* --- nanomsg ------------------------------------------------------------ */

static void nn_worker(const char *url)
{
    int s = nn_socket(AF_SP, NN_REP);
    if (s < 0 || nn_connect(s, url) < 0) die("nanomsg worker", nn_strerror(nn_errno()));
    char ack[8] = "ACK-ok!";
    for (;;) {
        void *buf = NULL;
        int n = nn_recv(s, &buf, NN_MSG, 0);
        if (n < 0) break;
        nn_freemsg(buf);
        if (nn_send(s, ack, sizeof(ack), 0) < 0) break;
    }
    exit(0);
}

static void nn_daemon(const char *url, long n, int window, size_t bytes)
{
    int s = nn_socket(AF_SP_RAW, NN_REQ);
    if (s < 0 || nn_bind(s, url) < 0) die("nanomsg bind", nn_strerror(nn_errno()));
    int rfd, sfd;
    size_t sz = sizeof(int);
    nn_getsockopt(s, NN_SOL_SOCKET, NN_RCVFD, &rfd, &sz);
    nn_getsockopt(s, NN_SOL_SOCKET, NN_SNDFD, &sfd, &sz);
    while (nn_get_statistic(s, NN_STAT_CURRENT_CONNECTIONS) < 1) usleep(1000);
    char *body = calloc(1, bytes);
    long sent = 0, got = 0;
    uint32_t id = 0;
    bool blocked = false; /* the last send said EAGAIN */
    while (got < n) {
        long before = sent + got;
        while (sent < n && sent - got < window) {
            unsigned char ctrl[NN_CMSG_SPACE(sizeof(size_t) + 4)];
            memset(ctrl, 0, sizeof(ctrl));
            struct nn_cmsghdr *c = (struct nn_cmsghdr *)ctrl;
            c->cmsg_len = NN_CMSG_LEN(sizeof(size_t) + 4);
            c->cmsg_level = PROTO_SP;
            c->cmsg_type = SP_HDR;
            unsigned char *d = NN_CMSG_DATA(c);
            size_t hlen = 4;
            memcpy(d, &hlen, sizeof(hlen));
            uint32_t rid = 0x80000000u | (++id & 0x7fffffffu);
            for (int i = 0; i < 4; i++) d[sizeof(size_t) + i] = (unsigned char)(rid >> (24 - 8 * i));
            struct nn_iovec iov = { body, bytes };
            struct nn_msghdr h = { &iov, 1, ctrl, sizeof(ctrl) };
            if (nn_sendmsg(s, &h, NN_DONTWAIT) < 0) {
                blocked = nn_errno() == EAGAIN;
                if (blocked) break;
                die("nanomsg send", nn_strerror(nn_errno()));
            }
            sent++;
            blocked = false;
        }
        for (;;) {
            void *buf = NULL;
            unsigned char ctrl[256];
            struct nn_iovec iov = { &buf, NN_MSG };
            struct nn_msghdr h = { &iov, 1, ctrl, sizeof(ctrl) };
            if (nn_recvmsg(s, &h, NN_DONTWAIT) < 0) {
                if (nn_errno() == EAGAIN) break;
                die("nanomsg receive", nn_strerror(nn_errno()));
            }
            nn_freemsg(buf);
            got++;
        }
        if (sent + got == before) stalls += wait_for(rfd, sfd, blocked);
    }
    free(body);
    nn_close(s);
}

/* --- NNG ---------------------------------------------------------------- */

#if WITH_NNG
static void nng_worker(const char *url)
{
    nng_socket s;
    int rv;
    if ((rv = nng_rep0_open(&s)) != 0 || (rv = nng_dial(s, url, NULL, 0)) != 0)
        die("nng worker", nng_strerror(rv));
    for (;;) {
        nng_msg *m;
        if (nng_recvmsg(s, &m, 0) != 0) break;
        nng_msg_clear(m); /* the header (the backtrace) stays: it routes the reply */
        nng_msg_append(m, "ACK-ok!", 8);
        if (nng_sendmsg(s, m, 0) != 0) break;
    }
    exit(0);
}

static int nng_fd(nng_socket s, const char *opt)
{
    int fd = -1;
    int rv = nng_socket_get_int(s, opt, &fd);
    if (rv != 0) die(opt, nng_strerror(rv));
    return fd;
}

static volatile int nng_pipes;
static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    (void)arg;
    __atomic_add_fetch(&nng_pipes, ev == NNG_PIPE_EV_ADD_POST ? 1 : -1, __ATOMIC_SEQ_CST);
}

static void nng_daemon(const char *url, long n, int window, size_t bytes)
{
    nng_socket s;
    int rv;
    if ((rv = nng_req0_open_raw(&s)) != 0) die("nng req0 raw", nng_strerror(rv));
    /* Queues of messages, as nanomsg's buffers of bytes: without them (NNG's
     * default is 0 for a send) every send waits for a pipe to take it. */
    nng_socket_set_int(s, NNG_OPT_SENDBUF, 1024);
    nng_socket_set_int(s, NNG_OPT_RECVBUF, 1024);
    /* the worker count deliver.c reads from NN_STAT_CURRENT_CONNECTIONS */
    nng_pipe_notify(s, NNG_PIPE_EV_ADD_POST, pipe_cb, NULL);
    nng_pipe_notify(s, NNG_PIPE_EV_REM_POST, pipe_cb, NULL);
    if ((rv = nng_listen(s, url, NULL, 0)) != 0) die("nng listen", nng_strerror(rv));
    int rfd = nng_fd(s, NNG_OPT_RECVFD), sfd = nng_fd(s, NNG_OPT_SENDFD);
    while (__atomic_load_n(&nng_pipes, __ATOMIC_SEQ_CST) < 1) usleep(1000);
    char *body = calloc(1, bytes);
    long sent = 0, got = 0;
    uint32_t id = 0;
    bool blocked = false; /* the last send said EAGAIN */
    while (got < n) {
        long before = sent + got;
        while (sent < n && sent - got < window) {
            nng_msg *m;
            nng_msg_alloc(&m, 0);
            nng_msg_header_append_u32(m, 0x80000000u | (++id & 0x7fffffffu));
            nng_msg_append(m, body, bytes);
            if ((rv = nng_sendmsg(s, m, NNG_FLAG_NONBLOCK)) != 0) {
                nng_msg_free(m);
                blocked = rv == NNG_EAGAIN;
                if (blocked) break;
                die("nng send", nng_strerror(rv));
            }
            sent++;
            blocked = false;
        }
        for (;;) {
            nng_msg *m;
            if ((rv = nng_recvmsg(s, &m, NNG_FLAG_NONBLOCK)) != 0) {
                if (rv == NNG_EAGAIN) break;
                die("nng receive", nng_strerror(rv));
            }
            nng_msg_free(m);
            got++;
        }
        if (sent + got == before) stalls += wait_for(rfd, sfd, blocked);
    }
    free(body);
    nng_close(s);
}

/* The same with no descriptors polled: blocking sends here, blocking
 * receives on a thread, the window a semaphore. What NNG costs without the
 * RECVFD/SENDFD hand-off an event loop needs (a daemon on NNG could instead
 * take nng_aio callbacks on NNG's threads and hand them over with ev_async). */
#include <pthread.h>
#include <semaphore.h>
static sem_t room;
static nng_socket th_sock;
static long th_n;
static void *th_recv(void *arg)
{
    (void)arg;
    for (long got = 0; got < th_n; got++) {
        nng_msg *m;
        int rv = nng_recvmsg(th_sock, &m, 0);
        if (rv != 0) die("nng receive", nng_strerror(rv));
        nng_msg_free(m);
        sem_post(&room);
    }
    return NULL;
}

static void nng_threads(const char *url, long n, int window, size_t bytes)
{
    int rv;
    if ((rv = nng_req0_open_raw(&th_sock)) != 0) die("nng req0 raw", nng_strerror(rv));
    nng_socket_set_int(th_sock, NNG_OPT_SENDBUF, 1024);
    nng_socket_set_int(th_sock, NNG_OPT_RECVBUF, 1024);
    nng_pipe_notify(th_sock, NNG_PIPE_EV_ADD_POST, pipe_cb, NULL);
    nng_pipe_notify(th_sock, NNG_PIPE_EV_REM_POST, pipe_cb, NULL);
    if ((rv = nng_listen(th_sock, url, NULL, 0)) != 0) die("nng listen", nng_strerror(rv));
    while (__atomic_load_n(&nng_pipes, __ATOMIC_SEQ_CST) < 1) usleep(1000);
    sem_init(&room, 0, (unsigned)window);
    th_n = n;
    pthread_t t;
    pthread_create(&t, NULL, th_recv, NULL);
    char *body = calloc(1, bytes);
    for (long i = 0; i < n; i++) {
        sem_wait(&room);
        nng_msg *m;
        nng_msg_alloc(&m, 0);
        nng_msg_header_append_u32(m, 0x80000000u | ((uint32_t)i & 0x7fffffffu));
        nng_msg_append(m, body, bytes);
        if ((rv = nng_sendmsg(th_sock, m, 0)) != 0) die("nng send", nng_strerror(rv));
    }
    pthread_join(t, NULL);
    free(body);
    nng_close(th_sock);
}
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sp_transport nanomsg|nng|nng-threads [N] [WINDOW] [BYTES]\n");
        return 2;
    }
    bool threads = strcmp(argv[1], "nng-threads") == 0;
    bool nng = threads || strcmp(argv[1], "nng") == 0;
    if (!nng && strcmp(argv[1], "nanomsg") != 0) return 2;
#if !WITH_NNG
    if (nng) die("nng", "built without libnng-dev");
#endif
    long n = argc > 2 ? atol(argv[2]) : 200000;
    int window = argc > 3 ? atoi(argv[3]) : 64;
    size_t bytes = argc > 4 ? (size_t)atol(argv[4]) : 200;
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/sp_transport.%d.sock", (int)getpid());

    pid_t child = fork();
    if (child == 0) {
        usleep(100000); /* the daemon binds first, as in a pod */
#if WITH_NNG
        if (nng) nng_worker(url);
#endif
        nn_worker(url);
    }
    double t0 = now_s();
    struct rusage r0, r1, rc;
    getrusage(RUSAGE_SELF, &r0);
    double start = 0;
#if WITH_NNG
    if (nng) {
        start = now_s();
        if (threads) nng_threads(url, n, window, bytes);
        else nng_daemon(url, n, window, bytes);
    }
#endif
    if (!nng) {
        start = now_s();
        nn_daemon(url, n, window, bytes);
    }
    double wall = now_s() - start;
    getrusage(RUSAGE_SELF, &r1);
    kill(child, SIGKILL);
    int status;
    wait4(child, &status, 0, &rc);
    unlink(url + 6);
    (void)t0;
    printf("%-11s N %ld window %d bytes %zu: %.0f req/s, daemon %.2f us CPU/req, worker %.2f us "
           "CPU/req, wall %.2f s, stalls %ld\n",
           argv[1], n, window, bytes, (double)n / wall, (cpu_s(&r1) - cpu_s(&r0)) * 1e6 / (double)n,
           cpu_s(&rc) * 1e6 / (double)n, wall, stalls);
    return 0;
}
