/*
 * test_codec.c - Delivery encoding and Ack decoding (proxy/codec.c) against
 * protobuf-c's own pack/unpack.
 */
#include <stdlib.h>


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

int main(void)
{
    test_delivery_roundtrip();
    test_ack();
    return test_report();
}
