/*
 * test_sp.c - the app socket's SP side (proxy/sp.c) on a real libev loop and
 * real UNIX sockets, in the orders a whole daemon makes happen only by
 * chance: a send to a worker that answered and closed before the loop read
 * it, a loop that stalled past a peer's header deadline, accept out of
 * descriptors, replies split over many reads. And the frame limits of
 * spframe.c, which tests/fuzz/fuzz_spframe.c fuzzes.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <ev.h>

#include "sp.h"
#include "test.h"

static int replies;
static uint32_t last_id;
static size_t last_len;
static size_t lens[8];         /* each reply's length and the sum of its bytes, by id & 7 */
static unsigned long sums[8];

static void on_reply(void *arg, uint32_t id, const unsigned char *body, size_t n)
{
    (void)arg;
    replies++;
    last_id = id;
    last_len = lens[id & 7] = n;
    sums[id & 7] = 0;
    for (size_t i = 0; i < n; i++) sums[id & 7] += body[i];
}

static void on_room(void *arg)
{
    (void)arg;
}

static char path[108];

static px_sp *bind_here(struct ev_loop *loop, const char *name)
{
    char ep[128], err[128];
    snprintf(path, sizeof(path), "/tmp/px-test-sp-%d-%s.sock", (int)getpid(), name);
    unlink(path);
    snprintf(ep, sizeof(ep), "ipc://%s", path);
    return px_sp_bind(loop, ep, on_reply, on_room, NULL, err, sizeof(err));
}

static int dial(bool header)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    memcpy(un.sun_path, path, strlen(path) + 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&un, sizeof(un)) != 0) return -1;
    if (header && write(fd, "\0SP\0\0\x31\0\0", 8) != 8) return -1;
    return fd;
}

/* Turns of the loop for 's' seconds, without waiting in between. */
static void spin(struct ev_loop *loop, double s)
{
    ev_tstamp end = ev_time() + s;
    while (ev_time() < end) {
        ev_run(loop, EVRUN_NOWAIT);
        usleep(1000);
    }
}

/* A worker reads its delivery, answers, and closes at once; a send to it
 * comes before the loop reads the answer (EPIPE). The answer is handed on. */
static void test_answer_before_close(void)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    px_sp *sp = bind_here(loop, "close");
    int fd = dial(true);
    spin(loop, 0.05);
    test_cond("the worker is connected", px_sp_workers(sp) == 1);
    test_cond("a delivery is sent", px_sp_send(sp, 0x80000001u, "d1", 2) == 0);
    spin(loop, 0.02);
    unsigned char buf[64];
    ssize_t n = read(fd, buf, sizeof(buf));
    test_cond("the worker reads our header and the frame", n == 8 + 9 + 4 + 2);
    const unsigned char ack[] = { 1, 0, 0, 0, 0, 0, 0, 0, 7, 0x80, 0, 0, 1, 'A', 'C', 'K' };
    test_cond("the answer is written", write(fd, ack, sizeof(ack)) == (ssize_t)sizeof(ack));
    close(fd);
    usleep(20000);
    test_cond("a send to it finds it gone", px_sp_send(sp, 0x80000002u, "d2", 2) != 0);
    spin(loop, 0.05);
    test_cond("its answer, written before the close, is handed on", replies == 1 && last_id == 0x80000001u);
    test_cond("then the connection is closed", px_sp_workers(sp) == 0);
    px_sp_close(sp);
    ev_loop_destroy(loop);
}

/* The header came in time, but the loop stalled past its second: read, not
 * closed as a peer that sent none. */
static void test_header_after_a_stall(void)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    px_sp *sp = bind_here(loop, "stall");
    unsigned long long errors = px_sp_wire_errors;
    int fd = dial(false);
    ev_run(loop, EVRUN_NOWAIT); /* accepted: its second runs */
    test_cond("the header is written", write(fd, "\0SP\0\0\x31\0\0", 8) == 8);
    usleep(1100000); /* the loop is busy elsewhere */
    ev_run(loop, EVRUN_NOWAIT);
    test_cond("the worker is connected", px_sp_workers(sp) == 1);
    test_cond("no wire error counted", px_sp_wire_errors == errors);
    close(fd);
    px_sp_close(sp);
    ev_loop_destroy(loop);
}

/* An ipc frame: type 01, the length, the request id, the body. */
static size_t frame(unsigned char *out, uint32_t id, const unsigned char *body, size_t n)
{
    uint64_t size = n + 4;
    out[0] = 1;
    for (int i = 0; i < 8; i++) out[1 + i] = (unsigned char)(size >> (56 - 8 * i));
    for (int i = 0; i < 4; i++) out[9 + i] = (unsigned char)(id >> (24 - 8 * i));
    memcpy(out + 13, body, n);
    return 13 + n;
}

/* A worker that writes its header and replies a byte at a time: each reply is
 * handed on once its last byte is read, not before; then a reply larger
 * than a read (and than the socket's buffer), with a small one right behind
 * it in the same write, comes over many reads: both whole, in order. */
