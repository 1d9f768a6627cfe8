/*
 * test_jscan.c - unit tests of the one-pass JSON member scan (jscan.c), the
 * fast key path of event.c. The scan may say "not sure" (false) to anything,
 * since the caller then asks json-c; what it must never do is give a value
 * json-c would not, or accept text json-c's strict mode refuses. Each case
 * here pins one answer; tests/fuzz/fuzz_event.c compares it with json-c at
 * large.
 */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "jscan.h"
#include "test.h"

typedef struct jcase {
    const char *json;
    size_t      len;        /* 0: strlen(json) */
    const char *name;
    const char *want;       /* the value found, or NULL: false */
} jcase;

#define ID "eventId"

static const jcase cases[] = {
    /* found */
    { "{\"eventId\":\"e-1\"}", 0, ID, "e-1" },
    { " \t\r\n{ \"eventId\" : \"e-1\" } \n", 0, ID, "e-1" },
    { "{\"a\":[1,2.5,-3e+2,{\"b\":null}],\"eventId\":\"x\",\"c\":true,\"d\":false}", 0, ID, "x" },
    { "{\"a\":{\"k\\n\":\"\\u00e9\\\"\"},\"eventId\":\"x\"}", 0, ID, "x" },  /* escapes below the top */
    { "{\"eventId\":\"caf\xc3\xa9 \xe2\x82\xac\"}", 0, ID, "caf\xc3\xa9 \xe2\x82\xac" },
    { "{\"eventId\":\"x\"}garbage", 15, ID, "x" },               /* only 'len' bytes count */
    { "{\"n\":123456789012345678,\"eventId\":\"x\"}", 0, ID, "x" },  /* 18 characters */
    { "{\"n\":1e99,\"eventId\":\"x\"}", 0, ID, "x" },
    { "{\"n\":0.5,\"m\":-0,\"eventId\":\"x\"}", 0, ID, "x" },
    { "{\"a\":[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]],\"eventId\":\"x\"}", 0, ID, "x" },  /* 1 at depth 16 */
    { "{\"$n\":\"y\"}", 0, "$n", "y" },
    /* not there, or not a plain non-empty string: ask json-c */
    { "{\"eventId\":\"\"}", 0, ID, NULL },
    { "{\"eventId\":42}", 0, ID, NULL },
    { "{\"eventId\":null}", 0, ID, NULL },
    { "{\"eventId\":{\"a\":\"b\"}}", 0, ID, NULL },
    { "{\"eventId\":\"a\\nb\"}", 0, ID, NULL },                  /* escape in the value */
    { "{\"eventIdX\":\"x\"}", 0, ID, NULL },
    { "{\"event\":\"x\"}", 0, ID, NULL },
    { "{\"a\":{\"eventId\":\"x\"}}", 0, ID, NULL },              /* not at the top */
    { "{}", 0, ID, NULL },
    { "{\"eventId\":\"x\",\"eventId\":\"y\"}", 0, ID, NULL },     /* twice: json-c keeps the last */
    { "{\"event\\u0049d\":\"x\"}", 0, ID, NULL },                 /* escaped top-level name */
    { "{\"k\\n\":1,\"eventId\":\"x\"}", 0, ID, NULL },            /* any top-level name with escapes */
    { "{\"eventId\":\"\xff\"}", 0, ID, NULL },                    /* value not UTF-8 */
    { "{\"eventId\":\"\xc3\"}", 0, ID, NULL },                    /* cut short */
    /* not strict JSON, or not sure json-c reads it the same: false */
    { "[\"x\"]", 0, ID, NULL },
    { "\"x\"", 0, ID, NULL },
    { "", 0, ID, NULL },
    { "   ", 0, ID, NULL },
    { "{\"eventId\":\"x\"", 0, ID, NULL },
    { "{\"eventId\":\"x}", 0, ID, NULL },
    { "{\"eventId\":\"x\"} x", 0, ID, NULL },
    { "{\"eventId\":\"x\"}{}", 0, ID, NULL },
    { "{\"eventId\":\"x\",}", 0, ID, NULL },
    { "{,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"a\":[1,],\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"eventId\" \"x\"}", 0, ID, NULL },
    { "{eventId:\"x\"}", 0, ID, NULL },
    { "{'eventId':'x'}", 0, ID, NULL },
    { "{\"n\":01,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":+1,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":.5,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":1.,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":1e,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":1234567890123456789,\"eventId\":\"x\"}", 0, ID, NULL },  /* 19: may not fit */
    { "{\"n\":1e100,\"eventId\":\"x\"}", 0, ID, NULL },           /* 3-digit exponent */
    { "{\"n\":NaN,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":tru,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":nul,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"n\":True,\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"a\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]],\"eventId\":\"x\"}", 0, ID, NULL },  /* depth 17 */
    { "{\"a\":\"\\ud83d\\ude00\",\"eventId\":\"x\"}", 0, ID, NULL },   /* a surrogate escape */
    { "{\"a\":\"\\uDBFF\",\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"a\":\"\\u12\",\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"a\":\"\\x\",\"eventId\":\"x\"}", 0, ID, NULL },
    { "{\"a\":\"tab\there\",\"eventId\":\"x\"}", 0, ID, NULL },   /* a control character */
    { "{\"eventId\":\"x\"}\0", 16, ID, NULL },                    /* a NUL after the object */
    { "{\"eventId\":\"x\0y\"}", 18, ID, NULL },                   /* a NUL in the value */
    { "\0{\"eventId\":\"x\"}", 16, ID, NULL },
    { "{\"eventId\":\"x\"}\v", 0, ID, NULL },                     /* not JSON whitespace */
    { "{\"eventId\":\"x\"}\\", 0, ID, NULL },
};

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const jcase *c = &cases[i];
        size_t len = c->len ? c->len : strlen(c->json);
        /* A copy of exactly 'len' bytes, so reading past it is ASan's to see. */
        char *json = malloc(len ? len : 1);
        memcpy(json, c->json, len);
        const char *v = "untouched";
        size_t vn = 12345;
        bool found = px_jscan_member(json, len, c->name, strlen(c->name), &v, &vn);
        char label[512];
        snprintf(label, sizeof(label), "case %zu %.*s: %s", i, (int)len, c->json,
                 c->want ? c->want : "(not found)");
        if (c->want) {
            test_cond(label, found && vn == strlen(c->want) && memcmp(v, c->want, vn) == 0 &&
                             v > json && v + vn < json + len);
        } else {
            test_cond(label, !found && strcmp(v, "untouched") == 0 && vn == 12345);
        }
        free(json);
    }
}

