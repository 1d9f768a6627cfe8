/*
 * test_event.c - unit tests of event.c (docs/configuration.md,
 * docs/guarantee.md): an entry's fields become the event, its key and lock key
 * are rendered, and the Redis key names are laid out. px_event_prepare takes
 * the stream's config and max_entry_bytes, so no proxy or stream is built here:
 * only entries.
 *
 * The fast key path (one property of the payload, jscan.c) and the json-c
 * path must give the same keys; both are driven here on the same payloads.
 */
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "test.h"

#define MAX_BYTES 1048576

static char s_stream[] = "orders", s_payload[] = "payload", s_prefix[] = "idem:",
            s_lock[] = "lock:", s_done[] = "done:";

static px_template *compile(const char *src)
{
    char err[256];
    px_template *t = px_template_compile(src, err, sizeof(err), NULL);
    if (t == NULL) {
        fprintf(stderr, "'%s' does not compile: %s\n", src, err);
        exit(2);
    }
    return t;
}

/* A stream config with 'key' and 'lock' (or NULL); payload mode when 'payload'. */
static px_stream_conf conf(const char *key, const char *lock, bool payload)
{
    px_stream_conf sc;
    memset(&sc, 0, sizeof(sc));
    sc.stream = s_stream;
    sc.payload_field = payload ? s_payload : NULL;
    sc.prefix = s_prefix;
    sc.lock_prefix = s_lock;
    sc.done_prefix = s_done;
    sc.key_tpl = compile(key);
    sc.lock_tpl = lock ? compile(lock) : NULL;
    return sc;
}

static void conf_free(px_stream_conf *sc)
{
    px_template_destroy(sc->key_tpl);
    px_template_destroy(sc->lock_tpl);
}

/* An entry "1-0" with the fields name, value, ... ('n' strings), as
 * px_entry_create lays it out (the payload is the first field so named). */
static px_entry *entry(const px_stream_conf *sc, const char *const *kv, size_t n)
{
    static char id[] = "1-0";
    px_entry *e = calloc(1, sizeof(*e));
    e->id = id;
    e->payload_idx = -1;
    e->nfields = n / 2;
    e->fields = calloc(e->nfields ? e->nfields : 1, sizeof(px_field));
    for (size_t i = 0; i < e->nfields; i++) {
        e->fields[i].name = (char *)kv[2 * i];
        e->fields[i].name_len = strlen(kv[2 * i]);
        e->fields[i].value = (char *)kv[2 * i + 1];
        e->fields[i].value_len = strlen(kv[2 * i + 1]);
        e->bytes += e->fields[i].name_len + e->fields[i].value_len;
        if (sc->payload_field && e->payload_idx < 0 &&
            strcmp(e->fields[i].name, sc->payload_field) == 0)
            e->payload_idx = (int)i;
    }
    return e;
}

static void entry_free(px_entry *e)
{
    free(e->key);
    free(e->lock_key);
    free(e->fields);
    free(e);
}

/* Prepare an entry of the fields 'kv' under 'sc'; the key (or NULL) in
 * 'key', the reason (or "") in 'why'. Returns the entry (free it). */
static px_entry *prepare(const px_stream_conf *sc, const char *const *kv, size_t n, int *rc,
                         char *why, size_t whylen)
{
    px_entry *e = entry(sc, kv, n);
    why[0] = '\0';
    *rc = px_event_prepare(e, sc, MAX_BYTES, why, whylen);
    return e;
}

#define KV(...) (const char *const[]){ __VA_ARGS__ }, sizeof((const char *const[]){ __VA_ARGS__ }) / sizeof(char *)

/* The key of a payload, by the fast path (no lock_key) and by json-c (a
 * lock_key makes event.c parse), which must agree. */
