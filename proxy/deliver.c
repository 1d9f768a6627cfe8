/*
 * deliver.c - the app socket (docs/protocol.md): the requesting side of SP's
 * request/reply bound on app.endpoint (sp.c), so any number of deliveries are
 * in flight. Workers connect REP sockets (nanomsg's, NNG's, their own).
 *
 * The request id is ours: it travels in the SP header in front of each
 * Delivery and comes back in front of its reply. Our id is a slot in a table of
 * deliveries plus a generation, so a late reply to an earlier delivery of the
 * same slot is recognised and ignored:
 *
 *   bit 31 set (SP's "last hop" mark) | generation | slot (just enough bits
 *   for max_inflight, at most 20: config.c refuses more)
 *
 * The generation is the slot's delivery count put through a keyed permutation
 * of its bits (gen_of: an alternating Feistel network, key drawn at start), so
 * it does not repeat before the count wraps, and yet a peer on the socket
 * cannot compute the id of a delivery sent to another worker from the ids it
 * was sent itself, as it could from a plain counter: a forged answer must guess
 * the generation, 1 in 2^(31 - slot bits). Peers are trusted within the pod
 * (SECURITY.md): this stops counting, not a peer that sprays guesses.
 *
 * Free slots are reused oldest first, so a slot comes round again only after
 * every other; with max_inflight 256 a slot's id repeats after 2^23 of its
 * own deliveries. A reply late enough to meet its id again is not a worry.
 *
 * sp.c sends each delivery to the next worker in turn whose last one went out
 * whole; with none, the delivery waits (still claimed) for room_cb.
 *
 * Flow control (docs/protocol.md): a worker is never sent more than it can
 * start before their ack timers fire, so the ack timeout measures the handler's
 * work and not a queue in front of it. sp.c spreads deliveries
 * round-robin over the workers, so a window of unanswered deliveries per
 * connected worker, 'w', paces them all. It adapts to what the answers say:
 * 'lmin', the quickest recent answer, is about one handler's time; an answer
 * that took L says how long the queue in front of a worker is. While one more
 * delivery queued behind the others would still come back within a quarter
 * of ack_timeout_ms (L + lmin <= ack_timeout / 4), w grows: by one an answer
 * at first (doubling each round trip), by 1/w once it has had to shrink. An
 * answer later than a third of ack_timeout_ms shrinks it by a quarter, a
 * timeout halves it, at most once per round trip, never below one: three
 * times the queue's wait is room for a stall of the worker or the machine.
 * Which answer grows or shrinks it is px_decide_window (decide.c).
 * It starts at PX_WINDOW_START. A worker running one handler at a time at
 * 20 ms each and ack_timeout_ms 2000 settles near 25: its last delivery
 * waits about 0.5 s.
 *
 * The window is also bounded by PX_WORKER_WINDOW unanswered deliveries per connected worker:
 * a worker's libnanomsg REP drops a reply silently when its pipe back to us is full
 * ("if it cannot be sent because of pushback, drop it silently", rep.c), and
 * an ipc pipe we are slow to read holds only ~200 replies (~350 small ones).
 * A dropped ack would cost an ack timeout and a second delivery. sp.c
 * spreads requests round-robin over the workers, so no pipe owes us more
 * replies than that. Deliveries past the window wait, claimed, for replies.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "claim.h"
#include "decide.h"
#include "deliver.h"
#include "log.h"
#include "reader.h"
#include "sp.h"
#include "trace.h"

#define PX_WORKER_WINDOW 128
#define PX_WINDOW_START  4.0
#define PX_LMIN_EVERY    30.0         /* seconds: lmin forgets older answers this often */
#define PX_ENC_KEEP      (256 * 1024) /* bytes of encoding buffer kept between sends */

unsigned long long px_protocol_errors;

