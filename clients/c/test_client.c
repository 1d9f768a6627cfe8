/*
 * test_client.c - tests the C client against a raw NN_REQ socket bound the way
 * idemproxy binds it, so this file is also the reference for idemproxy's side.
 *
 * Raw REQ (AF_SP_RAW) keeps no request state: the sender chooses each request
 * id and reads it back from the reply. Both travel in the SP header, which the
 * nanomsg API exposes as a control message of level PROTO_SP and type SP_HDR
 * whose data is a size_t length followed by the header bytes. For REQ/REP the
 * header is one 4-byte big-endian word with the top bit set: that bit marks
 * the bottom of the backtrace, where the REP side stops reading header words.
 * Without it REP keeps eating the body as routing hops.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "idemproxy_client.h"
#include "idemproxy/v1/idemproxy.pb-c.h"
#include "test.h"

/* Room for one SP_HDR carrying a 4-byte request id (32 bytes on LP64). The
 * union keeps the buffer aligned for the nn_cmsghdr and size_t inside it. */
#define REQ_CTRL_SIZE NN_CMSG_SPACE(sizeof(size_t) + sizeof(uint32_t))
typedef union req_ctrl {
    struct nn_cmsghdr hdr;
    unsigned char     buf[REQ_CTRL_SIZE];
} req_ctrl;

/* Sends 'len' bytes of 'body' as a request tagged 'id' (top bit set here).
 * Returns what nn_sendmsg returns; EAGAIN when no worker is connected. */
static int req_send(int s, uint32_t id, const void *body, size_t len)
{
    req_ctrl ctrl;
    struct nn_cmsghdr *cmsg = &ctrl.hdr;
    unsigned char *data = NN_CMSG_DATA(cmsg);
    size_t hdrlen = sizeof(uint32_t);
    struct nn_iovec iov = { (void *) body, len };
    struct nn_msghdr hdr = { &iov, 1, ctrl.buf, sizeof(ctrl.buf) };

    id |= 0x80000000u;
    memset(&ctrl, 0, sizeof(ctrl));
    cmsg->cmsg_len = NN_CMSG_LEN(sizeof(size_t) + sizeof(uint32_t));
    cmsg->cmsg_level = PROTO_SP;
    cmsg->cmsg_type = SP_HDR;
    memcpy(data, &hdrlen, sizeof(size_t));
    data[sizeof(size_t) + 0] = (unsigned char) (id >> 24);
    data[sizeof(size_t) + 1] = (unsigned char) (id >> 16);
    data[sizeof(size_t) + 2] = (unsigned char) (id >> 8);
    data[sizeof(size_t) + 3] = (unsigned char) id;
    return nn_sendmsg(s, &hdr, NN_DONTWAIT);
}

/* Receives a reply (waiting up to the socket's NN_RCVTIMEO), stores its request
 * id in '*id' (0 when the header is missing) and decodes the body as an Ack.
 * Returns NULL on timeout or a body that is not an Ack. */
static Idemproxy__V1__Ack *req_recv(int s, uint32_t *id)
{
    req_ctrl ctrl;
    void *body = NULL;
    struct nn_iovec iov = { &body, NN_MSG };
    struct nn_msghdr hdr = { &iov, 1, ctrl.buf, sizeof(ctrl.buf) };
    struct nn_cmsghdr *cmsg;
    Idemproxy__V1__Ack *ack;
    int n;

    *id = 0;
    memset(&ctrl, 0, sizeof(ctrl));
    n = nn_recvmsg(s, &hdr, 0);
    if (n < 0)
        return NULL;
    /* On receive nanomsg sets cmsg_len to NN_CMSG_SPACE (padding included),
     * so trust the size_t length in the data, not cmsg_len. */
    for (cmsg = NN_CMSG_FIRSTHDR(&hdr); cmsg; cmsg = NN_CMSG_NXTHDR(&hdr, cmsg)) {
        const unsigned char *data = NN_CMSG_DATA(cmsg);
        size_t hdrlen;

        if (cmsg->cmsg_level != PROTO_SP || cmsg->cmsg_type != SP_HDR)
            continue;
        memcpy(&hdrlen, data, sizeof(size_t));
        data += sizeof(size_t);
        if (hdrlen == sizeof(uint32_t))
            *id = (uint32_t) data[0] << 24 | (uint32_t) data[1] << 16 |
                  (uint32_t) data[2] << 8 | data[3];
        break;
    }
    ack = idemproxy__v1__ack__unpack(NULL, (size_t) n, body);
    nn_freemsg(body);
    return ack;
}

