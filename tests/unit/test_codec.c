/*
 * test_codec.c - Delivery encoding and Ack decoding (proxy/codec.c) against
 * protobuf-c's own pack/unpack.
 */
#include <stdlib.h>

#include <nanomsg/nn.h>

#include "codec.h"
#include "idemproxy/v1/idemproxy.pb-c.h"
#include "test.h"

static void test_delivery_roundtrip(void)
{
    px_field fields[2] = {
        { "source", 6, "test", 4 },
        { "bin\0ary", 7, "\x00\xff", 2 },
    };
    px_delivery_view v = {
        .stream = "room", .entry_id = "1700000000000-0", .key = "spin-1",
        .fields = fields, .nfields = 2, .payload = "{\"eventId\":\"spin-1\"}", .payload_len = 20,
        .attempt = 3, .fencing_token = 18446744073709551615ull, .deadline_unix_ms = 1700000030000ull,
    };
    px_buf out = {0};
    px_codec_delivery_encode(&v, &out);
    test_cond("size matches encoding", px_codec_delivery_size(&v) == out.len);
    Idemproxy__V1__Delivery *d = idemproxy__v1__delivery__unpack(NULL, out.len, (uint8_t *)out.data);
    test_cond("decodes", d != NULL);
    if (d) {
        test_streq("stream", d->stream, "room");
        test_streq("entry_id", d->entry_id, "1700000000000-0");
        test_streq("key", d->key, "spin-1");
        test_cond("two fields", d->n_fields == 2);
        test_streq("field name", d->fields[0]->name, "source");
        test_cond("field value", d->fields[0]->value.len == 4 && memcmp(d->fields[0]->value.data, "test", 4) == 0);
        test_cond("binary value kept", d->fields[1]->value.len == 2 && d->fields[1]->value.data[1] == 0xff);
        test_cond("payload", d->payload.len == 20 && memcmp(d->payload.data, "{\"eventId\"", 10) == 0);
        test_cond("attempt", d->attempt == 3);
        test_cond("fencing token uint64", d->fencing_token == 18446744073709551615ull);
        test_cond("deadline", d->deadline_unix_ms == 1700000030000ull);
        test_streq("no traceparent: empty", d->traceparent, "");
        test_streq("no tracestate: empty", d->tracestate, "");
        idemproxy__v1__delivery__free_unpacked(d, NULL);
    }
    /* Protocol 1.1: the trace context, fields 9 and 10. */
    v.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    v.tracestate = "vendor=abc";
    px_codec_delivery_encode(&v, &out);
    test_cond("size matches encoding with trace context", px_codec_delivery_size(&v) == out.len);
    d = idemproxy__v1__delivery__unpack(NULL, out.len, (uint8_t *)out.data);
    test_cond("decodes with trace context", d != NULL);
    if (d) {
        test_streq("traceparent", d->traceparent, v.traceparent);
        test_streq("tracestate", d->tracestate, "vendor=abc");
        idemproxy__v1__delivery__free_unpacked(d, NULL);
    }
    v.traceparent = v.tracestate = NULL;
    /* The buffer is reused: a second, smaller encoding fits the same memory. */
    char *before = out.data;
    v.nfields = 0;
    px_codec_delivery_encode(&v, &out);
    test_cond("buffer reused", out.data == before);
    px_buf_deinit(&out);
}

static px_ack_status decode(const void *p, size_t n, const char **why, char *reason, size_t rsize)
{
    uint32_t after;
    return px_codec_ack_decode(p, n, "room", "1-0", reason, rsize, why, &after);
}

static void test_ack(void)
{
    char reason[16];
    const char *why;
    test_cond("08 01 is a complete ACK", decode("\x08\x01", 2, &why, reason, sizeof(reason)) == PX_ACK_ACK);
    test_cond("08 02 is RETRY", decode("\x08\x02", 2, &why, reason, sizeof(reason)) == PX_ACK_RETRY);
    test_cond("08 03 is DROP", decode("\x08\x03", 2, &why, reason, sizeof(reason)) == PX_ACK_DROP);
    test_cond("empty is UNSPECIFIED: invalid", decode("", 0, &why, reason, sizeof(reason)) == PX_ACK_INVALID && why);
    test_cond("unknown status: invalid", decode("\x08\x09", 2, &why, reason, sizeof(reason)) == PX_ACK_INVALID);
    test_cond("garbage: invalid", decode("\xff\xff\xff", 3, &why, reason, sizeof(reason)) == PX_ACK_INVALID && why);

    Idemproxy__V1__Ack a = IDEMPROXY__V1__ACK__INIT;
    uint8_t buf[256];
    char s_reason[] = "a reason longer than sixteen bytes", s_room[] = "room", s_other[] = "other";
    char s_id1[] = "1-0", s_id2[] = "2-0", s_empty[] = "";
    a.status = IDEMPROXY__V1__ACK__STATUS__DROP;
    a.reason = s_reason;
    a.stream = s_room;
    a.entry_id = s_id1;
    size_t n = idemproxy__v1__ack__pack(&a, buf);
    test_cond("matching echoes", decode(buf, n, &why, reason, sizeof(reason)) == PX_ACK_DROP);
    test_streq("reason truncated, terminated", reason, "a reason longer");
    a.entry_id = s_id2;
    n = idemproxy__v1__ack__pack(&a, buf);
    test_cond("wrong entry id echo: invalid", decode(buf, n, &why, reason, sizeof(reason)) == PX_ACK_INVALID);
    test_streq("why names the entry id", why, "ack echoes another entry id");
    a.entry_id = s_empty;
    a.stream = s_other;
    n = idemproxy__v1__ack__pack(&a, buf);
    test_cond("wrong stream echo: invalid", decode(buf, n, &why, reason, sizeof(reason)) == PX_ACK_INVALID);
    a.stream = s_empty;
    n = idemproxy__v1__ack__pack(&a, buf);
    test_cond("no echoes: fine", decode(buf, n, &why, reason, sizeof(reason)) == PX_ACK_DROP);

    /* Acks are unpacked into a 4 KiB scratch area; a longer one spills to the
     * heap and must read the same (and leak nothing: the memcheck suite). */
    static char big[6000];
    static uint8_t bigbuf[6100];
    char long_reason[5000];
    memset(big, 'r', sizeof(big) - 1);
    big[0] = 'X';
    a.reason = big;
    a.stream = s_room;
    a.entry_id = s_id1;
    n = idemproxy__v1__ack__pack(&a, bigbuf);
    test_cond("a 6 KB reason decodes", decode(bigbuf, n, &why, long_reason, sizeof(long_reason)) == PX_ACK_DROP);
    test_cond("its first 4999 bytes kept", strlen(long_reason) == 4999 && long_reason[0] == 'X' &&
              long_reason[4998] == 'r');
    test_cond("a short ack after it still decodes", decode("\x08\x01", 2, &why, reason, sizeof(reason)) == PX_ACK_ACK);
}