typedef struct px_deliver {
    px_sp *sock;
    px_entry **slots;     /* entry per slot, NULL when free */
    uint32_t *gens;       /* deliveries per slot, wrapping at gen_mask */
    uint32_t *ids;        /* the request id of each slot's delivery out */
    uint64_t key[8];      /* gen_of's round keys */
    uint32_t *free_slots; /* ring of free slot numbers, oldest first */
    size_t free_head, nfree, nslots;
    unsigned slot_bits; /* of a request id (see above) */
    uint32_t slot_mask, gen_mask;
    px_buf enc;       /* encoding buffer, reused up to PX_ENC_KEEP */
    px_field *fields; /* scratch: the fields of one delivery */
    size_t fields_cap;
    double w;                           /* flow control: deliveries per worker (see above) */
    bool shrunk;                        /* w has had to shrink once: grow by 1/w, not by 1 */
    double lmin, lmin_next, lmin_since; /* quickest answer (s), this period's, start */
    double calm_until;                  /* no shrink before this loop time (one round trip) */
    bool blocked;                       /* a delivery waits for a worker with room */
    ev_timer unhold;                    /* a delivery waits for room: read the held answers */
} px_deliver;

/* An answer came back 'l' seconds after its delivery went out. */
static void window_answer(px_proxy *px, px_deliver *d, double l)
{
    double now = ev_now(px->loop), ack = (double)px->conf->ack_timeout_ms / 1000.0;
    if (l < d->lmin_next) d->lmin_next = l;
    if (l < d->lmin) d->lmin = l;
    if (now - d->lmin_since > PX_LMIN_EVERY) { /* handlers may have slowed down */
        d->lmin = d->lmin_next;
        d->lmin_next = l;
        d->lmin_since = now;
    }
    px_window_next next = px_decide_window(l, d->lmin, ack);
    if (next == PX_WINDOW_SHRINK && now >= d->calm_until) {
        d->w = d->w * 0.75 > 1.0 ? d->w * 0.75 : 1.0;
        d->shrunk = true;
        d->calm_until = now + l;
    } else if (next == PX_WINDOW_GROW && d->w < PX_WORKER_WINDOW) {
        d->w += d->shrunk ? 1.0 / d->w : 1.0;
    }
}

static void window_timeout(px_proxy *px, px_deliver *d)
{
    double now = ev_now(px->loop);
    if (now < d->calm_until) return;
    d->w = d->w * 0.5 > 1.0 ? d->w * 0.5 : 1.0;
    d->shrunk = true;
    d->calm_until = now + (double)px->conf->ack_timeout_ms / 1000.0;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The generation field of slot s's count-th delivery: a permutation of the
 * 31 - slot_bits bits (each round changes one half by a keyed function of the
 * other, which can be undone), so distinct counts give distinct generations. */
static uint32_t gen_of(const px_deliver *d, uint32_t s, uint32_t count)
{
    unsigned bits = 31 - d->slot_bits, lb = bits / 2, rb = bits - lb;
    uint32_t lmask = (1u << lb) - 1, rmask = (1u << rb) - 1;
    uint32_t l = (count >> rb) & lmask, r = count & rmask;
    for (int i = 0; i < 8; i++) {
        uint64_t k = d->key[i] ^ ((uint64_t)s << 32);
        if (i % 2 == 0)
            l ^= (uint32_t)mix64(k ^ r) & lmask;
        else
            r ^= (uint32_t)mix64(k ^ l) & rmask;
    }
    return (l << rb) | r;
}

static uint32_t slot_take(px_deliver *d, px_entry *e)
{
    uint32_t s = d->free_slots[d->free_head];
    d->free_head = (d->free_head + 1) % d->nslots;
    d->nfree--;
    d->slots[s] = e;
    d->gens[s] = (d->gens[s] + 1) & d->gen_mask;
    d->ids[s] = 0x80000000u | (gen_of(d, s, d->gens[s]) << d->slot_bits) | s;
    return d->ids[s];
}

static void slot_put(px_deliver *d, uint32_t req_id)
{
    uint32_t s = req_id & d->slot_mask;
    d->slots[s] = NULL;
    d->free_slots[(d->free_head + d->nfree) % d->nslots] = s;
    d->nfree++;
}

static px_entry *slot_find(px_deliver *d, uint32_t req_id)
{
    uint32_t s = req_id & d->slot_mask;
    if (s >= d->nslots || d->slots[s] == NULL) return NULL;
    if (req_id != d->ids[s]) return NULL;
    return d->slots[s];
}

/* The ack timeout of one delivery. */
static void ack_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    px_entry *e = w->data;
    px_deliver *d = e->st->px->deliver;
    if (px_sp_held(d->sock) && !e->delivery.held_read) { /* its answer may be held: read, look again */
        e->delivery.held_read = true;
        ev_timer_set(w, 0., 0.);
        ev_timer_start(loop, w);
        px_sp_read_held(d->sock); /* may answer e: nothing of e is touched after it */
        return;
    }
    slot_put(d, e->delivery.req_id);
    e->st->c.ack_timeouts++;
    window_timeout(e->st->px, d);
    px_log_entry(PX_LOG_WARN, e, "ack timeout");
    px_proxy_on_answer(e, PX_ACK_TIMEOUT, "ack timeout");
}

