/*
 * fuzz_event.c - libFuzzer target for the JSON-to-key path (proxy/event.c,
 * docs/configuration.md and docs/guarantee.md): px_event_prepare on a stream
 * entry built from the input.
 *
 * Input: one header byte, then the entry's bytes split at 0x1f bytes.
 *   header bit 0     payload mode: payload_field is "payload", and the first
 *                    piece is that field's value; else the fields are the event
 *   header bit 1     max_entry_bytes is 64 instead of 1 MiB
 *   header bits 2-4  which key template (keys[] below)
 *   header bits 5-6  which lock_key template (locks[] below; 0: none)
 *   header bit 7     payload mode: the field is called "Payload" (so missing)
 * The remaining pieces are name, value, name, value, ...; a name without a
 * value gets "". Names and values may hold any other byte, NUL included, as
 * Redis field names and values do. The entry is laid out the way
 * px_entry_create lays it out: one blob, every name and value NUL-terminated.
 *
 * Checks beyond "no crash, no leak, no undefined behaviour":
 * - PX_ERR comes with a reason; PX_OK with a non-empty, UTF-8 key, and a lock
 *   key exactly when lock_key is configured;
 * - in payload mode, a payload event.c accepts is one JSON object followed by
 *   JSON whitespace only, and the keys it gives are byte for byte what
 *   px_template_render gives over that object (so nothing in between, such
 *   as copying the key, changes it);
 * - the JSON scanner (jscan.c) agrees with json-c wherever it answers: the
 *   member "eventId" it finds in a payload is json-c's, byte for byte.
 *
 * px_event_prepare takes the stream's config and max_entry_bytes, and reads
 * only the entry's id, fields, payload_idx and bytes; no px_proxy_* function
 * is linked.
 */
#include <string.h>

#include "fuzz.h"
#include "jscan.h"
#include "event.h"

#define SEP 0x1f

static const char *const keys[8] = {
    "#event.eventId",
    "room:#{event.roomId}:#{event.winner?.name ?: 'nobody'}",
    "#event.winner.name + '/' + #event.seq",
    "#{fields.eventId}-#{stream}-#{id}",
    "#event['dotted.name'] ?: #event.a?.b?.c",
    "#event.items[0]['id'] ?: #event.items[0]",
    "#fields['payload'] ?: #root.eventId()",
    "#event.eventId + #event.roomId + #event.price",
};
static const char *const locks[4] = {
    NULL,
    "lock:game:room:#{event.roomId}",
    "#event.a.b ?: #id",
    "#{event.winner?.team?.id}",
};

/* Other spellings of keys[0] that px_template_simple_member also sees as one
 * property of #event (so they take the fast path too); picked by the length. */
static const char *const simple_keys[4] = {
    "#event.eventId", "#root.eventId()", "#{event.eventId}", "#event?.eventId",
};

static px_template *key_tpl[8], *lock_tpl[4], *simple_tpl[4];

/* A Redis key name is prefix + key, or prefix + "{" + key + "}" with hash_tag. */
static void check_name(const px_stream_conf *sc, const char *name, size_t len, const char *prefix,
                       const char *key)
{
    char want[4096];
    int n = snprintf(want, sizeof(want), sc->hash_tag ? "%s{%s}" : "%s%s", prefix, key);
    if (n >= (int)sizeof(want)) return;
    FUZZ_CHECK(len == (size_t)n && strlen(name) == len && memcmp(name, want, len) == 0,
               "key name '%s' (%zu), want '%s'", name, len, want);
}