/* Control data as nn_recvmsg writes it: one message of 'level'/'type' with
 * cmsg_len 'clen', a size_t 'len' and 'n' header bytes, at offset 'off' of
 * 'buf' (the rest zero). Returns the bytes used. */
static size_t cmsg_put(unsigned char *buf, size_t off, size_t clen, int level, int type, size_t len,
                       const unsigned char *hdr, size_t n)
{
    struct nn_cmsghdr h = { clen, level, type };
    memcpy(buf + off, &h, sizeof(h));
    size_t head = NN_CMSG_ALIGN_(sizeof(h));
    memcpy(buf + off + head, &len, sizeof(len));
    memcpy(buf + off + head + sizeof(len), hdr, n);
    return off + head + sizeof(len) + n;
}

static void test_reply_id(void)
{
    static const unsigned char id4[] = { 0x80, 0x00, 0x01, 0x02 };
    unsigned char buf[256];
    uint32_t id = 0;

    memset(buf, 0, sizeof(buf));
    size_t n = cmsg_put(buf, 0, NN_CMSG_LEN(sizeof(size_t) + 4), PROTO_SP, SP_HDR, 4, id4, 4);
    test_cond("the id", px_codec_reply_id(buf, n, &id) && id == 0x80000102u);
    test_cond("the id, the buffer larger", px_codec_reply_id(buf, sizeof(buf), &id) && id == 0x80000102u);
    /* After another control message. */
    memset(buf, 0, sizeof(buf));
    size_t off = NN_CMSG_SPACE(sizeof(size_t) + 4);
    cmsg_put(buf, 0, NN_CMSG_LEN(sizeof(size_t) + 4), 7, 9, 4, id4, 4);
    n = cmsg_put(buf, off, NN_CMSG_LEN(sizeof(size_t) + 4), PROTO_SP, SP_HDR, 4, id4, 4);
    test_cond("the second message", px_codec_reply_id(buf, n, &id) && id == 0x80000102u);
    /* Unaligned. */
    unsigned char *odd = buf + 1;
    memset(buf, 0, sizeof(buf));
    n = cmsg_put(odd, 0, NN_CMSG_LEN(sizeof(size_t) + 4), PROTO_SP, SP_HDR, 4, id4, 4);
    test_cond("an unaligned buffer", px_codec_reply_id(odd, n, &id) && id == 0x80000102u);

    /* What a peer (or a header nanomsg could not fit) leaves: each refused,
     * nothing read past the buffer (the buffer is exactly the bytes given). */
    struct { const char *what; size_t clen, len, n, give; int level; } bad[] = {
        { "no data after the header", sizeof(struct nn_cmsghdr), 0, 0, sizeof(struct nn_cmsghdr), PROTO_SP },
        { "a length past cmsg_len", NN_CMSG_LEN(sizeof(size_t) + 4), 1000, 4, 0, PROTO_SP },
        { "cmsg_len past the buffer", 200, 4, 4, 0, PROTO_SP },
        { "cmsg_len zero (a walk that never moves)", 0, 4, 4, 0, 0 },
        { "a header of 3 bytes", NN_CMSG_LEN(sizeof(size_t) + 3), 3, 3, 0, PROTO_SP },
        { "no SP header", NN_CMSG_LEN(sizeof(size_t) + 4), 4, 4, 0, 5 },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        unsigned char tmp[64] = { 0 };
        size_t used = cmsg_put(tmp, 0, bad[i].clen, bad[i].level, SP_HDR, bad[i].len, id4, bad[i].n);
        size_t give = bad[i].give ? bad[i].give : used;
        unsigned char *exact = malloc(give);
        memcpy(exact, tmp, give);
        test_cond(bad[i].what, !px_codec_reply_id(exact, give, &id));
        free(exact);
    }
    test_cond("an empty buffer", !px_codec_reply_id(buf, 0, &id));
}

int main(void)
{
    test_reply_id();
    test_delivery_roundtrip();
    test_ack();
    return test_report();
}