static void check_payload_key(const char *tpl, const char *payload, const char *want)
{
    char why[512], label[512];
    int rc;
    px_stream_conf fast = conf(tpl, NULL, true), slow = conf(tpl, "#id", true);
    px_entry *a = prepare(&fast, KV("payload", payload, "other", "x"), &rc, why, sizeof(why));
    snprintf(label, sizeof(label), "'%s' over %s (fast path): %s", tpl, payload, why);
    test_cond(label, rc == PX_OK && a->key && strcmp(a->key, want) == 0);
    px_entry *b = prepare(&slow, KV("payload", payload, "other", "x"), &rc, why, sizeof(why));
    snprintf(label, sizeof(label), "'%s' over %s (json-c): %s", tpl, payload, why);
    test_cond(label, rc == PX_OK && b->key && strcmp(b->key, want) == 0 && b->lock_key &&
                     strcmp(b->lock_key, "1-0") == 0);
    entry_free(a);
    entry_free(b);
    conf_free(&fast);
    conf_free(&slow);
}

static void test_payload_keys(void)
{
    const char *simple[] = { "#event.eventId", "#root.eventId", "#event.eventId()",
                             "#{event.eventId}", "#event?.eventId" };
    for (size_t i = 0; i < sizeof(simple) / sizeof(simple[0]); i++) {
        check_payload_key(simple[i], "{\"eventId\":\"e-1\"}", "e-1");
        check_payload_key(simple[i], " {\"a\":[1,{\"b\":null}], \"eventId\" : \"e-1\"}\n", "e-1");
        /* where the fast path is unsure, json-c decides */
        check_payload_key(simple[i], "{\"eventId\":\"caf\\u00e9\"}", "caf\xc3\xa9");
        check_payload_key(simple[i], "{\"eventId\":\"a\",\"eventId\":\"b\"}", "b");
        check_payload_key(simple[i], "{\"eventId\":42}", "42");
        check_payload_key(simple[i], "{\"eventId\":1.50}", "1.50");
        check_payload_key(simple[i], "{\"event\\u0049d\":\"esc\"}", "esc");
    }
    check_payload_key("k:#{event.eventId}", "{\"eventId\":\"e-1\"}", "k:e-1");
    check_payload_key("#event.fieldsX", "{\"fieldsX\":\"v\"}", "v");
}

/* Payloads that give no key are bad input, with a reason, on both paths. */
static void check_bad_payload(const char *payload, const char *reason)
{
    char why[512], label[512];
    int rc;
    for (int slow = 0; slow < 2; slow++) {
        px_stream_conf sc = conf("#event.eventId", slow ? "#id" : NULL, true);
        px_entry *e = prepare(&sc, KV("payload", payload), &rc, why, sizeof(why));
        snprintf(label, sizeof(label), "%s is bad input (%s): got '%s'", payload,
                 slow ? "json-c" : "fast path", why);
        test_cond(label, rc == PX_ERR && strstr(why, reason) != NULL && e->key == NULL);
        entry_free(e);
        conf_free(&sc);
    }
}

