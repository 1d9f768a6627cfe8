/*
 * fuzz_ack.c - libFuzzer target for the wire codec (proxy/codec.c,
 * docs/protocol.md).
 *
 * 1. The input as a worker's reply: px_codec_ack_decode, checked against
 *    protobuf-c's own idemproxy__v1__ack__unpack of the same bytes (a reply
 *    that does not unpack, has no known status or echoes other ids is
 *    PX_ACK_INVALID with a 'why'; the reason is copied, truncated and
 *    NUL-terminated in buffers of 1, 5 and 256 bytes).
 * 2. The input as a Delivery to encode: the first 20 bytes (if there are 20)
 *    are attempt, fencing_token and deadline_unix_ms; the rest is split at
 *    0x1f bytes into stream, entry_id, key, payload, then field name, value,
 *    name, value... px_codec_delivery_encode must give what
 *    idemproxy__v1__delivery__unpack reads back field for field, in
 *    px_codec_delivery_size bytes.
 */
#include <string.h>

#include "codec.h"
#include "fuzz.h"
#include "idemproxy/v1/idemproxy.pb-c.h"

#define SEP 0x1f

static const char stream[] = "room";
static const char entry_id[] = "1700000000000-0";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/* Decode with a reason buffer of exactly 'rsize' bytes and check the result
 * against 'ref' (protobuf-c's unpack, or NULL when it does not unpack). */
static void ack_check(const uint8_t *data, size_t size, const Idemproxy__V1__Ack *ref,
                      size_t rsize)
{
    char *reason = malloc(rsize);
    memset(reason, 'x', rsize);
    const char *why = (const char *)1;
    uint32_t after;
    px_ack_status st = px_codec_ack_decode(data, size, stream, entry_id, reason, rsize, &why, &after);

    px_ack_status want = PX_ACK_INVALID;
    if (ref) {
        switch (ref->status) {
        case IDEMPROXY__V1__ACK__STATUS__ACK:   want = PX_ACK_ACK; break;
        case IDEMPROXY__V1__ACK__STATUS__RETRY: want = PX_ACK_RETRY; break;
        case IDEMPROXY__V1__ACK__STATUS__DROP:  want = PX_ACK_DROP; break;
        default: break;
        }
        if (ref->stream && ref->stream[0] && strcmp(ref->stream, stream) != 0)
            want = PX_ACK_INVALID;
        if (ref->entry_id && ref->entry_id[0] && strcmp(ref->entry_id, entry_id) != 0)
            want = PX_ACK_INVALID;
    }
    FUZZ_CHECK(st == want, "status %d, protobuf-c's unpack says %d", (int)st, (int)want);
    if (st == PX_ACK_INVALID)
        FUZZ_CHECK(why != NULL && why != (const char *)1 && why[0], "INVALID without a why");
    else
        FUZZ_CHECK(why == NULL, "a valid ack with a why: %s", why);

    FUZZ_CHECK(memchr(reason, '\0', rsize) != NULL, "reason not NUL-terminated");
    const char *r = ref && ref->reason ? ref->reason : "";
    size_t want_len = strlen(r) < rsize - 1 ? strlen(r) : rsize - 1;
    /* A cut reason ends at a character boundary (codec.c), never inside one. */
    if (want_len < strlen(r))
        while (want_len > 0 && ((unsigned char)r[want_len] & 0xC0) == 0x80) want_len--;
    FUZZ_CHECK(strlen(reason) == want_len && memcmp(reason, r, want_len) == 0,
               "reason not copied (size %zu)", rsize);
    free(reason);
}

