/*
 * event.c - turn a stream entry into the event a template sees, and render
 * its dedup key and lock key (SPEC 5.1, 5.6).
 *
 * The event is the payload field's JSON object when 'payload_field' is set,
 * else the entry's fields, where dotted names ("winner.name", as Spring Data's
 * hash mappers write them) become nested objects. Anything that cannot give a
 * usable key is bad input: the caller applies on_missing_key.
 */
#include <string.h>

#include "proxy.h"

/* Put 'value' at the dotted path 'name' inside 'obj', creating objects on the way.
 * A path that runs into a non-object keeps the flat name instead. */
static void put_dotted(json_object *obj, const char *name, json_object *value)
{
    const char *dot;
    json_object *cur = obj;
    const char *seg = name;
    while ((dot = strchr(seg, '.')) != NULL && dot != seg && dot[1] != '\0') {
        char part[256];
        size_t n = (size_t)(dot - seg);
        if (n >= sizeof(part)) break;
        memcpy(part, seg, n);
        part[n] = '\0';
        json_object *next = NULL;
        if (!json_object_object_get_ex(cur, part, &next)) {
            next = json_object_new_object();
            json_object_object_add(cur, part, next);
        } else if (!json_object_is_type(next, json_type_object)) {
            json_object_object_add(obj, name, value);
            return;
        }
        cur = next;
        seg = dot + 1;
    }
    json_object_object_add(cur, seg, value);
}

/* Render 'tpl' for 'e' into a new string, or NULL with 'why' filled. */
static char *render(px_entry *e, const px_template *tpl, json_object *event, json_object *fields,
                    const char *what, char *why, size_t whylen)
{
    static px_buf out;
    char err[256];
    px_tvars vars = { event, fields, e->st->conf->stream, e->id };
    if (px_template_render(tpl, &vars, &out, err, sizeof(err)) != PX_OK) {
        snprintf(why, whylen, "%s '%s': %s", what, px_template_source(tpl), err);
        return NULL;
    }
    if (memchr(out.data, '\0', out.len)) {
        /* Keys are C strings from here on: "a\u0000b" and "a\u0000c" would both
         * become "a" and one would be skipped as a copy (found by fuzz_event). */
        snprintf(why, whylen, "%s '%s' renders a NUL character", what, px_template_source(tpl));
        return NULL;
    }
    if (out.len == 0) {
        snprintf(why, whylen, "%s '%s' renders an empty string", what, px_template_source(tpl));
        return NULL;
    }
    if (!px_utf8_valid(out.data, out.len)) {
        snprintf(why, whylen, "%s '%s' renders text that is not UTF-8", what,
                 px_template_source(tpl));
        return NULL;
    }
    return px_strndup(out.data, out.len);
}

int px_event_prepare(px_entry *e, char *why, size_t whylen)
{
    px_stream_conf *sc = e->st->conf;
    /* #fields is built only for streams whose templates name it (proxy.c). */
    json_object *fields = e->st->want_fields ? json_object_new_object() : NULL;
    json_object *event = NULL;
    int rc = PX_ERR;

    if ((long long)e->bytes > e->st->px->conf->max_entry_bytes) {
        snprintf(why, whylen, "entry is %zu bytes, over max_entry_bytes %lld", e->bytes,
                 e->st->px->conf->max_entry_bytes);
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
        json_tokener *tok = json_tokener_new();
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
        event = json_tokener_parse_ex(tok, p->value, (int)p->value_len);
        enum json_tokener_error jerr = json_tokener_get_error(tok);
        size_t used = json_tokener_get_parse_end(tok);
        json_tokener_free(tok);
        if (event == NULL || jerr != json_tokener_success) {
            snprintf(why, whylen, "payload is not JSON: %s",
                     event ? "trailing data" : json_tokener_error_desc(jerr));
            goto done;
        }
        while (used < p->value_len && p->value[used] != '\0' && strchr(" \t\r\n", p->value[used]))
            used++;
        if (used != p->value_len) {
            snprintf(why, whylen, "payload is not JSON: trailing data at byte %zu", used);
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
            put_dotted(event, f->name, json_object_new_string_len(f->value, (int)f->value_len));
        }
    }

    e->key = render(e, sc->key_tpl, event, fields, "key", why, whylen);
    if (e->key == NULL) goto done;
    if (sc->lock_tpl) {
        e->lock_key = render(e, sc->lock_tpl, event, fields, "lock_key", why, whylen);
        if (e->lock_key == NULL) goto done;
    }
    rc = PX_OK;
done:
    json_object_put(event);
    json_object_put(fields);
    return rc;
}
