/*
 * template.h - the key template language (docs/configuration.md).
 *
 * A template is compiled once at start and rendered once per entry. Rendering
 * writes into a caller-owned px_buf and allocates nothing else: the buffer is
 * the only memory that grows, and it is reused across entries.
 *
 * Values come from json-c objects. json-c keeps the text of a JSON number as
 * it was written for doubles, which is how "numbers as written in the JSON"
 * (docs/configuration.md, "Key templates") is honoured.
 */
#ifndef PX_TEMPLATE_H
#define PX_TEMPLATE_H

#include <json-c/json.h>
#include "px.h"

typedef struct px_template px_template;

/* The variables of the language (#root is #event). */
typedef enum {
    PX_TVAR_EVENT,
    PX_TVAR_FIELDS,
    PX_TVAR_STREAM,
    PX_TVAR_ID
} px_tvar;

/* What a template may refer to; all borrowed (ref) for one render. */
typedef struct px_tvars {
    struct json_object *event;  /* (ref) #event and #root; may be NULL (then it is null) */
    struct json_object *fields; /* (ref) #fields: the entry's fields as an object; may be NULL */
    const char *stream;         /* (ref) #stream */
    const char *id;             /* (ref) #id, the entry id */
} px_tvars;

/*
 * Compile 'src'. On success returns the template (free with px_template_destroy).
 * On failure returns NULL, writes a message into 'err' ('errlen' bytes) and the
 * 1-based column in 'src' where the problem is into '*errcol' (if not NULL).
 */
px_template *px_template_compile(const char *src, char *err, size_t errlen, int *errcol);

/*
 * Render 't' over 'vars' into 'out' (reset first, NUL-terminated after).
 * Returns PX_OK, or PX_ERR with a message in 'err' when the result would be
 * null, missing, an object or an array, or navigation hit null without '?.'.
 * Never renders the text "null".
 */
int px_template_render(const px_template *t, const px_tvars *vars, px_buf *out,
                       char *err, size_t errlen);

/*
 * Render 't' as a fingerprint (docs/configuration.md, 'fingerprint'): as
 * px_template_render, but a part that is an object or an array renders as its
 * canonical JSON: members sorted by name (bytes), no spaces, numbers as written
 * in the source, strings escaped one way ('"' and '\\' by a backslash, controls
 * as \u00xx, the rest as UTF-8). So "#event" renders one text per event
 * whatever the order its producer wrote its members in. null and missing
 * values are errors, as in a key. An object of over 32 members allocates its
 * sorted names while rendering.
 */
int px_template_render_value(const px_template *t, const px_tvars *vars, px_buf *out,
                             char *err, size_t errlen);

/* The source text the template was compiled from (ref, lives as long as 't'). */
const char *px_template_source(const px_template *t);

/*
 * The literal prefix of 't' into 'out' (reset first, NUL-terminated): the text
 * every rendering starts with, whatever the event holds. That is the literal
 * text up to the first part that reads a variable (#event, #fields, #stream,
 * #id), with constant #{...} parts ('x', 1, 'a' + 'b') and a string literal
 * left of '+' counted in. An expression source (one that starts with '#')
 * begins with a variable, so its literal prefix is "".
 */
void px_template_literal_prefix(const px_template *t, px_buf *out);

/*
 * Whether 't' reads the variable 'v' anywhere (a #fields that is never
 * reached, as in 'x' ?: #fields.a, still counts). What the variables' names
 * are is the compiler's business: callers ask this instead of reading the
 * source (the text "fields" in '#event.fieldsX' or in a literal is no use of
 * #fields). Used to skip building #fields for templates that never read it.
 */
bool px_template_uses(const px_template *t, px_tvar v);

/*
 * When 't' is exactly one property of the event (#event.NAME, #root.NAME,
 * #event.NAME(), #event?.NAME, #{event.NAME}), the name (ref, lives as long
 * as 't') with its length in '*len'; else NULL. Then rendering 't' over an event object gives that
 * member's value, so a caller may find it in the JSON text by itself (the
 * fast key path of event.c). Computed at compile time: O(1).
 */
const char *px_template_simple_member(const px_template *t, size_t *len);

/*
 * Whether rendering 't' can read the entry: #event, #root, #fields or #id on
 * a path rendering can take. #stream does not count (it is the same for every
 * entry of a stream), nor does the right side of a ?: whose left side is a
 * constant that is never null or "" ('x' ?: #event.a).
 */
bool px_template_reads_entry(const px_template *t);

/*
 * What a template that decides which events are copies (a key, a fingerprint)
 * must pass beyond compiling (docs/configuration.md): it reads the entry
 * (px_template_reads_entry), or every event would have the same key. Returns
 * PX_OK, or PX_ERR with a message in 'err' and the column in '*errcol' (1:
 * the whole template); a template that is a property path written as literal
 * text (event.eventId, eventId) gets the #{...} form meant in the message.
 * Literal text holding a variable (room:#event.eventId) never compiles.
 */
int px_template_check_key(const px_template *t, char *err, size_t errlen, int *errcol);

void px_template_destroy(px_template *t);

#endif