/* A NUL-terminated copy of 'n' bytes at 'p'. */
static char *cstr(const char *p, size_t n)
{
    char *s = malloc(n + 1);
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static uint64_t le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void delivery_roundtrip(const uint8_t *data, size_t size)
{
    px_delivery_view d;
    memset(&d, 0, sizeof(d));
    if (size >= 20) {
        d.attempt = (uint32_t)le(data, 4);
        d.fencing_token = le(data + 4, 8);
        d.deadline_unix_ms = le(data + 12, 8);
        data += 20;
        size -= 20;
    }
    const char *in = (const char *)data;
    size_t npieces = 1;
    for (size_t i = 0; i < size; i++)
        if ((unsigned char)in[i] == SEP) npieces++;
    const char **piece = calloc(npieces + 5, sizeof(*piece));
    size_t *plen = calloc(npieces + 5, sizeof(*plen));
    size_t k = 0, start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i == size || (unsigned char)in[i] == SEP) {
            piece[k] = in + start;
            plen[k++] = i - start;
            start = i + 1;
        }
    }
    while (k < 4 || (k - 4) % 2) { piece[k] = ""; plen[k++] = 0; }

    /* stream, entry_id and key are C strings in the view (cut at a NUL). */
    char *s_stream = cstr(piece[0], plen[0]);
    char *s_id = cstr(piece[1], plen[1]);
    char *s_key = cstr(piece[2], plen[2]);
    d.stream = s_stream;
    d.entry_id = s_id;
    d.key = s_key;
    d.payload = piece[3];
    d.payload_len = plen[3];
    d.nfields = (k - 4) / 2;
    px_field *fields = calloc(d.nfields ? d.nfields : 1, sizeof(*fields));
    for (size_t i = 0; i < d.nfields; i++) {
        fields[i].name = piece[4 + 2 * i];
        fields[i].name_len = plen[4 + 2 * i];
        fields[i].value = piece[5 + 2 * i];
        fields[i].value_len = plen[5 + 2 * i];
    }
    d.fields = fields;

    px_buf out = {0};
    px_codec_delivery_encode(&d, &out);
    FUZZ_CHECK(px_codec_delivery_size(&d) == out.len, "size %zu, encoded %zu",
               px_codec_delivery_size(&d), out.len);
    Idemproxy__V1__Delivery *m =
        idemproxy__v1__delivery__unpack(NULL, out.len, (const uint8_t *)out.data);
    FUZZ_CHECK(m != NULL, "an encoded Delivery does not unpack");
    FUZZ_CHECK(strcmp(m->stream, d.stream) == 0, "stream");
    FUZZ_CHECK(strcmp(m->entry_id, d.entry_id) == 0, "entry_id");
    FUZZ_CHECK(strcmp(m->key, d.key) == 0, "key");
    FUZZ_CHECK(m->payload.len == d.payload_len &&
               (d.payload_len == 0 || memcmp(m->payload.data, d.payload, d.payload_len) == 0),
               "payload");
    FUZZ_CHECK(m->attempt == d.attempt, "attempt");
    FUZZ_CHECK(m->fencing_token == d.fencing_token, "fencing_token");
    FUZZ_CHECK(m->deadline_unix_ms == d.deadline_unix_ms, "deadline_unix_ms");
    FUZZ_CHECK(m->n_fields == d.nfields, "%zu fields, sent %zu", m->n_fields, d.nfields);
    for (size_t i = 0; i < d.nfields; i++) {
        const Idemproxy__V1__Field *f = m->fields[i];
        /* A name is a proto string: it ends at its first NUL (names_copy). */
        size_t nlen = strnlen(fields[i].name, fields[i].name_len);
        FUZZ_CHECK(strlen(f->name) == nlen && memcmp(f->name, fields[i].name, nlen) == 0,
                   "field %zu name", i);
        FUZZ_CHECK(f->value.len == fields[i].value_len &&
                   (f->value.len == 0 ||
                    memcmp(f->value.data, fields[i].value, f->value.len) == 0),
                   "field %zu value", i);
    }
    idemproxy__v1__delivery__free_unpacked(m, NULL);

    /* Encoding again into the same buffer gives the same bytes in place. */
    char *before = out.data;
    size_t len = out.len;
    char *copy = cstr(out.data, len);
    px_codec_delivery_encode(&d, &out);
    FUZZ_CHECK(out.data == before && out.len == len && memcmp(out.data, copy, len) == 0,
               "a second encoding differs");
    free(copy);

    px_buf_deinit(&out);
    free(fields);
    free(s_stream);
    free(s_id);
    free(s_key);
    free(piece);
    free(plen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Idemproxy__V1__Ack *ref = idemproxy__v1__ack__unpack(NULL, size, data);
    ack_check(data, size, ref, 256);
    ack_check(data, size, ref, 5);
    ack_check(data, size, ref, 1);
    if (ref) idemproxy__v1__ack__free_unpacked(ref, NULL);

    delivery_roundtrip(data, size);
    return 0;
}
