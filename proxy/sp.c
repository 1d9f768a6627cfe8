/*
 * sp.c - the app socket's wire on the daemon's loop (docs/protocol.md).
 *
 * What a raw NN_REQ socket of nanomsg 1.1.5 did for deliver.c, and nothing
 * more: listen on ipc:// or tcp://, take each connection through SP's
 * 8-byte header (ours says REQ, 0x30; the peer's must say REP, 0x31), then
 * send each request to the next connection in turn whose last write went out
 * whole, as one frame (ipc: a type byte 01; both: a 64-bit big-endian length,
 * the 4-byte request id, the body), and hand each reply frame back with the
 * request id cut from its front. What the peer's bytes hold (its header, a
 * frame, not yet, or a broken wire) is read by spframe.c, without I/O.
 *
 * Why not nanomsg: its I/O runs in a thread of its own. Each answer woke that
 * thread twice (the answer, and re-arming for the next) and the loop once
 * through an eventfd, with a contended mutex between them each time: at
 * 1,000 entries/s a third of the daemon's CPU (docs/performance.md). Here a
 * reply wakes the loop once, and one read takes every reply that has come.
 * Workers see the same wire: their nanomsg, NNG or hand-written SP sockets
 * are unchanged.
 *
 * Reads are watched in an epoll set of our own, itself watched by the loop,
 * so a connection can leave the watch at once (libev stops watching a
 * descriptor only after one more wake-up). That is the hold: while the
 * reader's batch window is out (px_sp_hold), a connection sent a request
 * leaves the set, and its worker's answer waits in the socket for the
 * window's end, which wakes the loop anyway (px_sp_unhold reads it then).
 * At 1,000 entries/s that is one wake-up fewer per page, about half of them
 * (docs/performance.md). Whatever needs an answer sooner reads them first:
 * an ack timer, a delivery waiting for room (deliver.c).
 *
 * A peer that breaks the wire loses its connection and nothing else: a
 * header that is not SP's or not from a REP peer, one not complete within
 * PX_SP_HANDSHAKE_S, an ipc frame whose type byte is not 01 (nanomsg aborted
 * the whole process on that one), a frame over PX_SP_RCVMAX. A reply under 4
 * bytes is dropped, as nanomsg did. A connection closed with deliveries on it
 * leaves them to their ack timeouts, as before.
 */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "addr.h"
#include "log.h"
#include "px.h"
#include "sp.h"
#include "spframe.h"

#define PX_SP_HANDSHAKE_S 1.0          /* nanomsg's own limit for the header */
#define PX_SP_BUF         (128 * 1024) /* SO_SNDBUF and SO_RCVBUF, nanomsg's defaults */
#define PX_SP_READ        (64 * 1024)  /* bytes asked of each read */
#define PX_SP_READS       16           /* reads per wake-up, so one peer cannot hold the loop */
#define PX_SP_ACCEPT_WAIT 0.1          /* out of descriptors: try again after this */
#define PX_SP_EVENTS      64           /* connections read per wake-up of the epoll set */

unsigned long long px_sp_wire_errors;

static const unsigned char sp_req_header[8] = { 0x00, 'S', 'P', 0x00, 0x00, 0x30, 0x00, 0x00 };

typedef struct sp_pipe {
    struct sp_pipe *prev, *next; /* every connection, in turn order */
    px_sp *sp;
    int fd;
    ev_io ww;          /* reads are watched in sp->efd (see px_sp_hold) */
    ev_timer hs_timer; /* the header's deadline */
    bool open;         /* header done: it takes requests */
    bool dead;         /* closed; freed once no callback is on its stack */
    bool gone;         /* a send found the worker gone: nothing more is sent; read to its end */
    bool held;         /* out of sp->efd: its replies wait for px_sp_read_held */
    int busy;          /* callbacks of this pipe on the stack */
    px_buf in;         /* bytes read, not yet a whole frame */
    size_t in_off;     /* consumed from the front of 'in' */
    px_buf out;        /* bytes that did not go out at once */
    size_t out_off;
} sp_pipe;