/* The deadline send_delivery() puts in each Delivery (0: none). */
static uint64_t deadline;
/* The trace context send_delivery() puts in each Delivery ("": none). */
static const char *traceparent = "", *tracestate = "";

static uint64_t now_unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Sends a Delivery for 'key' with a few fields, tagged with request 'id'. */
static int send_delivery(int s, uint32_t id, const char *key, uint32_t attempt)
{
    Idemproxy__V1__Field f1 = IDEMPROXY__V1__FIELD__INIT, f2 = IDEMPROXY__V1__FIELD__INIT;
    Idemproxy__V1__Field *fields[] = { &f1, &f2 };
    Idemproxy__V1__Delivery d = IDEMPROXY__V1__DELIVERY__INIT;
    uint8_t buf[512];
    size_t len;

    f1.name = (char *) "customer";
    f1.value.data = (uint8_t *) "42";
    f1.value.len = 2;
    f2.name = (char *) "blob";
    f2.value.data = (uint8_t *) "a\0b";
    f2.value.len = 3;
    d.stream = (char *) "orders";
    d.entry_id = (char *) "1700000000000-7";
    d.key = (char *) key;
    d.n_fields = 2;
    d.fields = fields;
    d.payload.data = (uint8_t *) "{\"id\":1}";
    d.payload.len = 8;
    d.attempt = attempt;
    d.fencing_token = 9000000000ULL;
    d.lock = (char *) "order:42";
    d.deadline_unix_ms = deadline;
    d.traceparent = (char *) traceparent;
    d.tracestate = (char *) tracestate;
    len = idemproxy__v1__delivery__pack(&d, buf);
    return req_send(s, id, buf, len);
}

/* Waits until 'n' workers are connected to 's', then a little longer: the
 * statistic counts accepted connections, which may still be handshaking,
 * and only finished ones take part in the round robin. */
static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

static int wait_workers(int s, unsigned n)
{
    int i;

    for (i = 0; i < 500; i++) {
        if (nn_get_statistic(s, NN_STAT_CURRENT_CONNECTIONS) >= n) {
            sleep_ms(50);
            return 1;
        }
        sleep_ms(10);
    }
    return 0;
}

/* One delivery, answered with 'status', checked end to end. */
static void test_answer(int req, idemproxy_client *c, uint32_t id, idemproxy_status status,
                        const char *reason, const char *want_reason)
{
    idemproxy_delivery *d = NULL;
    Idemproxy__V1__Ack *ack;
    uint32_t got_id;

    test_cond("send", send_delivery(req, id, "k1", 2) > 0);
    test_cond("recv", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK && d != NULL);
    if (d == NULL)
        return;
    test_cond("pending after recv", c->pending == 1);
    test_cond("reply", idemproxy_client_reply(c, d, status, reason) == IDEMPROXY_CLIENT_OK);
    test_cond("answered once", idemproxy_client_ack(c, d) == IDEMPROXY_CLIENT_ERR && c->err == EINVAL);
    ack = req_recv(req, &got_id);
    test_cond("ack decodes", ack != NULL);
    test_cond("same request id", got_id == (id | 0x80000000u));
    if (ack != NULL) {
        test_cond("status", (int) ack->status == (int) status);
        test_streq("reason", ack->reason, want_reason);
        test_streq("stream echo", ack->stream, "orders");
        test_streq("entry id echo", ack->entry_id, "1700000000000-7");
        idemproxy__v1__ack__free_unpacked(ack, NULL);
    }
    idemproxy_delivery_free(d);
}

