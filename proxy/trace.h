/*
 * trace.h - OpenTelemetry spans of the sidecar (docs/configuration.md
 * `tracing`, docs/operations.md), exported over OTLP/HTTP in the OTLP JSON
 * encoding by libcurl's multi interface on the loop. Off (px_proxy.trace ==
 * NULL, the default) every hook is skipped by one branch in its caller, and
 * nothing here is initialised.
 *
 * Per entry a CONSUMER span "process <stream>" from read to outcome, a child of
 * the entry's trace_field when it holds a valid W3C traceparent, else a new root
 * sampled by sample_ratio; per delivery a PRODUCER span "send <stream>", a child
 * of it, whose context goes to the worker in Delivery.traceparent. An unsampled
 * trace is not exported, but its context still goes to the worker.
 */
#ifndef PX_TRACE_H
#define PX_TRACE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "config.h"
#include "entry.h"

#define PX_TRACEPARENT_LEN 55 /* "00-" 32 hex "-" 16 hex "-" 2 hex */

typedef struct px_trace_ctx {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t flags; /* bit 0: sampled */
} px_trace_ctx;

/* W3C traceparent, version 00 only: exactly 55 characters, lower-case hex,
 * trace and span ids not all zero. False (and *out untouched) for anything else. */
bool px_trace_parse(const char *s, size_t len, px_trace_ctx *out);
/* The header of 'c': PX_TRACEPARENT_LEN characters and a NUL. */
void px_trace_format(const px_trace_ctx *c, char out[PX_TRACEPARENT_LEN + 1]);

/* The entry's trace_field value and its "tracestate" field (refs into the
 * entry, NUL-terminated), each NULL when absent. */
void px_trace_fields(const px_entry *e, const char *trace_field, const char **tp, const char **ts);

/* Counters (metrics.c), always exported, 0 while tracing is off. */
extern unsigned long long px_spans_exported, px_spans_dropped, px_traceparents_invalid;

typedef struct px_trace px_trace;

/* Starts the exporter (libcurl is initialised here, and only here); NULL
 * with a logged reason when it cannot. */
px_trace *px_trace_create(struct ev_loop *loop, const px_config *conf);
/* Sends what is queued, waiting at most a second, then frees everything. */
void px_trace_destroy(px_trace *t);

/* The hooks; each is called only when tracing is on. */
void px_trace_entry_begin(px_trace *t, px_entry *e);
/* A delivery goes out: its span starts; *tp and *ts are the Delivery's
 * traceparent and tracestate (valid until the next call about 'e'). */
void px_trace_delivery_begin(px_trace *t, px_entry *e, const char **tp, const char **ts);
void px_trace_delivery_end(px_trace *t, px_entry *e, px_ack_status status);
void px_trace_entry_end(px_trace *t, px_entry *e, px_outcome outcome);
void px_trace_entry_free(px_entry *e); /* its span state, without a span */

#endif