struct px_sp {
    struct ev_loop *loop;
    int lfd;
    bool ipc;
    char *path; /* ipc: the socket file */
    dev_t dev;  /* ... and its identity, to remove only our own */
    ino_t ino;
    ev_io accept_w;
    ev_timer accept_wait;
    int efd; /* an epoll set of the connections' reads, itself watched by 'ew' */
    ev_io ew;
    int holds;            /* px_sp_hold minus px_sp_unhold */
    ev_prepare rearm;     /* the holds are over: held connections back in the epoll set */
    int held;             /* connections out of efd */
    sp_pipe *head, *turn; /* the next to be sent to */
    int workers;
    px_sp_reply_cb on_reply;
    px_sp_room_cb on_room;
    void *arg;
};

static void pipe_free(sp_pipe *p)
{
    px_buf_deinit(&p->in);
    px_buf_deinit(&p->out);
    free(p);
}

/* Around a call that may close 'p' (a callback of its, a send): while it is
 * held, pipe_close leaves it allocated for the caller to look at... */
static void pipe_hold(sp_pipe *p)
{
    p->busy++;
}

/* ... and the last release frees it if it was closed meanwhile. */
static void pipe_release(sp_pipe *p)
{
    if (--p->busy == 0 && p->dead) pipe_free(p);
}

static void pipe_close(sp_pipe *p, const char *why)
{
    if (p->dead) return;
    px_sp *sp = p->sp;
    p->dead = true;
    if (p->held) {
        p->held = false;
        sp->held--;
    } else {
        epoll_ctl(sp->efd, EPOLL_CTL_DEL, p->fd, NULL);
    }
    ev_io_stop(sp->loop, &p->ww);
    ev_timer_stop(sp->loop, &p->hs_timer);
    close(p->fd);
    if (p->open) sp->workers--;
    if (p->next == p) {
        sp->head = sp->turn = NULL;
    } else { /* out of the ring; its own next stays, for a walk that is on it */
        p->prev->next = p->next;
        p->next->prev = p->prev;
        if (sp->head == p) sp->head = p->next;
        if (sp->turn == p) sp->turn = p->next;
    }
    if (why) px_log_debug("app socket: a worker's connection closed: %s", why);
    if (p->busy == 0) pipe_free(p);
}

/* A write found the worker gone (it closed, or reset): nothing more is sent
 * on it, and it is closed only once what it sent before is read (the read
 * watcher sees the end), so an answer written just before a close is not
 * lost to a delivery that tried to follow it. Other errors close at once. */
static void pipe_gone(sp_pipe *p, int err)
{
    if (err != EPIPE && err != ECONNRESET) {
        pipe_close(p, strerror(err));
        return;
    }
    p->gone = true;
    ev_io_stop(p->sp->loop, &p->ww);
    px_log_debug("app socket: a worker's connection went away while writing to it: %s", strerror(err));
}

/* A peer broke the wire: its connection is closed, and that is all. */
static void pipe_broken(sp_pipe *p, const char *why)
{
    px_sp_wire_errors++;
    static px_log_limit limit; /* a peer that breaks it in a loop does not fill the log */
    px_log_limited(&limit, 1.0, PX_LOG_WARN, "app socket: closed a worker's connection: %s", why);
    pipe_close(p, NULL);
}

/* Write what waits in p->out; false if the connection broke. */
static bool pipe_flush(sp_pipe *p)
{
    while (p->out_off < p->out.len) {
        ssize_t n = send(p->fd, p->out.data + p->out_off, p->out.len - p->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ev_io_start(p->sp->loop, &p->ww);
            return true;
        }
        if (n <= 0) {
            pipe_gone(p, n < 0 ? errno : EPIPE);
            return false;
        }
        p->out_off += (size_t)n;
    }
    ev_io_stop(p->sp->loop, &p->ww);
    px_buf_reset(&p->out);
    p->out_off = 0;
    if (p->out.cap > PX_SP_BUF) px_buf_deinit(&p->out); /* a large Delivery is not kept */
    return true;
}

static void pipe_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    sp_pipe *p = w->data;
    px_sp *sp = p->sp;
    if (pipe_flush(p) && p->open && p->out_off == p->out.len && sp->on_room) sp->on_room(sp->arg);
}