int main(void)
{
    char url[64];
    int req, timeout = 2000;
    idemproxy_client *c, *c2;
    idemproxy_delivery *d = NULL, *d2 = NULL, none;
    Idemproxy__V1__Ack *ack;
    uint32_t id;

    c = idemproxy_client_connect("nosuch://x");
    test_cond("bad endpoint reported", c != NULL && c->err != 0 && c->sock == -1);
    test_cond("bad endpoint errstr", c != NULL && strstr(c->errstr, "nosuch://x") != NULL);
    idemproxy_client_free(c);
    idemproxy_client_free(NULL);
    idemproxy_delivery_free(NULL);

    /* Issue 33: with nobody at the endpoint (a typo), receiving says it is still
     * dialing and where: after IDEMPROXY_DIAL_LOG_MS, then at six times it. */
    {
        char nobody[96], want[192];
        uint64_t t0, t1;
        int rc;

        snprintf(nobody, sizeof(nobody), "ipc:///tmp/px-client-nobody-%d.sock", (int) getpid());
        snprintf(want, sizeof(want), "still dialing %s: no connection to idemproxy for ", nobody);
        setenv("IDEMPROXY_DIAL_LOG_MS", "300", 1);
        c = idemproxy_client_connect(nobody);
        unsetenv("IDEMPROXY_DIAL_LOG_MS");
        t0 = now_unix_ms();
        do
            rc = idemproxy_client_recv(c, 100, &d);
        while (rc == IDEMPROXY_CLIENT_EAGAIN && c->err == 0 && now_unix_ms() - t0 < 5000);
        test_cond("still dialing: EAGAIN with ENOTCONN", rc == IDEMPROXY_CLIENT_EAGAIN && c->err == ENOTCONN);
        test_cond("still dialing: names the endpoint", strncmp(c->errstr, want, strlen(want)) == 0);
        t1 = now_unix_ms();
        rc = idemproxy_client_recv(c, -1, &d); /* no timeout: returns for the next line */
        test_cond("still dialing again, from a receive without a timeout",
                  rc == IDEMPROXY_CLIENT_EAGAIN && c->err == ENOTCONN &&
                  strncmp(c->errstr, want, strlen(want)) == 0 && now_unix_ms() - t1 >= 1000);
        idemproxy_client_free(c);
    }
    /* The whole line, with the longest ipc path nanomsg takes (107 bytes): errstr
     * held 127 characters, so even ipc:///run/idemproxy/app.sock lost the hint. */
    {
        const char *tail = " s (is idemproxy running, and is this its app.endpoint?)";
        char nobody[128], want[256];
        size_t len;
        uint64_t t0;
        int rc, n, whole;

        n = snprintf(nobody, sizeof(nobody), "ipc:///tmp/px-client-nobody-%d-", (int) getpid());
        while (n < 6 + 107)
            nobody[n++] = 'x';
        nobody[n] = '\0';
        snprintf(want, sizeof(want), "still dialing %s: no connection to idemproxy for ", nobody);
        setenv("IDEMPROXY_DIAL_LOG_MS", "1", 1);
        c = idemproxy_client_connect(nobody);
        unsetenv("IDEMPROXY_DIAL_LOG_MS");
        t0 = now_unix_ms();
        do
            rc = idemproxy_client_recv(c, 100, &d);
        while (rc == IDEMPROXY_CLIENT_EAGAIN && c->err == 0 && now_unix_ms() - t0 < 5000);
        len = strlen(c->errstr);
        whole = rc == IDEMPROXY_CLIENT_EAGAIN && c->err == ENOTCONN &&
                strncmp(c->errstr, want, strlen(want)) == 0 && len > strlen(tail) &&
                strcmp(c->errstr + len - strlen(tail), tail) == 0;
        test_cond("still dialing: the whole line, for an ipc path of 107 bytes", whole);
        if (!whole)
            fprintf(stderr, "got: %s\n", c->errstr);
        idemproxy_client_free(c);
    }

    snprintf(url, sizeof(url), "ipc:///tmp/px-client-test-%d.sock", (int) getpid());
    req = nn_socket(AF_SP_RAW, NN_REQ);
    test_cond("raw req bind", req >= 0 && nn_bind(req, url) >= 0);
    nn_setsockopt(req, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout, sizeof(timeout));
    test_cond("no worker: EAGAIN, not a silent drop",
              send_delivery(req, 1, "k0", 1) < 0 && errno == EAGAIN);

    deadline = now_unix_ms() + 60000;
    c = idemproxy_client_connect(url);
    test_cond("connect", c != NULL && c->err == 0);
    test_cond("worker connected", wait_workers(req, 1));
    test_cond("timeout is EAGAIN", idemproxy_client_recv(c, 50, &d) == IDEMPROXY_CLIENT_EAGAIN && d == NULL);

    /* The delivery's fields, as the application sees them. */
    test_cond("send", send_delivery(req, 1, "k1", 3) > 0);
    test_cond("recv", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK && d != NULL);
    if (d != NULL) {
        test_streq("stream", d->stream, "orders");
        test_streq("entry id", d->entry_id, "1700000000000-7");
        test_streq("key", d->key, "k1");
        test_cond("fields", d->nfields == 2 && strcmp(d->fields[0].name, "customer") == 0 &&
                  d->fields[0].value_len == 2 && memcmp(d->fields[0].value, "42", 2) == 0);
        test_cond("binary field", d->fields[1].value_len == 3 &&
                  memcmp(d->fields[1].value, "a\0b", 3) == 0);
        test_cond("payload", d->payload_len == 8 && memcmp(d->payload, "{\"id\":1}", 8) == 0);
        test_cond("numbers", d->attempt == 3 && d->fencing_token == 9000000000ULL &&
                  d->deadline_unix_ms == deadline);
        test_streq("lock", d->lock, "order:42");
        test_cond("ack", idemproxy_client_ack(c, d) == IDEMPROXY_CLIENT_OK && c->pending == 0);
        ack = req_recv(req, &id);
        test_cond("ack id", ack != NULL && id == 0x80000001u);
        idemproxy__v1__ack__free_unpacked(ack, NULL);
        idemproxy_delivery_free(d);
    }

    test_answer(req, c, 2, IDEMPROXY_STATUS_ACK, NULL, "");
    test_answer(req, c, 3, IDEMPROXY_STATUS_RETRY, "busy", "busy");
    test_answer(req, c, 4, IDEMPROXY_STATUS_DROP, "bad order", "bad order");
    memset(&none, 0, sizeof(none));
    test_cond("unknown status refused", idemproxy_client_reply(c, &none, (idemproxy_status) 7, NULL) ==
              IDEMPROXY_CLIENT_ERR && c->err == EINVAL);

    /* Receiving again abandons the unanswered delivery: no reply is sent for
     * it, and answering it afterwards is refused. */
    send_delivery(req, 5, "k5", 1);
    send_delivery(req, 6, "k6", 1);
    test_cond("recv k5", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK);
    test_cond("recv k6", idemproxy_client_recv(c, 2000, &d2) == IDEMPROXY_CLIENT_OK);
    test_cond("stale answer refused", d && idemproxy_client_ack(c, d) == IDEMPROXY_CLIENT_ERR);
    test_cond("current answered", d2 && idemproxy_client_ack(c, d2) == IDEMPROXY_CLIENT_OK);
    ack = req_recv(req, &id);
    test_cond("only k6 answered", ack != NULL && id == 0x80000006u);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    idemproxy_delivery_free(d);
    idemproxy_delivery_free(d2);

    /* A body that is not a Delivery is answered RETRY by the library. */
    test_cond("send junk", req_send(req, 7, "\x0a\x05x", 3) == 3);
    test_cond("junk reported", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_ERR &&
              c->err == EPROTO && d == NULL);
    ack = req_recv(req, &id);
    test_cond("junk answered RETRY", ack != NULL && id == 0x80000007u &&
              ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY && ack->reason[0] != '\0');
    idemproxy__v1__ack__free_unpacked(ack, NULL);

    /* A delivery already past its deadline is answered RETRY by the library
     * and never handed to the application; no deadline (0) is no limit. */
    deadline = now_unix_ms() - 1;
    test_cond("send stale", send_delivery(req, 8, "stale", 1) > 0);
    test_cond("stale not returned", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_EAGAIN &&
              d == NULL && c->err == ETIMEDOUT && strstr(c->errstr, "stale") != NULL);
    ack = req_recv(req, &id);
    test_cond("stale answered RETRY", ack != NULL && id == 0x80000008u &&
              ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY &&
              strcmp(ack->reason, "deadline passed before the handler ran") == 0 &&
              strcmp(ack->entry_id, "1700000000000-7") == 0);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    deadline = 0;
    test_cond("send no deadline", send_delivery(req, 9, "whenever", 1) > 0);
    test_cond("no deadline returned", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK && c->err == 0);
    test_cond("no deadline answered", d && idemproxy_client_ack(c, d) == IDEMPROXY_CLIENT_OK);
    idemproxy_delivery_free(d);
    ack = req_recv(req, &id);
    test_cond("no deadline acked", ack != NULL && id == 0x80000009u);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    deadline = now_unix_ms() + 60000;

    /* Protocol 1.1: the trace context, the time left, and a retry-after. */
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    tracestate = "v=1";
    test_cond("send traced", send_delivery(req, 14, "traced", 1) > 0);
    test_cond("traced returned", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK && d != NULL);
    if (d != NULL) {
        long long left = idemproxy_delivery_remaining_ms(d);

        test_streq("traceparent", d->traceparent, traceparent);
        test_streq("tracestate", d->tracestate, "v=1");
        test_cond("remaining ms", left > 50000 && left <= 60000);
        test_cond("retry after", idemproxy_client_retry_after(c, d, 30000, "rate limited") == IDEMPROXY_CLIENT_OK);
    }
    idemproxy_delivery_free(d);
    ack = req_recv(req, &id);
    test_cond("retry_after_ms sent", ack != NULL && id == 0x8000000eu &&
              ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY && ack->retry_after_ms == 30000 &&
              strcmp(ack->reason, "rate limited") == 0 && strcmp(ack->entry_id, "1700000000000-7") == 0);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    traceparent = tracestate = "";
    test_cond("send untraced", send_delivery(req, 15, "untraced", 1) > 0);
    test_cond("untraced returned", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK && d != NULL);
    if (d != NULL) {
        test_streq("no traceparent", d->traceparent, "");
        test_streq("no tracestate", d->tracestate, "");
        test_cond("retry after an hour at most",
                  idemproxy_client_retry_after(c, d, 7200000, NULL) == IDEMPROXY_CLIENT_OK);
    }
    idemproxy_delivery_free(d);
    ack = req_recv(req, &id);
    test_cond("retry_after_ms capped", ack != NULL && id == 0x8000000fu && ack->retry_after_ms == 3600000);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    none.deadline_unix_ms = 0;
    test_cond("no deadline: -1 ms remaining", idemproxy_delivery_remaining_ms(&none) == -1);
    none.deadline_unix_ms = 1;
    test_cond("past deadline: 0 ms remaining", idemproxy_delivery_remaining_ms(&none) == 0);

    /* Malformed input the application never sees: attempt (a varint) sent
     * length-delimited, and a key that is not UTF-8. */
    test_cond("send mistyped attempt", req_send(req, 12, "\x1a\x01k\x32\x01x", 6) == 6);
    test_cond("mistyped attempt refused", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_ERR &&
              c->err == EPROTO && d == NULL);
    ack = req_recv(req, &id);
    test_cond("mistyped attempt answered RETRY", ack != NULL && id == 0x8000000cu &&
              ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    test_cond("send non-UTF-8 key", req_send(req, 13, "\x1a\x02\xff\xfe", 4) == 4);
    test_cond("non-UTF-8 key refused", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_ERR &&
              c->err == EPROTO && d == NULL);
    ack = req_recv(req, &id);
    test_cond("non-UTF-8 key answered RETRY", ack != NULL && id == 0x8000000du &&
              ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY);
    idemproxy__v1__ack__free_unpacked(ack, NULL);
    test_cond("send non-UTF-8 lock", req_send(req, 16, "\x1a\x01k\x5a\x02\xff\xfe", 7) == 7);
    test_cond("non-UTF-8 lock refused", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_ERR &&
              c->err == EPROTO && d == NULL);
    ack = req_recv(req, &id);
    test_cond("non-UTF-8 lock answered RETRY", ack != NULL && id == 0x80000010u &&
              ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY);
    idemproxy__v1__ack__free_unpacked(ack, NULL);

    test_cond("max entry bytes 0 refused", idemproxy_client_set_max_entry_bytes(c, 0) == IDEMPROXY_CLIENT_ERR &&
              c->err == EINVAL);
    test_cond("default receive limit", c->rcvmax == IDEMPROXY_CLIENT_DEFAULT_MAX_ENTRY_BYTES +
              IDEMPROXY_CLIENT_SP_HEADER_BYTES);

    /* Two requests in flight to two workers, answered in reverse order: the
     * request id in the header tells which reply belongs to which. */
    c2 = idemproxy_client_connect(url);
    test_cond("second worker connected", c2 && c2->err == 0 && wait_workers(req, 2));
    test_cond("send a", send_delivery(req, 10, "a", 1) > 0);
    test_cond("send b", send_delivery(req, 11, "b", 1) > 0);
    test_cond("worker 1 got one", idemproxy_client_recv(c, 2000, &d) == IDEMPROXY_CLIENT_OK);
    test_cond("worker 2 got one", idemproxy_client_recv(c2, 2000, &d2) == IDEMPROXY_CLIENT_OK);
    if (d != NULL && d2 != NULL) {
        idemproxy_delivery *da = strcmp(d->key, "a") == 0 ? d : d2, *db = da == d ? d2 : d;
        idemproxy_client *ca = da == d ? c : c2, *cb = da == d ? c2 : c;
        int seen = 0, i;

        test_cond("one each", strcmp(db->key, "b") == 0);
        test_cond("retry b", idemproxy_client_retry(cb, db, "later") == IDEMPROXY_CLIENT_OK);
        test_cond("ack a", idemproxy_client_ack(ca, da) == IDEMPROXY_CLIENT_OK);
        for (i = 0; i < 2; i++) {
            ack = req_recv(req, &id);
            if (ack != NULL && id == 0x8000000au && ack->status == IDEMPROXY__V1__ACK__STATUS__ACK)
                seen |= 1;
            if (ack != NULL && id == 0x8000000bu && ack->status == IDEMPROXY__V1__ACK__STATUS__RETRY &&
                strcmp(ack->reason, "later") == 0)
                seen |= 2;
            idemproxy__v1__ack__free_unpacked(ack, NULL);
        }
        test_cond("both replies matched by id", seen == 3);
    }
    idemproxy_delivery_free(d);
    idemproxy_delivery_free(d2);

    idemproxy_client_free(c2);
    idemproxy_client_free(c);
    nn_close(req);
    unlink(url + strlen("ipc://"));
    return test_report();
}