static void test_bad_payloads(void)
{
    check_bad_payload("{\"eventId\":\"\"}", "renders an empty string");
    check_bad_payload("{\"other\":\"x\"}", "key '#event.eventId'");
    check_bad_payload("{\"eventId\":null}", "key '#event.eventId'");
    check_bad_payload("{\"eventId\":\"x\"", "payload is not JSON");
    check_bad_payload("{\"eventId\":\"x\"} y", "payload is not JSON");
    /* issue 33: what was found, where, and the text around it, escaped and short */
    check_bad_payload("not json",
                      "payload is not JSON: unexpected 'o' at byte 1 (null expected): \"not json\"");
    check_bad_payload("{\"eventId\":\"x\"",
                      "payload is not JSON: it ends at byte 14, incomplete: \"{\\\"eventId\\\":\\\"x\\\"\"");
    check_bad_payload("{\"eventId\":\"x\"} y",
                      "payload is not JSON: unexpected 'y' at byte 16 (unexpected character): \"{\\\"eventId\\\":\\\"x\\\"} y\"");
    check_bad_payload("", "payload is not JSON: it is empty");
    check_bad_payload(" \n", "payload is not JSON: it is empty");
    check_bad_payload("{\"eventId\":\"0123456789abcdefghijklmnopqrstuvwxyz\",\x1b}",
                      "unexpected '\\x1b' at byte 50 (quoted object property name expected): "
                      "...\"mnopqrstuvwxyz\\\",\\u001b}\"");
    check_bad_payload("{\"eventId\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\", x",
                      "unexpected 'x' at byte 35 (quoted object property name expected): "
                      "...\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\\\", x\"");
    check_bad_payload("[\"x\"]", "not an object");
    check_bad_payload("{\"eventId\":\"a\\u0000b\"}", "NUL character");
    check_bad_payload("{\"eventId\":\"\xff\"}", "not UTF-8");

    char why[512];
    int rc;
    px_stream_conf sc = conf("#event.eventId", NULL, true);
    px_entry *e = prepare(&sc, KV("other", "{\"eventId\":\"x\"}"), &rc, why, sizeof(why));
    test_streq("no payload field", why, "no payload field 'payload'");
    test_cond("no payload field: bad input", rc == PX_ERR && e->key == NULL);
    entry_free(e);

    e = entry(&sc, KV("payload", "{\"eventId\":\"x\"}"));
    rc = px_event_prepare(e, &sc, 10, why, sizeof(why));
    test_cond("over max_entry_bytes", rc == PX_ERR && strstr(why, "over max_entry_bytes 10"));
    entry_free(e);

    e = prepare(&sc, KV("\xff", "v", "payload", "{\"eventId\":\"x\"}"), &rc, why, sizeof(why));
    test_cond("a field name that is not UTF-8", rc == PX_ERR && strstr(why, "not UTF-8"));
    entry_free(e);
    conf_free(&sc);
}