/* Every value found is json-c's too (strict mode, as event.c parses). */
static void test_json_c_agrees(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const jcase *c = &cases[i];
        if (c->want == NULL) continue;
        size_t len = c->len ? c->len : strlen(c->json);
        json_tokener *tok = json_tokener_new();
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
        json_object *o = json_tokener_parse_ex(tok, c->json, (int)len), *m = NULL;
        bool ok = o && json_tokener_get_error(tok) == json_tokener_success &&
                  json_object_object_get_ex(o, c->name, &m) && json_object_is_type(m, json_type_string) &&
                  strcmp(json_object_get_string(m), c->want) == 0;
        char label[512];
        snprintf(label, sizeof(label), "json-c agrees on case %zu", i);
        test_cond(label, ok);
        json_object_put(o);
        json_tokener_free(tok);
    }
}

/* The value points into the text: the caller copies it, nothing is allocated. */
static void test_points_into(void)
{
    static const char json[] = "{\"a\":1,\"eventId\":\"abc\"}";
    const char *v = NULL;
    size_t vn = 0;
    test_cond("points into: found",
              px_jscan_member(json, sizeof(json) - 1, ID, strlen(ID), &v, &vn));
    test_cond("points into: where the value is", v == json + 18 && vn == 3);
    /* 'name' is 'nlen' bytes, not a C string */
    test_cond("name by length", px_jscan_member(json, sizeof(json) - 1, "eventIdXYZ", 7, &v, &vn) &&
                                vn == 3);
}

int main(void)
{
    test_cases();
    test_json_c_agrees();
    test_points_into();
    return test_report();
}
