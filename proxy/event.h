/*
 * event.h - an entry's event and the names of its keys (event.c).
 */
#ifndef PX_EVENT_H
#define PX_EVENT_H

#include "proxy.h"

/* The longest key or lock_key a template may render, in bytes: a longer one
 * is bad input (docs/configuration.md, "key"). A key lives in Redis for
 * done_ttl_ms, so one producer's 1 MiB key would hold that memory as long. */
#define PX_KEY_MAX_BYTES 1024

/* Parse the entry and render its keys; PX_ERR with 'why' for bad input.
 * Reads the entry's id, fields, nfields, payload_idx and bytes, and 'sc' (the
 * templates, payload_field, stream name and key layout), never e->st; sets
 * e->key, lock_name, done_name (and their lengths) and lock_key. */
int px_event_prepare(px_entry *e, const px_stream_conf *sc, long long max_entry_bytes, char *why,
                     size_t whylen);
/* Set e->key to 'key' ('n' bytes) and the names of its Redis keys (lock_name,
 * done_name, with their lengths) as 'sc' lays them out: the one place those
 * names are made (the operator commands in ops.c use it too). */
void px_event_set_key(px_entry *e, const px_stream_conf *sc, const char *key, size_t n);

#endif
