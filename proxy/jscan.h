/*
 * jscan.h - find one top-level string member of a JSON object without parsing
 * it into a tree (event.c's fast key path, docs/configuration.md).
 *
 * For a key that is one property of the payload object ("#event.eventId"),
 * json-c's parse (a tree of allocations and a locale switch per entry: over a
 * third of the daemon's instructions under load) is replaced by one pass that
 * checks the payload is strict JSON and finds that member. The pass is a
 * strict subset of json-c's strict mode: whenever it is unsure it says no, and
 * the caller takes the json-c path, which decides. It never rejects anything
 * by itself. It allocates nothing.
 */
#ifndef PX_JSCAN_H
#define PX_JSCAN_H

#include <stdbool.h>
#include <stddef.h>

/*
 * true when 'json' ('len' bytes) is, as json-c's strict mode reads it, JSON
 * whitespace, one object, JSON whitespace, and that object's member 'name'
 * ('nlen' bytes) is a non-empty string without escapes that is valid UTF-8:
 * then '*value' points at its text inside 'json' (after the opening quote)
 * and '*vlen' is its length in bytes. false when it is not, or when the scan
 * is unsure: escapes in a top-level name, a surrogate escape anywhere, a
 * number json-c might read otherwise (over 18 characters, an exponent over
 * two digits), nesting deeper than 16, the name twice (json-c keeps the
 * last), a value that is not a plain non-empty UTF-8 string, ... (a NUL byte
 * anywhere is a no). '*value' and '*vlen' are left alone on false.
 */
bool px_jscan_member(const char *json, size_t len, const char *name, size_t nlen,
                     const char **value, size_t *vlen);

#endif