/* The frames whole in p->in, handed on; false if the connection is closed. */
static bool pipe_frames(sp_pipe *p)
{
    px_sp *sp = p->sp;
    for (;;) {
        const unsigned char *b = (const unsigned char *)p->in.data + p->in_off;
        size_t have = p->in.len - p->in_off;
        px_spf f;
        px_spf_status st = p->open ? px_spf_frame(b, have, sp->ipc, &f) : px_spf_header(b, have, &f);
        if (st == PX_SPF_BAD) {
            pipe_broken(p, f.why);
            return false;
        }
        if (st == PX_SPF_MORE) {
            if (f.need) px_buf_reserve(&p->in, f.need - have); /* room for the rest of its frame */
            return true;
        }
        p->in_off += f.used;
        if (!p->open) {
            p->open = true;
            ev_timer_stop(sp->loop, &p->hs_timer);
            sp->workers++;
            px_log_debug("app socket: a worker connected (%d)", sp->workers);
            if (p->out_off == p->out.len && sp->on_room) sp->on_room(sp->arg);
            if (p->dead) return false;
            continue;
        }
        if (f.len >= 4) {
            const unsigned char *r = b + f.off;
            uint32_t id = (uint32_t)r[0] << 24 | (uint32_t)r[1] << 16 | (uint32_t)r[2] << 8 | r[3];
            sp->on_reply(sp->arg, id, r + 4, f.len - 4);
            if (p->dead) return false;
        }
    }
}

/* Read what the peer sent and hand on its frames (p held by the caller). */
static void pipe_read(sp_pipe *p)
{
    for (int i = 0; i < PX_SP_READS && !p->dead; i++) {
        if (p->in_off == p->in.len) {
            px_buf_reset(&p->in);
            p->in_off = 0;
            if (p->in.cap > 2 * PX_SP_READ) px_buf_deinit(&p->in); /* a large reply is not kept */
        } else if (p->in_off > 0 && p->in_off >= p->in.len / 2) {
            memmove(p->in.data, p->in.data + p->in_off, p->in.len - p->in_off);
            p->in.len -= p->in_off;
            p->in_off = 0;
        }
        px_buf_reserve(&p->in, PX_SP_READ);
        size_t room = p->in.cap - p->in.len - 1;
        ssize_t n = recv(p->fd, p->in.data + p->in.len, room, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {
            pipe_close(p, n == 0 ? "closed by the worker" : strerror(errno));
            break;
        }
        p->in.len += (size_t)n;
        if (!pipe_frames(p) || (size_t)n < room) break;
    }
}

/* Read each connection of 'b' (each held by pipe_hold: a reply handed on may
 * close any of them, send on them, or end a hold, which reads again). */
static void read_batch(sp_pipe **b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!b[i]->dead) pipe_read(b[i]);
    for (size_t i = 0; i < n; i++) pipe_release(b[i]);
}

/* The connections' epoll set is readable: read the ones it names. */
static void efd_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    px_sp *sp = w->data;
    struct epoll_event ev[PX_SP_EVENTS];
    sp_pipe *b[PX_SP_EVENTS];
    int n = epoll_wait(sp->efd, ev, PX_SP_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        b[i] = ev[i].data.ptr;
        pipe_hold(b[i]);
    }
    if (n > 0) read_batch(b, (size_t)n);
}

/* Take 'p' out of the epoll set while the hold lasts: what its worker answers
 * waits in the socket, without waking the loop, for px_sp_read_held. */
static void pipe_hold_replies(sp_pipe *p)
{
    px_sp *sp = p->sp;
    if (p->held || p->dead || p->gone || epoll_ctl(sp->efd, EPOLL_CTL_DEL, p->fd, NULL) != 0) return;
    p->held = true;
    sp->held++;
}

void px_sp_hold(px_sp *sp)
{
    if (sp) sp->holds++;
}

/* A hold ended: read what the held connections hold now. They stay out of
 * the epoll set until the loop is about to sleep ('rearm'): by then the
 * reader has mostly opened its next window, and they stay held, with no
 * epoll_ctl at all while windows follow one another. Read only, they are
 * not polled: an answer that is not there yet is read at the next end. */