/* The Delivery of 'e' (fields in d's scratch space), as it goes out. */
static px_delivery_view delivery_view(px_deliver *d, px_entry *e, uint32_t attempt,
                                      uint64_t fence, uint64_t deadline)
{
    if (d->fields_cap < e->nfields) {
        d->fields_cap = e->nfields;
        d->fields = px_realloc(d->fields, sizeof(px_field) * d->fields_cap);
    }
    size_t nf = 0;
    for (size_t i = 0; i < e->nfields; i++)
        if ((int)i != e->payload_idx) d->fields[nf++] = e->fields[i];
    /* The entry's own trace context, passed on when valid (docs/protocol.md);
     * with tracing on, send_one puts idemproxy's delivery span there. */
    const char *tp, *ts;
    px_trace_ctx ctx;
    px_trace_fields(e, e->st->px->conf->trace_field, &tp, &ts);
    if (tp && !px_trace_parse(tp, strlen(tp), &ctx)) tp = ts = NULL;
    return (px_delivery_view){
        .stream = e->st->conf->stream,
        .entry_id = e->id,
        .key = e->key,
        .fields = d->fields,
        .nfields = nf,
        .payload = e->payload_idx >= 0 ? e->fields[e->payload_idx].value : NULL,
        .payload_len = e->payload_idx >= 0 ? e->fields[e->payload_idx].value_len : 0,
        .attempt = attempt,
        .fencing_token = fence,
        .deadline_unix_ms = deadline,
        .traceparent = tp,
        .tracestate = ts,
        .lock = !e->st->conf->fencing ? NULL : e->lock_key ? e->lock_key
                                                           : e->key,
    };
}

/* The largest the entry's Delivery can encode to (the numbers at their
 * widest): what max_entry_bytes bounds (docs/configuration.md), so no worker is
 * ever sent a message over its receive limit. */
size_t px_deliver_size(px_proxy *px, px_entry *e)
{
    px_delivery_view v = delivery_view(px->deliver, e, UINT32_MAX, UINT64_MAX, UINT64_MAX);
    if (px->trace) v.traceparent = "00-00000000000000000000000000000000-0000000000000000-00";
    return px_codec_delivery_size(&v);
}

/* Send one delivery. PX_EAGAIN when the socket has no room (or no worker). */
static int send_one(px_proxy *px, px_deliver *d, px_entry *e)
{
    if (d->nfree == 0) return PX_EAGAIN;
    px_delivery_view v = delivery_view(d, e, e->delivery.attempt + 1, e->claim.fence,
                                       px_now_ms() + (uint64_t)px->conf->ack_timeout_ms);
    if (e->trace) px_trace_delivery_begin(px->trace, e, &v.traceparent, &v.tracestate);
    px_codec_delivery_encode(&v, &d->enc);

    uint32_t id = slot_take(d, e);
    int sent = px_sp_send(d->sock, id, d->enc.data, d->enc.len);
    /* sent, or queued in a copy: a large buffer (a Delivery near
     * max_entry_bytes) is not kept for ever (docs/guarantee.md, "Known
     * limits": memory). */
    if (d->enc.cap > PX_ENC_KEEP) px_buf_deinit(&d->enc);
    if (sent < 0) { /* no worker, or none with room: on_room flushes again */
        slot_put(d, id);
        d->blocked = true;
        return PX_EAGAIN;
    }
    e->delivery.req_id = id;
    e->delivery.sent_at = ev_now(px->loop);
    e->delivery.held_read = false;
    e->delivery.attempt++;
    px_reader_delivering(e);
    e->delivery.deadline_ms = v.deadline_unix_ms;
    px_entry_to(e, PX_E_SENT);
    e->st->c.deliveries++;
    ev_timer_stop(px->loop, &e->timer);
    ev_init(&e->timer, ack_timeout_cb);
    ev_timer_set(&e->timer, (double)px->conf->ack_timeout_ms / 1000.0, 0.);
    e->timer.data = e;
    ev_timer_start(px->loop, &e->timer);
    px_log_entry(PX_LOG_DEBUG, e, "delivered");
    return PX_OK;
}