/* Without payload_field the fields are the event, dotted names nested. */
static void test_fields_mode(void)
{
    static const struct { const char *tpl, *want; } cases[] = {
        { "#event.eventId",                             "f-1" },
        { "#event.winner.name",                         "ann" },
        { "#event['winner.name'] ?: 'flat'",            "flat" },
        { "#{fields['winner.name']}-#{stream}-#{id}",  "ann-orders-1-0" },
        { "#fields.eventId",                            "f-1" },
        { "#event.fieldsX",                             "fx" },   /* #event, not #fields */
        { "#fields.fieldsX",                            "fx" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char why[512];
        int rc;
        px_stream_conf sc = conf(cases[i].tpl, NULL, false);
        px_entry *e = prepare(&sc, KV("eventId", "f-1", "winner.name", "ann", "fieldsX", "fx"),
                              &rc, why, sizeof(why));
        test_cond(cases[i].tpl, rc == PX_OK);
        test_streq(cases[i].tpl, e->key, cases[i].want);
        entry_free(e);
        conf_free(&sc);
    }
}

/* A dotted name nests one object per part: at most as deep as a payload's JSON
 * may be (31 objects with the event itself), else bad input. 250,000 parts
 * once built 250,000 nested objects, and json-c's recursive free overflowed
 * the stack (issue 37). */
static void test_deep_dotted_name(void)
{
    char why[512];
    int rc;
    px_stream_conf sc = conf("#event.eventId", NULL, false);
    for (size_t parts = 30; parts <= 33; parts++) {
        char name[200] = "", label[64];
        for (size_t i = 0; i < parts; i++) strcat(name, i ? ".a" : "a");
        px_entry *e = prepare(&sc, KV("eventId", "d-1", name, "v"), &rc, why, sizeof(why));
        snprintf(label, sizeof(label), "a name of %zu parts: %s", parts, why);
        if (parts <= 31)
            test_cond(label, rc == PX_OK && strcmp(e->key, "d-1") == 0);
        else
            test_cond(label, rc == PX_ERR && e->key == NULL &&
                                 strstr(why, "field name 1 nests deeper than 31 objects"));
        entry_free(e);
    }
    conf_free(&sc);

    /* the template reads as deep as a name may nest */
    char tpl[200] = "#event", name[200] = "";
    for (int i = 0; i < 31; i++) {
        strcat(tpl, ".a");
        strcat(name, i ? ".a" : "a");
    }
    sc = conf(tpl, NULL, false);
    px_entry *e = prepare(&sc, KV(name, "deep"), &rc, why, sizeof(why));
    test_cond("31 parts read back", rc == PX_OK && strcmp(e->key, "deep") == 0);
    entry_free(e);
    conf_free(&sc);

    size_t n = 250000;
    char *huge = malloc(2 * n);
    for (size_t i = 0; i < n; i++) memcpy(huge + 2 * i, "a.", 2);
    huge[2 * n - 1] = '\0';
    sc = conf("#event.eventId", NULL, false);
    e = prepare(&sc, KV("eventId", "d-2", huge, "v"), &rc, why, sizeof(why));
    test_cond("a name of 250,000 parts is bad input", rc == PX_ERR && e->key == NULL &&
                                                      strstr(why, "nests deeper than 31"));
    entry_free(e);
    conf_free(&sc);
    free(huge);
}

/* A reason cut by the end of its buffer is cut between characters: it is a
 * dead letter's reason and a log line's text (issue 37). */
static void test_reason_cut_between_characters(void)
{
    for (int shift = 0; shift < 4; shift++) {
        char tpl[1200] = "#event.", why[512], label[64];
        int rc;
        for (int i = 0; i < shift; i++) strcat(tpl, "x");
        for (int i = 0; i < 300; i++) strcat(tpl, "\xe2\x82\xac"); /* € */
        px_stream_conf sc = conf(tpl, NULL, true);
        px_entry *e = prepare(&sc, KV("payload", "{}"), &rc, why, sizeof(why));
        snprintf(label, sizeof(label), "a cut reason is UTF-8 (shift %d)", shift);
        test_cond(label, rc == PX_ERR && strlen(why) > 500 && px_utf8_valid(why, strlen(why)));
        entry_free(e);
        conf_free(&sc);
    }
}

/* A key (or lock_key) over PX_KEY_MAX_BYTES is bad input on both paths, its
 * reason giving the length: one producer's 1 MiB key would otherwise live in
 * Redis for done_ttl_ms. The limit itself is a key. */
static void test_key_length_cap(void)
{
    static char payload[8192], big[PX_KEY_MAX_BYTES + 2], why[512], label[256];
    int rc;
    for (size_t n = PX_KEY_MAX_BYTES; n <= PX_KEY_MAX_BYTES + 1; n++) {
        memset(big, 'k', n);
        big[n] = '\0';
        snprintf(payload, sizeof(payload), "{\"eventId\":\"%s\"}", big);
        for (int slow = 0; slow < 2; slow++) {
            px_stream_conf sc = conf("#event.eventId", slow ? "#id" : NULL, true);
            px_entry *e = prepare(&sc, KV("payload", payload), &rc, why, sizeof(why));
            snprintf(label, sizeof(label), "a key of %zu bytes (%s): %s", n,
                     slow ? "json-c" : "fast path", why);
            if (n == PX_KEY_MAX_BYTES)
                test_cond(label, rc == PX_OK && e->key && strlen(e->key) == n);
            else
                test_cond(label, rc == PX_ERR && e->key == NULL &&
                                     strstr(why, "key '#event.eventId' renders 1025 bytes, "
                                                 "over the limit of 1024"));
            entry_free(e);
            conf_free(&sc);
        }
    }
    /* lock_key likewise; fields mode likewise */
    snprintf(payload, sizeof(payload), "{\"a\":\"x\",\"eventId\":\"%s\"}", big);
    px_stream_conf sc = conf("#event.a", "#event.eventId", true);
    px_entry *e = prepare(&sc, KV("payload", payload), &rc, why, sizeof(why));
    test_cond("a lock_key over the limit", rc == PX_ERR && strstr(why, "lock_key '#event.eventId' "
                                                                     "renders 1025 bytes"));
    entry_free(e);
    conf_free(&sc);
    sc = conf("#event.id", NULL, false);
    e = prepare(&sc, KV("id", big), &rc, why, sizeof(why));
    test_cond("fields mode: a key over the limit", rc == PX_ERR && strstr(why, "renders 1025 bytes"));
    entry_free(e);
    conf_free(&sc);
}

/* The Redis key names: prefix + key, or split prefixes, '{key}' with hash_tag. */
static void test_names(void)
{
    static const struct { px_layout layout; bool tag; const char *lock, *done; } cases[] = {
        { PX_LAYOUT_SINGLE, false, "idem:e-1",   "idem:e-1" },
        { PX_LAYOUT_SINGLE, true,  "idem:{e-1}", "idem:{e-1}" },
        { PX_LAYOUT_SPLIT,  false, "lock:e-1",   "done:e-1" },
        { PX_LAYOUT_SPLIT,  true,  "lock:{e-1}", "done:{e-1}" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int slow = 0; slow < 2; slow++) {
            char why[512];
            int rc;
            px_stream_conf sc = conf("#event.eventId", slow ? "#id" : NULL, true);
            sc.layout = cases[i].layout;
            sc.hash_tag = cases[i].tag;
            px_entry *e = prepare(&sc, KV("payload", "{\"eventId\":\"e-1\"}"), &rc, why, sizeof(why));
            test_cond("names: prepared", rc == PX_OK);
            test_streq("names: key", e->key, "e-1");
            test_streq("names: lock name", e->lock_name, cases[i].lock);
            test_streq("names: done name", e->done_name, cases[i].done);
            test_cond("names: lengths", e->lock_name_len == strlen(cases[i].lock) &&
                                        e->done_name_len == strlen(cases[i].done));
            test_cond("names: single layout shares one name",
                      (cases[i].layout == PX_LAYOUT_SINGLE) == (e->lock_name == e->done_name));
            entry_free(e);
            conf_free(&sc);
        }
    }
}

/* The fingerprint (issue 31): the whole event hashed in its canonical form,
 * so members in another order hash the same; another value does not; one
 * that cannot be rendered is bad input, with its template in the reason. */
static void test_fingerprint(void)
{
    px_stream_conf sc = conf("#event.eventId", NULL, true);
    sc.fp_tpl = compile("#event");
    char why[256];
    int rc;
    px_entry *a = prepare(&sc, KV("payload", "{\"eventId\":\"e1\",\"amount\":5,\"o\":{\"x\":1,\"y\":2}}"),
                          &rc, why, sizeof(why));
    test_cond("fingerprint: rendered", rc == PX_OK && a->has_fp && strcmp(a->key, "e1") == 0);
    px_entry *b = prepare(&sc, KV("payload", "{\"o\":{\"y\":2,\"x\":1},\"amount\":5,\"eventId\":\"e1\"}"),
                          &rc, why, sizeof(why));
    test_cond("fingerprint: another member order, the same", rc == PX_OK && b->fp == a->fp);
    px_entry *c = prepare(&sc, KV("payload", "{\"eventId\":\"e1\",\"amount\":999,\"o\":{\"x\":1,\"y\":2}}"),
                          &rc, why, sizeof(why));
    test_cond("fingerprint: another amount, another", rc == PX_OK && c->fp != a->fp);
    entry_free(a);
    entry_free(b);
    entry_free(c);
    px_template_destroy(sc.fp_tpl);
    sc.fp_tpl = compile("#event.amount");
    a = prepare(&sc, KV("payload", "{\"eventId\":\"e1\"}"), &rc, why, sizeof(why));
    test_cond("fingerprint: missing is bad input",
              rc == PX_ERR && strncmp(why, "fingerprint '#event.amount': ", 29) == 0);
    entry_free(a);
    px_template_destroy(sc.fp_tpl);
    sc.fp_tpl = NULL;
    a = prepare(&sc, KV("payload", "{\"eventId\":\"e1\"}"), &rc, why, sizeof(why));
    test_cond("no fingerprint: none", rc == PX_OK && !a->has_fp);
    entry_free(a);
    conf_free(&sc);
}

int main(void)
{
    test_payload_keys();
    test_bad_payloads();
    test_fields_mode();
    test_deep_dotted_name();
    test_reason_cut_between_characters();
    test_names();
    test_fingerprint();
    test_key_length_cap();
    return test_report();
}