void px_sp_unhold(px_sp *sp)
{
    if (sp == NULL) return;
    if (sp->holds > 0) sp->holds--;
    px_sp_read_held(sp);
}

int px_sp_held(const px_sp *sp)
{
    return sp ? sp->held : 0;
}

/* The held connections: into 'out' (each held by pipe_hold) and still out
 * of the epoll set, or (out NULL) back in it. */
static size_t take_held(px_sp *sp, sp_pipe **out)
{
    size_t n = 0;
    int left = sp->held;
    sp_pipe *p = sp->head;
    while (left > 0) {
        sp_pipe *next = p->next;
        if (p->held) {
            left--;
            if (out) {
                pipe_hold(p);
                out[n++] = p;
            } else {
                struct epoll_event ev = { .events = EPOLLIN, .data.ptr = p };
                p->held = false;
                sp->held--;
                if (epoll_ctl(sp->efd, EPOLL_CTL_ADD, p->fd, &ev) != 0)
                    pipe_close(p, strerror(errno)); /* (ENOMEM): it could never be read again */
            }
        }
        p = next;
    }
    return n;
}

void px_sp_read_held(px_sp *sp)
{
    if (sp == NULL || sp->held == 0) return;
    sp_pipe *local[PX_SP_EVENTS];
    sp_pipe **b = sp->held <= PX_SP_EVENTS ? local : px_malloc(sizeof(*b) * (size_t)sp->held);
    read_batch(b, take_held(sp, b));
    if (b != local) free(b);
}

void px_sp_release_held(px_sp *sp)
{
    if (sp == NULL || sp->held == 0) return;
    px_sp_read_held(sp);
    take_held(sp, NULL);
}

/* Each time the loop is about to sleep, after link.c's writes (whose failure
 * may end a hold): connections still held with no hold on go back in the
 * epoll set, and what came since is read at once. */
static void rearm_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)loop;
    (void)revents;
    px_sp *sp = w->data;
    if (sp->holds == 0 && sp->held > 0) take_held(sp, NULL);
}

/* The header's second is up. A loop that stalled that long may not have read
 * a header that came in time (libev runs this before the read): read first. */
static void pipe_hs_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    sp_pipe *p = w->data;
    pipe_hold(p);
    pipe_read(p);
    if (!p->dead && !p->open) pipe_broken(p, "no SP header within a second");
    pipe_release(p);
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    px_sp *sp = w->data;
    for (;;) {
        int fd = accept4(sp->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            /* Out of descriptors (or memory): the pending ones wait, not spin. */
            static px_log_limit limit;
            px_log_limited(&limit, 10.0, PX_LOG_WARN, "app socket: accept: %s; trying again in %.0f ms",
                           strerror(errno), PX_SP_ACCEPT_WAIT * 1000);
            ev_io_stop(loop, &sp->accept_w);
            ev_timer_set(&sp->accept_wait, PX_SP_ACCEPT_WAIT, 0.);
            ev_timer_start(loop, &sp->accept_wait);
            return;
        }
        int buf = PX_SP_BUF, one = 1;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
        if (!sp->ipc) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        sp_pipe *p = px_calloc(1, sizeof(*p));
        p->sp = sp;
        p->fd = fd;
        ev_io_init(&p->ww, pipe_write_cb, fd, EV_WRITE);
        ev_timer_init(&p->hs_timer, pipe_hs_cb, PX_SP_HANDSHAKE_S, 0.);
        p->ww.data = p->hs_timer.data = p;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = p };
        if (epoll_ctl(sp->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            px_log_warn("app socket: a worker's connection refused: epoll_ctl: %s", strerror(errno));
            close(fd);
            free(p);
            continue;
        }
        if (sp->head == NULL) {
            sp->head = p->prev = p->next = p;
        } else { /* last in turn */
            p->next = sp->head;
            p->prev = sp->head->prev;
            p->prev->next = p;
            sp->head->prev = p;
        }
        ev_timer_start(loop, &p->hs_timer);
        px_buf_append(&p->out, sp_req_header, sizeof(sp_req_header));
        pipe_flush(p);
    }
}

static void accept_wait_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    px_sp *sp = w->data;
    ev_io_start(loop, &sp->accept_w);
}