static px_template *compile(const char *src)
{
    char err[256];
    px_template *t = px_template_compile(src, err, sizeof(err), NULL);
    if (t == NULL) {
        fprintf(stderr, "fuzz_event: '%s' does not compile: %s\n", src, err);
        abort();
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (size_t i = 0; i < 8; i++) key_tpl[i] = compile(keys[i]);
    for (size_t i = 1; i < 4; i++) lock_tpl[i] = compile(locks[i]);
    for (size_t i = 0; i < 4; i++) simple_tpl[i] = compile(simple_keys[i]);
    return 0;
}

/* The reference: parse 'v' ('n' bytes) as event.c promises to
 * (docs/guarantee.md: one JSON object, strict, nothing but whitespace after
 * it); NULL when it is not. */
static json_object *payload_reference(const char *v, size_t n)
{
    json_tokener *tok = json_tokener_new();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *o = json_tokener_parse_ex(tok, v, (int)n);
    size_t end = json_tokener_get_parse_end(tok);
    bool ok = o != NULL && json_tokener_get_error(tok) == json_tokener_success &&
              json_object_is_type(o, json_type_object);
    json_tokener_free(tok);
    for (size_t i = end; ok && i < n; i++)
        if (v[i] != ' ' && v[i] != '\t' && v[i] != '\r' && v[i] != '\n') ok = false;
    if (!ok) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* Render 't' over the reference event and compare with what event.c gave. */
static void check_same_key(const px_entry *e, const px_stream_conf *sc, const px_template *t,
                           json_object *event, const char *got, const char *what)
{
    static px_buf ref;
    char err[256];
    json_object *fields = json_object_new_object();
    for (size_t i = 0; i < e->nfields; i++)
        json_object_object_add(fields, e->fields[i].name,
                               json_object_new_string_len(e->fields[i].value,
                                                          (int)e->fields[i].value_len));
    px_tvars vars = { event, fields, sc->stream, e->id };
    int rc = px_template_render(t, &vars, &ref, err, sizeof(err));
    json_object_put(fields);
    FUZZ_CHECK(rc == PX_OK, "%s renders in event.c but not over the same event: %s", what, err);
    /* Known (key-nul): a NUL in the rendered key ("\u0000" in the JSON) cuts
     * the key short, so different events can share one key. */
    if (memchr(ref.data, '\0', ref.len) && fuzz_known("key-nul")) return;
    FUZZ_CHECK(strlen(got) == ref.len && memcmp(got, ref.data, ref.len) == 0,
               "%s is '%s' (%zu bytes), the template renders %zu bytes", what, got,
               strlen(got), ref.len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    unsigned h = data[0];
    bool payload_mode = h & 1;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;

    px_stream_conf sc;
    memset(&sc, 0, sizeof(sc));
    long long max_entry_bytes = (h & 2) ? 64 : 1048576;
    static char stream[] = "room", payload[] = "payload";
    sc.stream = stream;
    sc.payload_field = payload_mode ? payload : NULL;
    sc.key_tpl = key_tpl[(h >> 2) & 7];
    if (sc.key_tpl == key_tpl[0]) sc.key_tpl = simple_tpl[(size >> 2) & 3];
    sc.lock_tpl = lock_tpl[(h >> 5) & 3];
    /* The header byte is spent; the input's length picks the layout and hash_tag. */
    static char prefix[] = "idem:", lock_prefix[] = "lock:", done_prefix[] = "done:";
    sc.layout = (size & 1) ? PX_LAYOUT_SPLIT : PX_LAYOUT_SINGLE;
    sc.hash_tag = size & 2;
    sc.prefix = prefix;
    sc.lock_prefix = lock_prefix;
    sc.done_prefix = done_prefix;

    /* The pieces: [payload] name value name value ... */
    size_t npieces = 1;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)in[i] == SEP) npieces++;
    const char **piece = malloc(sizeof(*piece) * (npieces + 2));
    size_t *plen = malloc(sizeof(*plen) * (npieces + 2));
    size_t k = 0, start = 0;
    if (payload_mode) {
        piece[k] = (h & 0x80) ? "Payload" : "payload";
        plen[k++] = 7;
    }
    for (size_t i = 0; i <= n; i++) {
        if (i == n || (unsigned char)in[i] == SEP) {
            piece[k] = in + start;
            plen[k++] = i - start;
            start = i + 1;
        }
    }
    if (k % 2) { piece[k] = ""; plen[k++] = 0; }

    /* The entry, laid out as px_entry_create does. */
    static const char id[] = "1700000000000-0";
    size_t nf = k / 2, bytes = 0;
    for (size_t i = 0; i < k; i++) bytes += plen[i] + 1;
    px_entry *e = calloc(1, sizeof(*e));
    e->payload_idx = -1;
    e->blob = malloc(sizeof(id) + bytes);
    e->fields = calloc(nf ? nf : 1, sizeof(px_field));
    e->nfields = nf;
    char *p = e->blob;
    memcpy(p, id, sizeof(id));
    e->id = p;
    p += sizeof(id);
    for (size_t i = 0; i < nf; i++) {
        e->fields[i].name = p;
        e->fields[i].name_len = plen[2 * i];
        memcpy(p, piece[2 * i], plen[2 * i]);
        p[plen[2 * i]] = '\0';
        p += plen[2 * i] + 1;
        e->fields[i].value = p;
        e->fields[i].value_len = plen[2 * i + 1];
        memcpy(p, piece[2 * i + 1], plen[2 * i + 1]);
        p[plen[2 * i + 1]] = '\0';
        p += plen[2 * i + 1] + 1;
        e->bytes += plen[2 * i] + plen[2 * i + 1];
        if (sc.payload_field && e->payload_idx < 0 &&
            strcmp(e->fields[i].name, sc.payload_field) == 0)
            e->payload_idx = (int)i;
    }
    free(piece);
    free(plen);

    size_t whylen = 512;
    char *why = malloc(whylen);
    why[0] = '\0';
    int rc = px_event_prepare(e, &sc, max_entry_bytes, why, whylen);
    FUZZ_CHECK(rc == PX_OK || rc == PX_ERR, "rc %d", rc);
    if (rc == PX_ERR) {
        FUZZ_CHECK(why[0] != '\0', "bad input without a reason");
        /* a dead letter's reason and a log line's text: cut between characters */
        FUZZ_CHECK(px_utf8_valid(why, strlen(why)), "a reason that is not UTF-8: %s", why);
    } else {
        FUZZ_CHECK(e->key != NULL, "PX_OK without a key");
        FUZZ_CHECK(e->key[0] != '\0' || fuzz_known("key-nul"), "PX_OK with an empty key");
        FUZZ_CHECK(px_utf8_valid(e->key, strlen(e->key)), "key is not UTF-8");
        FUZZ_CHECK(strlen(e->key) <= PX_KEY_MAX_BYTES, "a key of %zu bytes", strlen(e->key));
        FUZZ_CHECK(e->lock_key == NULL || strlen(e->lock_key) <= PX_KEY_MAX_BYTES,
                   "a lock key of %zu bytes", strlen(e->lock_key));
        FUZZ_CHECK((e->lock_key != NULL) == (sc.lock_tpl != NULL), "lock key %s",
                   e->lock_key ? "without lock_key" : "missing");
        if (e->lock_key)
            FUZZ_CHECK(px_utf8_valid(e->lock_key, strlen(e->lock_key)), "lock key not UTF-8");
        check_name(&sc, e->lock_name, e->lock_name_len,
                   sc.layout == PX_LAYOUT_SPLIT ? lock_prefix : prefix, e->key);
        check_name(&sc, e->done_name, e->done_name_len,
                   sc.layout == PX_LAYOUT_SPLIT ? done_prefix : prefix, e->key);
        if (payload_mode) {
            const px_field *pf = &e->fields[e->payload_idx];
            json_object *ref = payload_reference(pf->value, pf->value_len);
            /* Known (trailing-nul): NUL bytes after the object pass for whitespace. */
            if (ref == NULL && fuzz_known("trailing-nul")) goto out;
            FUZZ_CHECK(ref != NULL, "payload of %zu bytes accepted, but it is not one JSON "
                       "object followed by whitespace", pf->value_len);
            check_same_key(e, &sc, sc.key_tpl, ref, e->key, "key");
            if (e->lock_key) check_same_key(e, &sc, sc.lock_tpl, ref, e->lock_key, "lock key");
            json_object_put(ref);
        }
    }
    /* The JSON scanner agrees with json-c wherever it answers: a member it
     * finds is in the object json-c reads, a string of exactly those bytes. */
    if (payload_mode && e->payload_idx >= 0) {
        const px_field *pf = &e->fields[e->payload_idx];
        const char *v = NULL;
        size_t vlen = 0;
        if (px_jscan_member(pf->value, pf->value_len, "eventId", 7, &v, &vlen)) {
            json_object *ref = payload_reference(pf->value, pf->value_len), *m = NULL;
            FUZZ_CHECK(ref != NULL || fuzz_known("trailing-nul"),
                       "jscan found eventId in what json-c does not read as an object");
            if (ref) {
                FUZZ_CHECK(json_object_object_get_ex(ref, "eventId", &m) &&
                               json_object_is_type(m, json_type_string) &&
                               (size_t)json_object_get_string_len(m) == vlen &&
                               memcmp(json_object_get_string(m), v, vlen) == 0,
                           "jscan's eventId is not json-c's");
                json_object_put(ref);
            }
        }
    }
out:
    free(why);
    free(e->key);
    free(e->lock_key);
    free(e->fields);
    free(e->blob);
    free(e);
    return 0;
}
