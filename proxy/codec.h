/*
 * codec.h - the wire messages of docs/protocol.md, through protoc-c's generated
 * code. Encoding reuses one buffer; decoding an Ack copies what it needs and
 * frees the unpacked message before returning.
 */
#ifndef PX_CODEC_H
#define PX_CODEC_H

#include "px.h"

/* One stream field: borrowed bytes (ref). */
typedef struct px_field {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} px_field;

typedef struct px_delivery_view {
    const char *stream;     /* (ref) */
    const char *entry_id;   /* (ref) */
    const char *key;        /* (ref) */
    const px_field *fields; /* (ref) fields except the payload field */
    size_t nfields;
    const char *payload;
    size_t payload_len; /* (ref) */
    uint32_t attempt;
    uint64_t fencing_token;
    uint64_t deadline_unix_ms;
    const char *traceparent; /* (ref) NUL-terminated, or NULL for "" */
    const char *tracestate;  /* (ref) NUL-terminated, or NULL for "" */
    const char *lock;        /* (ref) NUL-terminated, or NULL for "": what fencing_token is for */
} px_delivery_view;

/* The size of the encoded Delivery, without encoding it. */
size_t px_codec_delivery_size(const px_delivery_view *d);

/* Encode 'd' into 'out' (reset first). */
void px_codec_delivery_encode(const px_delivery_view *d, px_buf *out);

typedef enum {
    PX_ACK_INVALID = 0,
    PX_ACK_ACK = 1,
    PX_ACK_RETRY = 2,
    PX_ACK_DROP = 3,
    PX_ACK_TIMEOUT = 4, /* not on the wire: no reply by ack_timeout_ms */
} px_ack_status;

/*
 * Decode an Ack from 'data' ('len' bytes) and check its echoes against
 * 'stream' and 'entry_id'. Returns the status; PX_ACK_INVALID when the bytes
 * do not decode, the status is unspecified or unknown, or an echo differs
 * (then 'why' says which). The reason is copied into 'reason' (truncated to
 * 'reason_size'), always NUL-terminated. '*retry_after_ms' is the Ack's
 * retry_after_ms (protocol 1.1; 0 when absent), for a RETRY.
 */
px_ack_status px_codec_ack_decode(const void *data, size_t len, const char *stream,
                                  const char *entry_id, char *reason, size_t reason_size,
                                  const char **why, uint32_t *retry_after_ms);

#endif