/* Frame and send on 'p' (open, nothing waiting): 0, or -1 if it broke. */
static int pipe_send(sp_pipe *p, uint32_t id, const void *body, size_t len)
{
    unsigned char head[13];
    size_t hl = 0;
    if (p->sp->ipc) head[hl++] = 0x01;
    uint64_t size = (uint64_t)len + 4;
    for (int i = 7; i >= 0; i--) head[hl++] = (unsigned char)(size >> (8 * i));
    head[hl++] = (unsigned char)(id >> 24);
    head[hl++] = (unsigned char)(id >> 16);
    head[hl++] = (unsigned char)(id >> 8);
    head[hl++] = (unsigned char)id;
    struct iovec iov[2] = { { head, hl }, { (void *)body, len } };
    struct msghdr msg = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };
    size_t total = hl + len, done = 0;
    for (;;) {
        ssize_t n = sendmsg(p->fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            pipe_gone(p, errno);
            return -1;
        }
        done = n > 0 ? (size_t)n : 0;
        break;
    }
    if (done < total) { /* the rest goes out when it can; no more for p until then */
        if (done < hl) {
            px_buf_append(&p->out, head + done, hl - done);
            px_buf_append(&p->out, body, len);
        } else {
            px_buf_append(&p->out, (const char *)body + (done - hl), total - done);
        }
        ev_io_start(p->sp->loop, &p->ww);
    }
    return 0;
}

int px_sp_send(px_sp *sp, uint32_t id, const void *body, size_t len)
{
    sp_pipe *first = sp->turn ? sp->turn : sp->head;
    if (first == NULL) return -1;
    sp_pipe *p = first;
    for (;;) {
        sp_pipe *next = p->next;
        bool last = next == first;
        if (p->open && !p->gone && p->out_off == p->out.len) {
            pipe_hold(p);
            int rc = pipe_send(p, id, body, len);
            bool closed = p->dead;
            if (rc == 0 && sp->holds > 0) pipe_hold_replies(p);
            pipe_release(p);
            if (rc == 0) {
                sp->turn = next != p && sp->head ? next : sp->head;
                return 0;
            }
            if (sp->head == NULL) return -1;
            if (closed && p == first) { /* the walk started on it: start again where it was */
                first = next;
                p = next;
                continue;
            }
        }
        if (last) return -1;
        p = next;
    }
}

int px_sp_workers(const px_sp *sp)
{
    return sp ? sp->workers : 0;
}

/* Where to listen: "*" (every IPv4 address, as nanomsg took it), a literal
 * address, an interface's name (its IPv4 address), else a name to resolve
 * ("localhost"), IPv4 first, as workers that dial it try it first. */
static bool resolve(const char *host, const char *port, int flags, struct sockaddr_storage *ss, socklen_t *sl)
{
    struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICSERV | flags, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL) return false;
    struct addrinfo *a = res;
    while (a->ai_next && a->ai_family != AF_INET) a = a->ai_next;
    if (a->ai_family != AF_INET) a = res;
    memcpy(ss, a->ai_addr, a->ai_addrlen);
    *sl = a->ai_addrlen;
    freeaddrinfo(res);
    return true;
}

static bool tcp_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *sl)
{
    memset(ss, 0, sizeof(*ss));
    if (strcmp(host, "*") == 0 || host[0] == '\0') {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        in->sin_addr.s_addr = htonl(INADDR_ANY);
        *sl = sizeof(*in);
        return true;
    }
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", port);
    if (resolve(host, ps, AI_NUMERICHOST, ss, sl)) return true;
    struct ifaddrs *ifs = NULL;
    bool found = false;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || strcmp(i->ifa_name, host) != 0)
                continue;
            struct sockaddr_in *in = (struct sockaddr_in *)ss;
            memcpy(in, i->ifa_addr, sizeof(*in));
            in->sin_port = htons((uint16_t)port);
            *sl = sizeof(*in);
            found = true;
        }
        freeifaddrs(ifs);
    }
    return found || resolve(host, ps, 0, ss, sl);
}

/* An ipc path taken by a socket file nobody listens on (a daemon that
 * died) is taken over; one somebody listens on is not. */
