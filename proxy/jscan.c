/*
 * jscan.c - find one top-level string member of a JSON object in one pass
 * (see jscan.h). tests/unit/test_jscan.c pins its answers case by case;
 * tests/fuzz/fuzz_event.c checks the keys it gives against json-c's.
 */
#include "jscan.h"

#include <string.h>

#include "px.h"

typedef struct jscan {
    const unsigned char *p, *end;
} jscan;

static void j_ws(jscan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool j_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A string at s->p ('"'); '*plain' says it has no escapes. */
static bool j_string(jscan *s, bool *plain)
{
    const unsigned char *p = s->p + 1;
    *plain = true;
    for (; p < s->end; p++) {
        if (*p == '"') {
            s->p = p + 1;
            return true;
        }
        if (*p < 0x20) return false;
        if (*p != '\\') continue;
        *plain = false;
        if (++p >= s->end) return false;
        if (*p == 'u') {
            if (s->end - p < 5 || !j_hex(p[1]) || !j_hex(p[2]) || !j_hex(p[3]) || !j_hex(p[4]))
                return false;
            if ((p[1] == 'd' || p[1] == 'D') && strchr("89abcdefABCDEF", p[2])) return false;
            p += 4;
        } else if (*p == '\0' || !strchr("\"\\/bfnrt", *p)) {
            return false;
        }
    }
    return false;
}

static bool j_digits(jscan *s)
{
    const unsigned char *p = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') s->p++;
    return s->p > p;
}

static bool j_value(jscan *s, int depth);

/* An object at s->p ('{'). At depth 0, finds the member 'name' (once): its
 * value's span goes to *v, *vn, and whether it is a plain string to *vplain. */
static bool j_object(jscan *s, int depth, const char *name, size_t nlen, const unsigned char **v,
                     size_t *vn, bool *vplain)
{
    s->p++;
    j_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return true;
    }
    for (;;) {
        bool plain;
        if (s->p >= s->end || *s->p != '"') return false;
        const unsigned char *k = s->p + 1;
        if (!j_string(s, &plain)) return false;
        size_t klen = (size_t)(s->p - 1 - k);
        j_ws(s);
        if (s->p >= s->end || *s->p != ':') return false;
        s->p++;
        j_ws(s);
        const unsigned char *start = s->p;
        if (!j_value(s, depth + 1)) return false;
        if (depth == 0) {
            if (!plain) return false; /* a top-level name with escapes */
            if (klen == nlen && memcmp(k, name, nlen) == 0) {
                if (*v) return false; /* twice: json-c keeps the last */
                *v = start;
                *vn = (size_t)(s->p - start);
                *vplain = *start == '"' && j_string(&(jscan){ start, s->p }, &plain) && plain;
            }
        }
        j_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            j_ws(s);
            continue;
        }
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return true;
        }
        return false;
    }
}

static bool j_value(jscan *s, int depth)
{
    if (s->p >= s->end || depth > 16) return false;
    bool plain;
    const unsigned char *v = NULL;
    size_t vn;
    switch (*s->p) {
    case '{':
        return j_object(s, depth, NULL, 0, &v, &vn, &plain);
    case '[':
        s->p++;
        j_ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return true;
        }
        for (;;) {
            if (!j_value(s, depth + 1)) return false;
            j_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                j_ws(s);
                continue;
            }
            if (s->p < s->end && *s->p == ']') {
                s->p++;
                return true;
            }
            return false;
        }
    case '"':
        return j_string(s, &plain);
    case 't':
    case 'f':
    case 'n': {
        const char *lit = *s->p == 't' ? "true" : (*s->p == 'f' ? "false" : "null");
        size_t n = strlen(lit);
        if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return false;
        s->p += n;
        return true;
    }
    default: { /* a number, as RFC 8259 writes it */
        const unsigned char *start = s->p;
        if (*s->p == '-') s->p++;
        if (s->p < s->end && *s->p == '0') s->p++;
        else if (!j_digits(s)) return false;
        if (s->p < s->end && *s->p == '.') {
            s->p++;
            if (!j_digits(s)) return false;
        }
        if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
            s->p++;
            if (s->p < s->end && (*s->p == '+' || *s->p == '-')) s->p++;
            const unsigned char *exp = s->p;
            if (!j_digits(s) || s->p - exp > 2) return false; /* no overflow to inf */
        }
        return s->p - start <= 18; /* fits int64: json-c reads it as we do */
    }
    }
}

bool px_jscan_member(const char *json, size_t len, const char *name, size_t nlen,
                     const char **value, size_t *vlen)
{
    jscan s = { (const unsigned char *)json, (const unsigned char *)json + len };
    const unsigned char *v = NULL;
    size_t vn = 0;
    bool plain = false;
    j_ws(&s);
    if (s.p >= s.end || *s.p != '{' || !j_object(&s, 0, name, nlen, &v, &vn, &plain)) return false;
    j_ws(&s);
    if (s.p != s.end || v == NULL || !plain || vn <= 2) return false;
    if (!px_utf8_valid((const char *)v + 1, vn - 2)) return false;
    *value = (const char *)v + 1;
    *vlen = vn - 2;
    return true;
}
