/*
 * event.c - turn a stream entry into the event a template sees, and render
 * its dedup key and lock key (docs/configuration.md, docs/guarantee.md).
 *
 * The event is the payload field's JSON object when 'payload_field' is set,
 * else the entry's fields, where dotted names ("winner.name", as Spring Data's
 * hash mappers write them) become nested objects. Anything that cannot give a
 * usable key is bad input: the caller applies on_missing_key.
 */
#include <string.h>

#include "event.h"
#include "jscan.h"

/* How deep a payload's JSON may nest (json-c's default, given explicitly):
 * 31 objects or arrays. A dotted name nests no deeper, so no event is a tree
 * deeper than this: json-c frees and prints trees recursively. */
#define PX_JSON_MAX_DEPTH JSON_TOKENER_DEFAULT_DEPTH

/* Put 'value' at the dotted path 'name' inside 'obj', creating objects on the way.
 * A path that runs into a non-object keeps the flat name instead. False when
 * the path would nest deeper than a payload may (value freed): a name of
 * 250,000 parts once overflowed the stack when json-c freed the tree. */
static bool put_dotted(json_object *obj, const char *name, json_object *value)
{
    const char *dot;
    json_object *cur = obj;
    const char *seg = name;
    int depth = 1; /* obj */
    while ((dot = strchr(seg, '.')) != NULL && dot != seg && dot[1] != '\0') {
        char part[256];
        size_t n = (size_t)(dot - seg);
        if (n >= sizeof(part)) break;
        memcpy(part, seg, n);
        part[n] = '\0';
        if (++depth >= PX_JSON_MAX_DEPTH) {
            json_object_put(value);
            return false;
        }
        json_object *next = NULL;
        if (!json_object_object_get_ex(cur, part, &next)) {
            next = json_object_new_object();
            json_object_object_add(cur, part, next);
        } else if (!json_object_is_type(next, json_type_object)) {
            json_object_object_add(obj, name, value);
            return true;
        }
        cur = next;
        seg = dot + 1;
    }
    json_object_object_add(cur, seg, value);
    return true;
}

/* Write one name at 'p', NUL-terminated; return the byte after it. */
static char *put_name(char *p, const char *prefix, const char *key, size_t n, bool tag)
{
    p = stpcpy(p, prefix);
    if (tag) *p++ = '{';
    memcpy(p, key, n);
    p += n;
    if (tag) *p++ = '}';
    *p = '\0';
    return p + 1;
}

/* The key and the names of its Redis keys, in one allocation made once per
 * entry: prefix + key, or prefix + "{" + key + "}" with hash_tag (one cluster
 * slot for a key's lock and done mark, whatever the prefixes). Layout single
 * has one name for both; split has lock_prefix + key and done_prefix + key. */
void px_event_set_key(px_entry *e, const px_stream_conf *sc, const char *key, size_t n)
{
    bool split = sc->layout == PX_LAYOUT_SPLIT, tag = sc->hash_tag;
    const char *lp = split ? sc->lock_prefix : sc->prefix;
    size_t ll = strlen(lp) + n + (tag ? 2 : 0);
    size_t dl = split ? strlen(sc->done_prefix) + n + (tag ? 2 : 0) : ll;
    char *p = px_malloc(n + 1 + ll + 1 + (split ? dl + 1 : 0));
    free(e->key);
    e->key = p;
    memcpy(p, key, n);
    p[n] = '\0';
    e->lock_name = p + n + 1;
    e->done_name = e->lock_name;
    p = put_name(p + n + 1, lp, key, n, tag);
    if (split) {
        e->done_name = p;
        put_name(p, sc->done_prefix, key, n, tag);
    }
    e->lock_name_len = ll;
    e->done_name_len = dl;
}

/* Render 'tpl' for 'e' into 'out', or false with 'why' filled (cut, if it
 * must be, between characters: the template quoted may be long). */