static void test_replies_split_over_reads(void)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    px_sp *sp = bind_here(loop, "split");
    unsigned long long errors = px_sp_wire_errors;
    int fd = dial(false);
    ev_run(loop, EVRUN_NOWAIT);
    unsigned char in[64];
    memcpy(in, "\0SP\0\0\x31\0\0", 8);
    size_t end1 = 8 + frame(in + 8, 0x80000001u, (const unsigned char *)"ok", 2);
    size_t end2 = end1 + frame(in + end1, 0x80000002u, (const unsigned char *)"", 0);
    replies = 0;
    bool in_time = true;
    for (size_t i = 0; i < end2; i++) {
        if (write(fd, in + i, 1) != 1) in_time = false;
        for (int t = 0; t < 3; t++) ev_run(loop, EVRUN_NOWAIT);
        int want = (i + 1 >= end1) + (i + 1 >= end2);
        if (replies != want || px_sp_workers(sp) != (i + 1 >= 8)) in_time = false;
    }
    test_cond("a reply a byte at a time is handed on at its last byte, once", in_time);
    test_cond("... whole", replies == 2 && last_id == 0x80000002u && last_len == 0);

    size_t big = 300 * 1000, total = 2 * 13 + big + 3;
    unsigned char *body = malloc(big), *out = malloc(total);
    unsigned long sum = 0;
    for (size_t i = 0; i < big; i++) sum += body[i] = (unsigned char)(i * 7);
    size_t len = frame(out, 0x80000003u, body, big);
    len += frame(out + len, 0x80000004u, (const unsigned char *)"end", 3);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    for (size_t off = 0; off < len;) {
        ssize_t n = write(fd, out + off, len - off);
        if (n < 0 && errno != EAGAIN) break; /* closed on us: the checks below say so */
        if (n > 0) off += (size_t)n;
        ev_run(loop, EVRUN_NOWAIT);
    }
    spin(loop, 0.05);
    test_cond("a reply over many reads is handed on whole", lens[3] == big && sums[3] == sum);
    test_cond("... and the one behind it", replies == 4 && last_id == 0x80000004u && last_len == 3);
    test_cond("no wire error counted, the worker still connected",
              px_sp_wire_errors == errors && px_sp_workers(sp) == 1);
    free(body);
    free(out);
    close(fd);
    px_sp_close(sp);
    ev_loop_destroy(loop);
}

/* The limits, on the bytes alone: the request id counts in the 1 MiB, and a
 * length over it, or another ipc type byte, is bad before the frame's bytes
 * come. */
static void test_frame_limits(void)
{
    unsigned char b[9] = { 1, 0, 0, 0, 0, 0, 0x10, 0, 0 }; /* ipc, 1 MiB */
    px_spf f;
    test_cond("a frame of 1 MiB waits for its bytes",
              px_spf_frame(b, 9, true, &f) == PX_SPF_MORE && f.need == 9 + PX_SP_RCVMAX);
    test_cond("... so does it on tcp", px_spf_frame(b + 1, 8, false, &f) == PX_SPF_MORE && f.need == 8 + PX_SP_RCVMAX);
    b[8] = 1;
    test_cond("a frame of 1 MiB + 1 is bad at once", px_spf_frame(b, 9, true, &f) == PX_SPF_BAD && f.why);
    b[6] = 0; /* 1 byte */
    b[0] = 2;
    test_cond("an ipc type byte 02 is bad", px_spf_frame(b, 9, true, &f) == PX_SPF_BAD && f.why);
    test_cond("... once its 9 bytes have come", px_spf_frame(b, 8, true, &f) == PX_SPF_MORE && f.need == 0);
}

static int turns;
static void count_cb(struct ev_loop *loop, ev_check *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    turns++;
}

/* Out of descriptors, accept waits 100 ms between tries, every time. */
static void test_accept_out_of_descriptors(void)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    px_sp *sp = bind_here(loop, "emfile");
    int fds[4];
    for (int i = 0; i < 4; i++) fds[i] = dial(true);
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    int top = dup(0); /* the lowest free descriptor: accept needs one more */
    close(top);
    low = old;
    low.rlim_cur = (rlim_t)top;
    test_cond("the limit is lowered", setrlimit(RLIMIT_NOFILE, &low) == 0);
    ev_check chk;
    ev_check_init(&chk, count_cb);
    ev_check_start(loop, &chk);
    turns = 0;
    ev_tstamp end = ev_time() + 0.45;
    while (ev_time() < end) ev_run(loop, EVRUN_ONCE);
    test_cond("the limit is restored", setrlimit(RLIMIT_NOFILE, &old) == 0);
    test_cond("a few tries, not a spin", turns > 0 && turns < 20);
    /* Under valgrind (tests/memcheck.sh), which keeps descriptors of its own
     * and virtualizes the limit, accept does not recover here: not checked. */
    const char *pre = getenv("LD_PRELOAD");
    if (pre == NULL || strstr(pre, "vgpreload") == NULL) {
        ev_tstamp until = ev_time() + 5.0;
        while (px_sp_workers(sp) < 4 && ev_time() < until) spin(loop, 0.05);
        test_cond("the workers connect once there are descriptors", px_sp_workers(sp) == 4);
    }
    ev_check_stop(loop, &chk);
    for (int i = 0; i < 4; i++) close(fds[i]);
    px_sp_close(sp);
    ev_loop_destroy(loop);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* a write to a connection the daemon closed fails, and says so */
    test_answer_before_close();
    test_header_after_a_stall();
    test_accept_out_of_descriptors();
    test_replies_split_over_reads();
    test_frame_limits();
    return test_report();
}