/* How many deliveries may be unanswered at once: the window per worker. */
static size_t send_window(px_deliver *d)
{
    int workers = px_sp_workers(d->sock);
    return (size_t)(d->w * (workers > 1 ? workers : 1) + 0.5);
}

size_t px_deliver_window(px_proxy *px)
{
    px_deliver *d = px->deliver;
    return d ? send_window(d) : 0;
}

/* Send what the window has room for, in order. An entry whose lease is not
 * known to be held now (docs/guarantee.md; claim.c, px_claim_held) is not sent:
 * it was claimed longer ago than the lease can be trusted, and no extension has
 * answered since (Redis is out of reach, or slow). It waits, in front of the
 * queue, for the answer of the extension px_claim_extend sends as soon as it
 * can (a lock is extended whatever state its entry is in): found ours, it is
 * sent; found gone (lease_lost), it goes back to the claim, where the done
 * check decides. An instance cut off from Redis while its worker was absent
 * sent such an entry after another instance's worker had acked it (issue 30,
 * finding 1). */
void px_deliver_flush(px_proxy *px)
{
    px_deliver *d = px->deliver;
    px_entry *e;
    px_queue unsure = { 0 };
    size_t window = 0;
    uint64_t now = 0;
    while ((e = px->send_q.head) != NULL) {
        if (e->claim.lease_lost) { /* not delivered on a lock it no longer holds */
            px_queue_pop(&px->send_q);
            px_proxy_reclaim_unsent(e);
            continue;
        }
        if (window == 0) window = send_window(d);
        if (d->nslots - d->nfree >= window) {
            /* A reply frees room: the next flush. One may be held: read them. */
            if (px_sp_held(d->sock)) ev_timer_start(px->loop, &d->unhold);
            break;
        }
        if (now == 0) now = px_mono_ms();
        if (!px_claim_held(e, now)) {
            px_queue_push(&unsure, px_queue_pop(&px->send_q));
            continue;
        }
        if (send_one(px, d, e) != PX_OK) { /* room_cb flushes again */
            if (px_sp_held(d->sock)) ev_timer_start(px->loop, &d->unhold);
            break;
        }
        px_queue_pop(&px->send_q);
    }
    if (unsure.n) { /* back in front, in their order */
        unsure.tail->qnext = px->send_q.head;
        if (px->send_q.head == NULL) px->send_q.tail = unsure.tail;
        px->send_q.head = unsure.head;
        px->send_q.n += unsure.n;
    }
}

static void unhold_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    px_proxy *px = w->data;
    px_sp_release_held(px->deliver->sock); /* not read again each turn until the window ends */
}

void px_deliver_hold(px_proxy *px)
{
    if (px->deliver) px_sp_hold(px->deliver->sock);
}

void px_deliver_unhold(px_proxy *px)
{
    if (px->deliver) px_sp_unhold(px->deliver->sock);
}

static void room_cb(void *arg)
{
    px_proxy *px = arg;
    px_deliver *d = px->deliver;
    if (!d->blocked) return;
    d->blocked = false;
    px_deliver_flush(px);
}