static bool render(const px_entry *e, const px_stream_conf *sc, const px_template *tpl,
                   json_object *event, json_object *fields, const char *what, px_buf *out,
                   char *why, size_t whylen)
{
    char err[256];
    px_tvars vars = { event, fields, sc->stream, e->id };
    const char *src = px_template_source(tpl);
    if (px_template_render(tpl, &vars, out, err, sizeof(err)) != PX_OK)
        snprintf(why, whylen, "%s '%s': %s", what, src, err);
    else if (memchr(out->data, '\0', out->len))
        /* Keys are C strings from here on: "a\u0000b" and "a\u0000c" would both
         * become "a" and one would be skipped as a copy (found by fuzz_event). */
        snprintf(why, whylen, "%s '%s' renders a NUL character", what, src);
    else if (out->len == 0)
        snprintf(why, whylen, "%s '%s' renders an empty string", what, src);
    else if (out->len > PX_KEY_MAX_BYTES)
        snprintf(why, whylen, "%s '%s' renders %zu bytes, over the limit of %d", what, src,
                 out->len, PX_KEY_MAX_BYTES);
    else if (!px_utf8_valid(out->data, out->len))
        snprintf(why, whylen, "%s '%s' renders text that is not UTF-8", what, src);
    else
        return true;
    px_utf8_cut_end(why);
    return false;
}

/* The reason for a payload json-c refused at byte 'at': what was found there,
 * and the text around it (escaped, at most 16 bytes either side). */
static void not_json(const char *s, size_t n, size_t at, const char *what, char *why,
                     size_t whylen)
{
    size_t from = at > 16 ? at - 16 : 0, to = n - at > 16 ? at + 16 : n;
    for (int k = 0; k < 3 && from > 0 && (s[from] & 0xC0) == 0x80; k++) from++; /* whole */
    for (int k = 0; k < 3 && to < n && (s[to] & 0xC0) == 0x80; k++) to--;       /* characters */
    px_buf ex = { 0 }, ch = { 0 };
    px_buf_escape(&ex, s + from, to - from, PX_ESC_JSON);
    px_buf_append(&ex, "", 1);
    if (at < n) {
        size_t cl = px_utf8_char(s + at, n - at);
        px_buf_escape(&ch, s + at, cl ? cl : 1, PX_ESC_BACKSLASH);
    }
    px_buf_append(&ch, "", 1);
    if (at >= n)
        snprintf(why, whylen, "payload is not JSON: it ends at byte %zu, incomplete: %s\"%s\"%s",
                 at, from ? "..." : "", ex.data, to < n ? "..." : "");
    else
        snprintf(why, whylen, "payload is not JSON: unexpected '%s' at byte %zu (%s): %s\"%s\"%s",
                 ch.data, at, what, from ? "..." : "", ex.data, to < n ? "..." : "");
    px_utf8_cut_end(why);
    px_buf_deinit(&ex);
    px_buf_deinit(&ch);
}

/* --- the fast path -----------------------------------------------------------
 * Most keys are one property of the payload object, "#event.eventId", whose
 * value is a plain string. For those, json-c's parse (a tree of allocations
 * and a locale switch per entry: over a third of the daemon's instructions
 * under load) is replaced by jscan.c's one pass, which gives up whenever it is
 * unsure; the entry then takes the json-c path, which decides. */

/* Set the key of a payload for a "#event.NAME" template, or false: use json-c. */
static bool fast_key(px_entry *e, const px_stream_conf *sc, const px_field *payload)
{
    size_t nlen, vn;
    const char *v, *name = px_template_simple_member(sc->key_tpl, &nlen);
    if (name == NULL || !px_jscan_member(payload->value, payload->value_len, name, nlen, &v, &vn) ||
        vn > PX_KEY_MAX_BYTES) /* json-c's path says why */
        return false;
    px_event_set_key(e, sc, v, vn);
    return true;
}

