/*
 * codec.c - Delivery encoding and Ack decoding with protobuf-c.
 */
#include "codec.h"

#include <stdlib.h>
#include <string.h>

#include "idemproxy/v1/idemproxy.pb-c.h"

/* Fill a stack Delivery that borrows from 'd'. 'fields' and 'ptrs' have
 * room for d->nfields each. */
static void delivery_fill(const px_delivery_view *d, Idemproxy__V1__Delivery *m,
                          Idemproxy__V1__Field *fields, Idemproxy__V1__Field **ptrs,
                          char **names)
{
    idemproxy__v1__delivery__init(m);
    m->stream = (char *)d->stream;
    m->entry_id = (char *)d->entry_id;
    m->key = (char *)d->key;
    for (size_t i = 0; i < d->nfields; i++) {
        idemproxy__v1__field__init(&fields[i]);
        fields[i].name = names[i];
        fields[i].value.data = (uint8_t *)d->fields[i].value;
        fields[i].value.len = d->fields[i].value_len;
        ptrs[i] = &fields[i];
    }
    m->n_fields = d->nfields;
    m->fields = ptrs;
    m->payload.data = (uint8_t *)d->payload;
    m->payload.len = d->payload_len;
    m->attempt = d->attempt;
    m->fencing_token = d->fencing_token;
    m->deadline_unix_ms = d->deadline_unix_ms;
    if (d->traceparent) m->traceparent = (char *)d->traceparent;
    if (d->tracestate) m->tracestate = (char *)d->tracestate;
    if (d->lock) m->lock = (char *)d->lock;
}

/* Scratch reused across deliveries, so encoding allocates only when a
 * delivery has more fields or longer names than any before it. protobuf-c
 * wants NUL-terminated names; stream field names are binary-safe, so they are
 * copied into one block. */
static struct {
    Idemproxy__V1__Field *fields;
    Idemproxy__V1__Field **ptrs;
    char **names;
    size_t cap;
    px_buf text;
} scratch;

static size_t encode(const px_delivery_view *d, px_buf *out)
{
    if (scratch.cap < d->nfields) {
        scratch.cap = d->nfields;
        scratch.fields = px_realloc(scratch.fields, sizeof(*scratch.fields) * scratch.cap);
        scratch.ptrs = px_realloc(scratch.ptrs, sizeof(*scratch.ptrs) * scratch.cap);
        scratch.names = px_realloc(scratch.names, sizeof(*scratch.names) * scratch.cap);
    }
    px_buf_reset(&scratch.text);
    for (size_t i = 0; i < d->nfields; i++) {
        px_buf_append(&scratch.text, d->fields[i].name, d->fields[i].name_len);
        px_buf_append(&scratch.text, "", 1);
    }
    for (size_t i = 0, off = 0; i < d->nfields; i++) { /* the block no longer moves */
        scratch.names[i] = scratch.text.data + off;
        off += d->fields[i].name_len + 1;
    }
    Idemproxy__V1__Delivery m;
    delivery_fill(d, &m, scratch.fields, scratch.ptrs, scratch.names);
    size_t size = idemproxy__v1__delivery__get_packed_size(&m);
    if (out) {
        px_buf_reset(out);
        px_buf_reserve(out, size);
        idemproxy__v1__delivery__pack(&m, (uint8_t *)out->data);
        out->len = size;
    }
    return size;
}

size_t px_codec_delivery_size(const px_delivery_view *d)
{
    return encode(d, NULL);
}

void px_codec_delivery_encode(const px_delivery_view *d, px_buf *out)
{
    encode(d, out);
}

/* Acks are unpacked into a static scratch area: an Ack is a few short
 * strings, so no malloc per ack; a larger one (a long reason) spills to the
 * heap. The proxy is single-threaded, and each Ack is freed before the next. */
static _Alignas(16) unsigned char ack_scratch[4096];
static size_t ack_used;

static void *ack_alloc(void *data, size_t size)
{
    (void)data;
    size = (size + 15) & ~(size_t)15;
    if (size <= sizeof(ack_scratch) - ack_used) {
        void *p = ack_scratch + ack_used;
        ack_used += size;
        return p;
    }
    return malloc(size);
}

static void ack_free(void *data, void *p)
{
    (void)data;
    if ((unsigned char *)p < ack_scratch || (unsigned char *)p >= ack_scratch + sizeof(ack_scratch))
        free(p);
}

static ProtobufCAllocator ack_allocator = { ack_alloc, ack_free, NULL };

px_ack_status px_codec_ack_decode(const void *data, size_t len, const char *stream,
                                  const char *entry_id, char *reason, size_t reason_size,
                                  const char **why, uint32_t *retry_after_ms)
{
    reason[0] = '\0';
    *why = NULL;
    *retry_after_ms = 0;
    ack_used = 0;
    Idemproxy__V1__Ack *a = idemproxy__v1__ack__unpack(&ack_allocator, len, data);
    if (a == NULL) {
        *why = "reply is not a protobuf Ack";
        return PX_ACK_INVALID;
    }
    px_ack_status st = PX_ACK_INVALID;
    switch (a->status) {
    case IDEMPROXY__V1__ACK__STATUS__ACK: st = PX_ACK_ACK; break;
    case IDEMPROXY__V1__ACK__STATUS__RETRY: st = PX_ACK_RETRY; break;
    case IDEMPROXY__V1__ACK__STATUS__DROP: st = PX_ACK_DROP; break;
    default: *why = "ack status is unspecified"; break;
    }
    if (st != PX_ACK_INVALID && a->stream && a->stream[0] && strcmp(a->stream, stream) != 0) {
        *why = "ack echoes another stream";
        st = PX_ACK_INVALID;
    }
    if (st != PX_ACK_INVALID && a->entry_id && a->entry_id[0] && strcmp(a->entry_id, entry_id) != 0) {
        *why = "ack echoes another entry id";
        st = PX_ACK_INVALID;
    }
    if (st == PX_ACK_RETRY) *retry_after_ms = a->retry_after_ms;
    if (a->reason) {
        size_t n = strlen(a->reason);
        if (n > reason_size - 1) { /* cut at a character boundary */
            n = reason_size - 1;
            while (n > 0 && ((unsigned char)a->reason[n] & 0xC0) == 0x80) n--;
        }
        memcpy(reason, a->reason, n);
        reason[n] = '\0';
    }
    idemproxy__v1__ack__free_unpacked(a, &ack_allocator);
    return st;
}