/* A worker's reply, its request id cut from its front. */
static void reply_cb(void *arg, uint32_t id, const unsigned char *body, size_t n)
{
    px_proxy *px = arg;
    px_deliver *d = px->deliver;
    px_entry *e = slot_find(d, id);
    if (e == NULL || e->state != PX_E_SENT) {
        px_log_debug("reply to no delivery in flight (late or unknown), %zu bytes ignored", n);
        return;
    }
    char reason[512];
    const char *why = NULL;
    px_ack_status st = px_codec_ack_decode(body, n, e->st->conf->stream, e->id, reason, sizeof(reason), &why,
                                           &e->delivery.retry_after_ms);
    slot_put(d, id);
    ev_timer_stop(px->loop, &e->timer);
    window_answer(px, d, ev_now(px->loop) - e->delivery.sent_at);
    if (st == PX_ACK_INVALID) {
        px_protocol_errors++;
        px_log_entry(PX_LOG_WARN, e, "invalid reply: %s; treated as RETRY", why);
        snprintf(reason, sizeof(reason), "invalid reply: %s", why);
    }
    px_proxy_on_answer(e, st, reason);
}

int px_deliver_init(px_proxy *px)
{
    px_config *c = px->conf;
    px_deliver *d = px_calloc(1, sizeof(*d));
    px->deliver = d;
    d->nslots = (size_t)c->max_inflight;
    d->slots = px_calloc(d->nslots, sizeof(*d->slots));
    d->gens = px_calloc(d->nslots, sizeof(*d->gens));
    d->ids = px_calloc(d->nslots, sizeof(*d->ids));
    if (getrandom(d->key, sizeof(d->key), 0) != (ssize_t)sizeof(d->key)) {
        px_log_error("app socket: no random key for request ids: %s", strerror(errno));
        return PX_ERR;
    }
    d->free_slots = px_malloc(sizeof(uint32_t) * d->nslots);
    for (size_t i = 0; i < d->nslots; i++) d->free_slots[i] = (uint32_t)i;
    d->nfree = d->nslots;
    while ((1u << d->slot_bits) < d->nslots) d->slot_bits++;
    d->slot_mask = (1u << d->slot_bits) - 1;
    d->gen_mask = (1u << (31 - d->slot_bits)) - 1;
    d->w = PX_WINDOW_START;
    d->lmin = d->lmin_next = 1e9;
    d->lmin_since = ev_now(px->loop);
    ev_timer_init(&d->unhold, unhold_cb, 0., 0.);
    d->unhold.data = px;

    bool ipc = strncmp(c->endpoint, "ipc://", 6) == 0;
    /* The socket file is born with 'socket_mode': no window where others reach it. */
    mode_t old = ipc ? umask((mode_t)(~c->socket_mode & 0777)) : 0;
    char err[256];
    d->sock = px_sp_bind(px->loop, c->endpoint, reply_cb, room_cb, px, err, sizeof(err));
    int errn = errno;
    if (ipc) {
        umask(old);
        if (d->sock) chmod(c->endpoint + 6, (mode_t)c->socket_mode);
    }
    if (d->sock == NULL) {
        /* An ipc path whose directory is missing: say what to do about it. */
        const char *dir = c->endpoint + 6, *slash = ipc ? strrchr(dir, '/') : NULL;
        if (errn == ENOENT && slash != NULL && slash > dir)
            px_log_error("app socket: bind %s: %s: create the directory %.*s, or set app.endpoint "
                         "(or IDEMPROXY_ENDPOINT) to a socket in one that exists, such as "
                         "ipc:///tmp/idemproxy.sock",
                         c->endpoint, err, (int)(slash - dir), dir);
        else
            px_log_error("app socket: bind %s: %s", c->endpoint, err);
        return PX_ERR;
    }
    px_log_info("app socket bound on %s", c->endpoint);
    return PX_OK;
}

void px_deliver_forget(px_proxy *px, px_entry *e)
{
    px_deliver *d = px->deliver;
    if (e->state == PX_E_SENT && slot_find(d, e->delivery.req_id) == e) slot_put(d, e->delivery.req_id);
}

void px_deliver_deinit(px_proxy *px)
{
    px_deliver *d = px->deliver;
    if (d == NULL) return;
    ev_timer_stop(px->loop, &d->unhold);
    px_sp_close(d->sock);
    free(d->slots);
    free(d->gens);
    free(d->ids);
    free(d->free_slots);
    free(d->fields);
    px_buf_deinit(&d->enc);
    free(d);
    px->deliver = NULL;
}

int px_deliver_workers(px_proxy *px)
{
    px_deliver *d = px->deliver;
    return d ? px_sp_workers(d->sock) : 0;
}