int px_event_prepare(px_entry *e, const px_stream_conf *sc, long long max_entry_bytes, char *why,
                     size_t whylen)
{
    /* #fields is built only for templates that read it. */
    bool want_fields = px_template_uses(sc->key_tpl, PX_TVAR_FIELDS) ||
                       (sc->lock_tpl && px_template_uses(sc->lock_tpl, PX_TVAR_FIELDS)) ||
                       (sc->fp_tpl && px_template_uses(sc->fp_tpl, PX_TVAR_FIELDS));
    json_object *fields = want_fields ? json_object_new_object() : NULL;
    json_object *event = NULL;
    int rc = PX_ERR;

    if ((long long)e->bytes > max_entry_bytes) {
        snprintf(why, whylen, "entry is %zu bytes, over max_entry_bytes %lld", e->bytes,
                 max_entry_bytes);
        goto done;
    }
    for (size_t i = 0; i < e->nfields; i++) {
        px_field *f = &e->fields[i];
        if (!px_utf8_valid(f->name, f->name_len)) {
            snprintf(why, whylen, "field name %zu is not UTF-8", i);
            goto done;
        }
        if (memchr(f->name, '\0', f->name_len)) {
            snprintf(why, whylen, "field name %zu holds a NUL character", i);
            goto done;
        }
        if (fields)
            json_object_object_add(fields, f->name,
                                   json_object_new_string_len(f->value, (int)f->value_len));
    }

    if (sc->payload_field) {
        if (e->payload_idx < 0) {
            snprintf(why, whylen, "no payload field '%s'", sc->payload_field);
            goto done;
        }
        px_field *p = &e->fields[e->payload_idx];
        if (sc->lock_tpl == NULL && sc->fp_tpl == NULL && fast_key(e, sc, p)) {
            rc = PX_OK;
            goto done;
        }
        /* A new tokener each time: json-c 0.16's json_tokener_reset keeps some
         * state (a pending \uD8xx surrogate), so a reused one can read the
         * next payload differently (fuzz_event found it). */
        json_tokener *tok = json_tokener_new_ex(PX_JSON_MAX_DEPTH);
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
        event = json_tokener_parse_ex(tok, p->value, (int)p->value_len);
        enum json_tokener_error jerr = json_tokener_get_error(tok);
        size_t used = json_tokener_get_parse_end(tok);
        json_tokener_free(tok);
        if (event == NULL || jerr != json_tokener_success) {
            size_t ws = 0;
            while (ws < p->value_len && strchr(" \t\r\n", p->value[ws]) && p->value[ws]) ws++;
            if (ws == p->value_len)
                snprintf(why, whylen, "payload is not JSON: it is empty");
            else
                not_json(p->value, p->value_len, jerr == json_tokener_continue ? p->value_len : used,
                         event ? "trailing data" : json_tokener_error_desc(jerr), why, whylen);
            goto done;
        }
        while (used < p->value_len && p->value[used] != '\0' && strchr(" \t\r\n", p->value[used]))
            used++;
        if (used != p->value_len) {
            not_json(p->value, p->value_len, used, "trailing data", why, whylen);
            goto done;
        }
        if (!json_object_is_type(event, json_type_object)) {
            snprintf(why, whylen, "payload is JSON but not an object");
            goto done;
        }
    } else {
        event = json_object_new_object();
        for (size_t i = 0; i < e->nfields; i++) {
            px_field *f = &e->fields[i];
            if (!put_dotted(event, f->name,
                            json_object_new_string_len(f->value, (int)f->value_len))) {
                snprintf(why, whylen, "field name %zu nests deeper than %d objects",
                         i, PX_JSON_MAX_DEPTH - 1);
                goto done;
            }
        }
    }

    static px_buf out;
    if (!render(e, sc, sc->key_tpl, event, fields, "key", &out, why, whylen)) goto done;
    px_event_set_key(e, sc, out.data, out.len);
    if (sc->lock_tpl) {
        if (!render(e, sc, sc->lock_tpl, event, fields, "lock_key", &out, why, whylen)) goto done;
        e->lock_key = px_strndup(out.data, out.len);
    }
    if (sc->fp_tpl) { /* objects and arrays too, as canonical JSON; any bytes */
        char err[256];
        px_tvars vars = { event, fields, sc->stream, e->id };
        if (px_template_render_value(sc->fp_tpl, &vars, &out, err, sizeof(err)) != PX_OK) {
            snprintf(why, whylen, "fingerprint '%s': %s", px_template_source(sc->fp_tpl), err);
            px_utf8_cut_end(why);
            goto done;
        }
        e->has_fp = true;
        e->fp = px_hash64(out.data, out.len);
    }
    rc = PX_OK;
done:
    json_object_put(event);
    json_object_put(fields);
    return rc;
}