static bool ipc_stale(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    memcpy(un.sun_path, path, strlen(path) + 1);
    bool stale = connect(fd, (struct sockaddr *)&un, sizeof(un)) != 0 && errno == ECONNREFUSED;
    close(fd);
    return stale;
}

px_sp *px_sp_bind(struct ev_loop *loop, const char *endpoint, px_sp_reply_cb on_reply,
                  px_sp_room_cb on_room, void *arg, char *err, size_t errlen)
{
    px_sp *sp = px_calloc(1, sizeof(*sp));
    sp->loop = loop;
    sp->on_reply = on_reply;
    sp->on_room = on_room;
    sp->arg = arg;
    sp->lfd = sp->efd = -1;
    int e = 0;
    if (strncmp(endpoint, "ipc://", 6) == 0) {
        const char *path = endpoint + 6;
        struct sockaddr_un un = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof(un.sun_path)) {
            e = ENAMETOOLONG;
            goto fail;
        }
        memcpy(un.sun_path, path, strlen(path) + 1);
        sp->ipc = true;
        sp->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (sp->lfd < 0) goto fail_errno;
        if (ipc_stale(path)) unlink(path);
        if (bind(sp->lfd, (struct sockaddr *)&un, sizeof(un)) != 0) goto fail_errno;
        struct stat st;
        if (stat(path, &st) == 0) {
            sp->dev = st.st_dev;
            sp->ino = st.st_ino;
        }
        sp->path = px_strdup(path);
    } else if (strncmp(endpoint, "tcp://", 6) == 0) {
        char host[PX_ADDR_HOST_MAX];
        int port;
        struct sockaddr_storage ss;
        socklen_t sl;
        if (!px_addr_split(endpoint + 6, host, sizeof(host), &port, PX_ADDR_BARE_IPV6)) {
            e = EINVAL;
            goto fail;
        }
        if (!tcp_addr(host, port, &ss, &sl)) {
            e = ENODEV;
            goto fail;
        }
        sp->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (sp->lfd < 0) goto fail_errno;
        int one = 1;
        setsockopt(sp->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(sp->lfd, (struct sockaddr *)&ss, sl) != 0) goto fail_errno;
    } else {
        e = EPROTONOSUPPORT;
        goto fail;
    }
    if (listen(sp->lfd, SOMAXCONN) != 0) goto fail_errno;
    sp->efd = epoll_create1(EPOLL_CLOEXEC);
    if (sp->efd < 0) goto fail_errno;
    ev_io_init(&sp->ew, efd_cb, sp->efd, EV_READ);
    sp->ew.data = sp;
    ev_io_start(loop, &sp->ew);
    ev_prepare_init(&sp->rearm, rearm_cb);
    ev_set_priority(&sp->rearm, EV_MINPRI); /* after link.c's flush_prepare_cb */
    sp->rearm.data = sp;
    ev_prepare_start(loop, &sp->rearm);
    ev_io_init(&sp->accept_w, accept_cb, sp->lfd, EV_READ);
    sp->accept_w.data = sp;
    ev_timer_init(&sp->accept_wait, accept_wait_cb, PX_SP_ACCEPT_WAIT, 0.);
    sp->accept_wait.data = sp;
    ev_io_start(loop, &sp->accept_w);
    return sp;
fail_errno:
    e = errno;
fail:
    snprintf(err, errlen, "%s", strerror(e));
    if (sp->lfd >= 0) close(sp->lfd);
    free(sp->path);
    free(sp);
    errno = e;
    return NULL;
}

void px_sp_close(px_sp *sp)
{
    if (sp == NULL) return;
    while (sp->head) pipe_close(sp->head, NULL);
    ev_io_stop(sp->loop, &sp->accept_w);
    ev_timer_stop(sp->loop, &sp->accept_wait);
    ev_io_stop(sp->loop, &sp->ew);
    ev_prepare_stop(sp->loop, &sp->rearm);
    close(sp->efd);
    close(sp->lfd);
    struct stat st;
    if (sp->path && stat(sp->path, &st) == 0 && st.st_dev == sp->dev && st.st_ino == sp->ino) unlink(sp->path);
    free(sp->path);
    free(sp);
}
