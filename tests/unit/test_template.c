/*
 * test_template.c - unit tests of the key template language
 * (docs/configuration.md).
 *
 * Most cases live in template_cases.json beside this file, a table that the
 * SpEL differential test (tests/spel/) runs through real SpEL too; each case
 * is compiled and rendered here and must give the expected key, render error
 * or compile error with its column. The rest of this file tests what a table
 * cannot: buffer reuse, no allocation while rendering, limits, odd inputs and
 * a small random fuzz.
 *
 * Usage: test_template [CASES.json]; without an argument the table is looked
 * for in $PX_TEMPLATE_CASES, tests/unit/ and next to the binary's source tree.
 */
#include <json-c/json.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "px.h"
#include "template.h"
#include "test.h"

#define ERRLEN 256

/* ------------------------------------------------------------------------ */
/* The case table                                                            */
/* ------------------------------------------------------------------------ */

static const char *find_table(int argc, char **argv)
{
    static char path[4096];
    if (argc > 1) return argv[1];
    const char *env = getenv("PX_TEMPLATE_CASES");
    if (env && *env) return env;
    if (access("tests/unit/template_cases.json", R_OK) == 0)
        return "tests/unit/template_cases.json";
    /* build/tests/test_template -> tests/unit/template_cases.json */
    const char *slash = strrchr(argv[0], '/');
    int dirlen = slash ? (int)(slash - argv[0]) : 1;
    snprintf(path, sizeof(path), "%.*s/../../tests/unit/template_cases.json",
             dirlen, slash ? argv[0] : ".");
    return path;
}

/* The case's 'key', else the defaults' (a JSON null gives NULL). */
static struct json_object *pick(struct json_object *c, struct json_object *defaults,
                                const char *key)
{
    struct json_object *v = NULL;
    if (json_object_object_get_ex(c, key, &v)) return v;
    json_object_object_get_ex(defaults, key, &v);
    return v;
}

static const char *str_or_null(struct json_object *o)
{
    return json_object_is_type(o, json_type_string) ? json_object_get_string(o) : NULL;
}

static int cases_run;

static void run_case(struct json_object *c, struct json_object *defaults, px_buf *out)
{
    struct json_object *o;
    const char *name = json_object_object_get_ex(c, "name", &o) ? json_object_get_string(o) : "?";
    const char *src = json_object_object_get_ex(c, "src", &o) ? json_object_get_string(o) : NULL;
    char label[512], err[ERRLEN];
    int col = 0;

    snprintf(label, sizeof(label), "case '%s' [%s]", name, src ? src : "(no src)");
    if (src == NULL) { test_cond(label, 0); return; }
    cases_run++;

    px_tvars vars = {
        .event  = pick(c, defaults, "event"),
        .fields = pick(c, defaults, "fields"),
        .stream = str_or_null(pick(c, defaults, "stream")),
        .id     = str_or_null(pick(c, defaults, "id")),
    };

    px_template *t = px_template_compile(src, err, sizeof(err), &col);

    if (json_object_object_get_ex(c, "compile_error", &o)) {
        const char *want = json_object_get_string(o);
        int want_col = json_object_object_get_ex(c, "col", &o) ? json_object_get_int(o) : -1;
        if (t != NULL) {
            fprintf(stderr, "%s: compiled, want compile error '%s'\n", label, want);
            test_cond(label, 0);
            px_template_destroy(t);
            return;
        }
        if (strstr(err, want) == NULL || col != want_col)
            fprintf(stderr, "%s: compile error '%s' at column %d, want '%s' at column %d\n",
                    label, err, col, want, want_col);
        test_cond(label, strstr(err, want) != NULL && col == want_col);
        return;
    }

    if (t == NULL) {
        fprintf(stderr, "%s: compile error '%s' at column %d\n", label, err, col);
        test_cond(label, 0);
        return;
    }
    test_streq(label, px_template_source(t), src);

    int rc = px_template_render(t, &vars, out, err, sizeof(err));
    if (json_object_object_get_ex(c, "expect", &o)) {
        const char *want = json_object_get_string(o);
        size_t want_len = (size_t)json_object_get_string_len(o);
        if (rc != PX_OK)
            fprintf(stderr, "%s: render error '%s', want [%s]\n", label, err, want);
        else if (out->len != want_len || memcmp(out->data, want, want_len) != 0)
            fprintf(stderr, "%s: got [%s] want [%s]\n", label, out->data, want);
        test_cond(label, rc == PX_OK && out->len == want_len &&
                         memcmp(out->data, want, want_len) == 0 &&
                         out->data[out->len] == '\0');
    } else if (json_object_object_get_ex(c, "error", &o)) {
        const char *want = json_object_get_string(o);
        if (rc == PX_OK)
            fprintf(stderr, "%s: rendered [%s], want error '%s'\n", label, out->data, want);
        else if (strstr(err, want) == NULL)
            fprintf(stderr, "%s: error '%s', want '%s'\n", label, err, want);
        test_cond(label, rc == PX_ERR && strstr(err, want) != NULL && out->len == 0);
    } else {
        fprintf(stderr, "%s: has no expect, error or compile_error\n", label);
        test_cond(label, 0);
    }
    px_template_destroy(t);
}

static void test_table(const char *path)
{
    struct json_object *table = json_object_from_file(path);
    struct json_object *cases = NULL, *defaults = NULL;
    px_buf out = {0};

    if (table == NULL) {
        fprintf(stderr, "cannot read the case table %s: %s\n", path, json_util_get_last_err());
        test_cond("case table readable", 0);
        return;
    }
    json_object_object_get_ex(table, "defaults", &defaults);
    json_object_object_get_ex(table, "cases", &cases);
    size_t n = json_object_array_length(cases);
    for (size_t i = 0; i < n; i++)
        run_case(json_object_array_get_idx(cases, i), defaults, &out);
    test_cond("the table has 120+ cases", cases_run >= 120);
    px_buf_deinit(&out);
    json_object_put(table);
}

/* ------------------------------------------------------------------------ */
/* What the table cannot say                                                 */
/* ------------------------------------------------------------------------ */

static const char *EVENT =
    "{\"eventId\":\"e-42\",\"joinCode\":\"ABCD\",\"roomId\":7,\"price\":1.50,"
    "\"ratio\":1e3,\"ok\":true,\"empty\":\"\",\"nil\":null,"
    "\"winner\":{\"name\":\"ann\"},\"items\":[{\"id\":\"i1\"},{\"id\":\"i2\"}],"
    "\"long\":\"" "0123456789012345678901234567890123456789012345678901234567890123456789"
    "0123456789012345678901234567890123456789012345678901234567890123456789\"}";

/* Render 'src' over 'event' into 'out'; returns the render's result code. */
static int render(const char *src, struct json_object *event, px_buf *out, char *err)
{
    px_tvars vars = { event, NULL, "orders", "1-0" };
    int col;
    px_template *t = px_template_compile(src, err, ERRLEN, &col);
    if (t == NULL) return PX_ERR;
    int rc = px_template_render(t, &vars, out, err, ERRLEN);
    px_template_destroy(t);
    return rc;
}

static void test_buffer_reuse(struct json_object *event)
{
    char err[ERRLEN];
    px_buf out = {0};
    px_tvars vars = { event, NULL, "orders", "1-0" };
    px_template *t = px_template_compile(
        "k:#{event.eventId}:#{event.roomId + 1}:#{'x' + event.price + (event.nil ?: 'n')}",
        err, sizeof(err), NULL);
    test_cond("reuse: compiles", t != NULL);
    if (t == NULL) return;

    test_cond("reuse: first render", px_template_render(t, &vars, &out, err, sizeof(err)) == PX_OK);
    test_streq("reuse: first key", out.data, "k:e-42:8:x1.50n");
    char *data = out.data;
    size_t cap = out.cap;
    int same = 1;
    for (int i = 0; i < 1000; i++) {
        if (px_template_render(t, &vars, &out, err, sizeof(err)) != PX_OK) same = 0;
        if (out.data != data || out.cap != cap || strcmp(out.data, "k:e-42:8:x1.50n") != 0)
            same = 0;
    }
    test_cond("reuse: 1000 renders keep the buffer and the key", same);

    /* After an error the buffer is empty, still a string, still the same memory. */
    px_template *bad = px_template_compile("#event.missing", err, sizeof(err), NULL);
    test_cond("reuse: error render", px_template_render(bad, &vars, &out, err, sizeof(err)) == PX_ERR);
    test_cond("reuse: empty after an error", out.len == 0 && out.data == data && out.data[0] == '\0');
    test_streq("reuse: the message names the template",
               err, "#event.missing: is missing, which cannot be part of a key (give a fallback with ?:)");
    px_template_destroy(bad);

    /* Nothing is allocated while rendering: the heap in use does not move.
     * (Skipped where mallinfo2 does not see this heap, as under valgrind.) */
    struct mallinfo2 before = mallinfo2();
    void *probe = malloc(1000);
    struct mallinfo2 during = mallinfo2();
    free(probe);
    if (during.uordblks != before.uordblks) {
        before = mallinfo2();
        for (int i = 0; i < 1000; i++) px_template_render(t, &vars, &out, err, sizeof(err));
        struct mallinfo2 after = mallinfo2();
        test_cond("reuse: rendering allocates nothing", after.uordblks == before.uordblks);
    }

    px_template_destroy(t);
    px_buf_deinit(&out);
}

static void test_growth(struct json_object *event)
{
    char err[ERRLEN];
    px_buf out = {0};
    /* A key longer than the buffer's first allocation, built by '+' with the
     * right side already in the buffer (the slide-over path). */
    test_cond("growth: renders",
              render("#event.roomId + (#event.long + #event.long + #event.long)", event, &out, err) == PX_OK);
    test_cond("growth: length", out.len == 1 + 3 * 140);
    test_cond("growth: starts with the integer", out.len > 2 && out.data[0] == '7' && out.data[1] == '0');
    test_cond("growth: ends with the text", out.len > 2 && out.data[out.len - 1] == '9');
    px_buf_deinit(&out);
}

static void test_sugar(struct json_object *event)
{
    char err[ERRLEN], a[ERRLEN];
    px_buf out = {0};
    test_cond("sugar: without #", render("room:#{event.joinCode}", event, &out, err) == PX_OK);
    snprintf(a, sizeof(a), "%s", out.data);
    test_cond("sugar: with #", render("room:#{#event.joinCode}", event, &out, err) == PX_OK);
    test_streq("sugar: #{event.x} == #{#event.x}", a, out.data);
    test_streq("sugar: the key", a, "room:ABCD");
    px_buf_deinit(&out);
}

static void test_numbers(void)
{
    char err[ERRLEN];
    px_buf out = {0};

    /* Parsed doubles keep their text. */
    struct json_object *ev = json_tokener_parse("{\"a\":1.50,\"b\":1e3,\"c\":-0.0,\"d\":1E+2}");
    test_cond("numbers: 1.50", render("#event.a", ev, &out, err) == PX_OK);
    test_streq("numbers: 1.50 stays", out.data, "1.50");
    test_cond("numbers: 1e3", render("#event.b", ev, &out, err) == PX_OK);
    test_streq("numbers: 1e3 stays", out.data, "1e3");
    test_cond("numbers: -0.0", render("#event.c", ev, &out, err) == PX_OK);
    test_streq("numbers: -0.0 stays", out.data, "-0.0");
    test_cond("numbers: 1E+2", render("k#{event.d}", ev, &out, err) == PX_OK);
    test_streq("numbers: 1E+2 stays", out.data, "k1E+2");
    json_object_put(ev);

    /* A double built in code has no text and is formatted. */
    ev = json_object_new_object();
    json_object_object_add(ev, "d", json_object_new_double(2.5));
    json_object_object_add(ev, "i", json_object_new_int64(-42));
    json_object_object_add(ev, "u", json_object_new_uint64(10000000000000000000ULL));
    json_object_object_add(ev, "clamped", json_object_new_int64(INT64_MIN));
    test_cond("numbers: built double", render("#event.d", ev, &out, err) == PX_OK);
    test_streq("numbers: built double text", out.data, "2.5");
    test_cond("numbers: built int", render("#event.i + 1", ev, &out, err) == PX_OK);
    test_streq("numbers: built int sum", out.data, "-41");
    test_cond("numbers: built uint64", render("#event.u", ev, &out, err) == PX_OK);
    test_streq("numbers: built uint64 text", out.data, "10000000000000000000");
    test_cond("numbers: int64 min refused", render("#event.clamped", ev, &out, err) == PX_ERR);
    test_cond("numbers: int64 min message", strstr(err, "integer out of range") != NULL);
    test_cond("numbers: clamped value refused under ?:",
              render("#event.clamped ?: 1", ev, &out, err) == PX_ERR);
    json_object_put(ev);

    ev = json_tokener_parse("{\"m\":-9223372036854775807,\"u\":18446744073709551614}");
    test_cond("numbers: int64 min by sum", render("#event.m + #event.m", ev, &out, err) == PX_ERR);
    test_cond("numbers: overflow message", strstr(err, "integer overflow") != NULL);
    test_cond("numbers: uint64 + -int64", render("#event.u + #event.m", ev, &out, err) == PX_OK);
    test_streq("numbers: uint64 + -int64 value", out.data, "9223372036854775807");
    test_cond("numbers: -int64 + uint64", render("#event.m + #event.u", ev, &out, err) == PX_OK);
    test_streq("numbers: -int64 + uint64 value", out.data, "9223372036854775807");
    test_cond("numbers: x + -x is 0", render("#event.m + 9223372036854775807", ev, &out, err) == PX_OK);
    test_streq("numbers: x + -x value", out.data, "0");
    json_object_put(ev);
    px_buf_deinit(&out);
}

static void test_vars(struct json_object *event)
{
    char err[ERRLEN];
    px_buf out = {0};
    px_tvars none = { NULL, NULL, NULL, NULL };
    px_template *t = px_template_compile("#stream", err, sizeof(err), NULL);
    test_cond("vars: no stream is null", px_template_render(t, &none, &out, err, sizeof(err)) == PX_ERR);
    test_cond("vars: no stream message", strstr(err, "#stream: is null") == err);
    px_template_destroy(t);

    t = px_template_compile("#{stream ?: 'x'}-#{id ?: 'y'}-#{event?.a ?: 'z'}", err, sizeof(err), NULL);
    test_cond("vars: fallbacks for unset variables",
              px_template_render(t, &none, &out, err, sizeof(err)) == PX_OK);
    test_streq("vars: fallbacks", out.data, "x-y-z");
    px_template_destroy(t);

    px_tvars all = { event, event, "s", "1-0" };
    t = px_template_compile("#{fields.eventId}/#{root.joinCode}/#{stream}/#{id}", err, sizeof(err), NULL);
    test_cond("vars: all", px_template_render(t, &all, &out, err, sizeof(err)) == PX_OK);
    test_streq("vars: all key", out.data, "e-42/ABCD/s/1-0");
    px_template_destroy(t);

    /* The empty template renders an empty, NUL-terminated key into a fresh buffer. */
    px_buf fresh = {0};
    t = px_template_compile("", err, sizeof(err), NULL);
    test_cond("vars: empty template", t && px_template_render(t, &all, &fresh, err, sizeof(err)) == PX_OK);
    test_cond("vars: empty key is a string", fresh.data != NULL && fresh.len == 0 && fresh.data[0] == '\0');
    px_template_destroy(t);
    px_buf_deinit(&fresh);
    px_buf_deinit(&out);
}

static void test_errors(struct json_object *event)
{
    char err[ERRLEN], small[8];
    int col = -1;
    px_buf out = {0};

    /* No error buffer, no column: still fails cleanly. */
    test_cond("errors: no buffers", px_template_compile("#nope", NULL, 0, NULL) == NULL);
    test_cond("errors: zero-length buffer", px_template_compile("#nope", err, 0, &col) == NULL && col == 1);
    test_cond("errors: small buffer", px_template_compile("#nope", small, sizeof(small), NULL) == NULL &&
                                      strlen(small) == sizeof(small) - 1);
    px_template *t = px_template_compile("#event.missing", err, sizeof(err), NULL);
    px_tvars vars = { event, NULL, "s", "1" };
    test_cond("errors: render without a buffer", px_template_render(t, &vars, &out, NULL, 0) == PX_ERR);
    test_cond("errors: render with a small buffer",
              px_template_render(t, &vars, &out, small, sizeof(small)) == PX_ERR &&
              strlen(small) == sizeof(small) - 1);
    px_template_destroy(t);
    px_template_destroy(NULL);

    /* Long templates are quoted shortened in render errors. */
    test_cond("errors: long source", render("#event.long + #event.long + #event.long + "
                                            "#event.long + #event.long + #event.missing + 'x'",
                                            event, &out, err) == PX_ERR);
    test_cond("errors: only the failing part is quoted", strstr(err, "#event.missing: is missing") == err);
    test_cond("errors: long part", render("#event.roomId + #event.roomId + #event.roomId + "
                                          "#event.roomId + #event.roomId + #event.roomId + #event.ok",
                                          event, &out, err) == PX_ERR);
    test_cond("errors: quote is shortened", strstr(err, "...: ") != NULL && strlen(err) < 200);
    px_buf src = {0};
    px_buf_appends(&src, "#event['");
    for (int i = 0; i < 50; i++) px_buf_appends(&src, "\xc5\xbc");   /* ż */
    px_buf_appends(&src, "'].x");
    test_cond("errors: non-ASCII quote", render(src.data, event, &out, err) == PX_ERR);
    test_cond("errors: shortened quote is UTF-8", strstr(err, "...: ") && px_utf8_valid(err, strlen(err)));
    /* A message cut by the end of the buffer is cut between characters too:
     * it reaches dead-letter reasons and JSON log lines (issue 37). Each
     * shift of one byte lands the cut at another byte of a character. */
    for (int shift = 0; shift < 4; shift++) {
        char label[64];
        px_buf_reset(&src);
        px_buf_appends(&src, "#event.missing.");
        for (int i = 0; i < shift; i++) px_buf_appends(&src, "x");
        for (int i = 0; i < 150; i++) px_buf_appends(&src, "\xe2\x82\xac"); /* € */
        snprintf(label, sizeof(label), "errors: a cut message is UTF-8 (shift %d)", shift);
        test_cond(label, render(src.data, event, &out, err) == PX_ERR &&
                             strstr(err, "cannot read '") && px_utf8_valid(err, strlen(err)));
    }

    /* Nesting is bounded so that compile and render cannot run out of stack. */
    px_buf_reset(&src);
    px_buf_appends(&src, "#{");
    for (int i = 0; i < 100; i++) px_buf_appends(&src, "(");
    px_buf_appends(&src, "'a'");
    for (int i = 0; i < 100; i++) px_buf_appends(&src, ")");
    px_buf_appends(&src, "}");
    test_cond("errors: 100 parentheses", render(src.data, event, &out, err) == PX_OK);
    test_streq("errors: 100 parentheses key", out.data, "a");
    px_buf_reset(&src);
    px_buf_appends(&src, "#{");
    for (int i = 0; i < 1000; i++) px_buf_appends(&src, "(");
    px_buf_appends(&src, "'a'");
    for (int i = 0; i < 1000; i++) px_buf_appends(&src, ")");
    px_buf_appends(&src, "}");
    test_cond("errors: 1000 parentheses", px_template_compile(src.data, err, sizeof(err), &col) == NULL);
    test_cond("errors: too deep", strstr(err, "nested too deeply") != NULL);
    px_buf_reset(&src);
    px_buf_appends(&src, "#event.eventId");
    for (int i = 0; i < 100; i++) px_buf_appends(&src, " + 'x'");
    test_cond("errors: 100 '+'", render(src.data, event, &out, err) == PX_OK && out.len == 104);
    for (int i = 0; i < 10000; i++) px_buf_appends(&src, " + 'x'");
    test_cond("errors: 10100 '+'", px_template_compile(src.data, err, sizeof(err), &col) == NULL);
    px_buf_reset(&src);
    px_buf_appends(&src, "#event.eventId");
    for (int i = 0; i < 10000; i++) px_buf_appends(&src, " ?: 'x'");
    test_cond("errors: 10000 '?:'", px_template_compile(src.data, err, sizeof(err), &col) == NULL);
    px_buf_deinit(&src);
    px_buf_deinit(&out);
}

/* Random sources from the language's own characters must compile or fail
 * with a column inside the source, and render or fail with a message. */
static void test_fuzz(struct json_object *event)
{
    static const char *atoms[] = {
        "#", "#{", "}", "event", "fields", "stream", "id", "root", "#event", ".", "?.",
        "?:", "+", "[", "]", "(", ")", "'", "''", "\"", "eventId", "items", "0", "1",
        "1.5", "e3", " ", "x", "winner", "name", "nil", "-", "?", "\xc5\xbc", "'a'",
    };
    size_t natoms = sizeof(atoms) / sizeof(atoms[0]);
    px_buf src = {0}, out = {0};
    px_tvars vars = { event, event, "s", "1-0" };
    char err[ERRLEN];
    int bad = 0, compiled = 0;

    srand(1);
    for (int i = 0; i < 20000; i++) {
        px_buf_reset(&src);
        px_buf_append(&src, "", 0);
        int len = rand() % 12;
        for (int k = 0; k < len; k++) px_buf_appends(&src, atoms[rand() % natoms]);
        int col = 0;
        px_template *t = px_template_compile(src.data, err, sizeof(err), &col);
        if (t == NULL) {
            if (col < 1 || (size_t)col > src.len + 1 || err[0] == '\0') {
                fprintf(stderr, "fuzz: [%s] column %d, message '%s'\n", src.data, col, err);
                bad++;
            }
            continue;
        }
        compiled++;
        int rc = px_template_render(t, &vars, &out, err, sizeof(err));
        if ((rc == PX_ERR && err[0] == '\0') || (rc == PX_OK && strlen(out.data) > out.len)) {
            fprintf(stderr, "fuzz: [%s] rc %d, message '%s'\n", src.data, rc, err);
            bad++;
        }
        px_template_destroy(t);
    }
    test_cond("fuzz: every result well-formed", bad == 0);
    test_cond("fuzz: some sources compile", compiled > 1000);
    px_buf_deinit(&src);
    px_buf_deinit(&out);
}

/* What callers learn of a template from its compiled form, never its text. */
static void test_facts(void)
{
    static const struct { const char *src; unsigned uses; const char *member; } cases[] = {
        /* uses: 1 event, 2 fields, 4 stream, 8 id */
        { "#event.eventId",                 1, "eventId" },
        { "#root.eventId",                  1, "eventId" },
        { "#event.eventId()",               1, "eventId" },
        { "#event?.eventId",                1, "eventId" },
        { "#{event.eventId}",               1, "eventId" },
        { "#{#event.eventId}",              1, "eventId" },
        { "#event.$x_1",                    1, "$x_1" },
        { "#event.fieldsX",                 1, "fieldsX" },   /* not #fields */
        { "#event.a.b",                     1, NULL },
        { "#event['eventId']",              1, NULL },
        { "k:#{event.eventId}",             1, NULL },
        { "#{event.eventId}:",              1, NULL },
        { "#event.eventId ?: 'x'",          1, NULL },
        { "#event.eventId + ''",            1, NULL },
        { "#fields.eventId",                2, NULL },
        { "#stream",                        4, NULL },
        { "#id",                            8, NULL },
        { "fields:#{'fields'}",             0, NULL },        /* literals only */
        { "#{fields.a}-#{stream}-#{id}",   14, NULL },
        { "#{'x' ?: #fields.a}",            2, NULL },        /* unreached, still used */
        { "#event[#fields['k']]",           3, NULL },
        { "#{(#id)}",                       8, NULL },
        { "no parts at all",                0, NULL },
        { "",                               0, NULL },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[ERRLEN], label[160];
        px_template *t = px_template_compile(cases[i].src, err, sizeof(err), NULL);
        snprintf(label, sizeof(label), "facts: '%s' compiles", cases[i].src);
        test_cond(label, t != NULL);
        if (t == NULL) continue;
        unsigned uses = 0;
        for (px_tvar v = PX_TVAR_EVENT; v <= PX_TVAR_ID; v++)
            if (px_template_uses(t, v)) uses |= 1u << v;
        snprintf(label, sizeof(label), "facts: '%s' uses %u, wanted %u", cases[i].src, uses,
                 cases[i].uses);
        test_cond(label, uses == cases[i].uses);
        size_t len = 12345;
        const char *m = px_template_simple_member(t, &len);
        snprintf(label, sizeof(label), "facts: '%s' simple member", cases[i].src);
        if (cases[i].member) {
            test_cond(label, m != NULL && len == strlen(cases[i].member) &&
                             memcmp(m, cases[i].member, len) == 0);
        } else {
            test_cond(label, m == NULL && len == 12345);
        }
        px_template_destroy(t);
    }
}

/* A template must be valid UTF-8 (issue 37: a ${VAR} can bring any bytes into
 * a config's template), refused at the first bad byte's column. */
static void test_utf8(void)
{
    static const struct {
        const char *src;
        int col;
    } bad[] = {
        { "\xff", 1 },
        { "room:\xc3", 6 },             /* a character cut short */
        { "#{event.a}:\xc0\xaf", 12 },  /* an overlong '/' */
        { "\xc5\xbc:\xed\xa0\x80", 3 }, /* a surrogate after 'ż:' */
        { "#event['\xfe']", 9 },
    };
    char err[ERRLEN];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int col = 0;
        px_template *t = px_template_compile(bad[i].src, err, sizeof(err), &col);
        char label[64];
        snprintf(label, sizeof(label), "utf8: bad template %zu refused", i);
        test_cond(label, t == NULL && strstr(err, "not valid UTF-8") != NULL &&
                             col == bad[i].col && px_utf8_valid(err, strlen(err)));
        if (t == NULL && col != bad[i].col)
            fprintf(stderr, "    column %d, want %d: %s\n", col, bad[i].col, err);
        px_template_destroy(t);
    }
    px_template *t = px_template_compile("\xc5\xbc\xc3\xb3\xc5\x82w:#{event['\xf0\x9f\x90\xa2']}",
                                         err, sizeof(err), NULL);
    test_cond("utf8: a valid non-ASCII template compiles", t != NULL);
    px_template_destroy(t);
}

/* What a key must read (issue 31): some variable of the entry on a path that
 * rendering takes; #stream alone is the same for every entry of a stream. */
static void test_reads_entry(void)
{
    static const struct {
        const char *src;
        bool reads;
    } cases[] = {
        { "#event.eventId", true },
        { "#root", true },
        { "#fields['a']", true },
        { "#id", true },
        { "room:#{event.a}", true },
        { "#stream + ':' + #id", true },
        { "#{event.a ?: 'x'}", true },
        { "#{'' ?: event.a}", true },      /* '' is empty: the right side is read */
        { "#{stream ?: event.a}", true },  /* not known at compile time: counted */
        { "#{'x'['y'] ?: event.a}", true },
        { "#stream", false },
        { "orders", false },
        { "event.eventId", false },
        { "a:#{1 + 2}:#{'b'}", false },
        { "#{'x' ?: event.a}", false },    /* 'x' is never null or "": never read */
        { "#{0 ?: fields.a}", false },
        { "#{('a' + 'b') ?: id}", false },
        { "#{stream}:#{'k'}", false },
    };
    char err[ERRLEN];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        px_template *t = px_template_compile(cases[i].src, err, sizeof(err), NULL);
        char label[128];
        snprintf(label, sizeof(label), "reads_entry: [%s]", cases[i].src);
        test_cond(label, t != NULL && px_template_reads_entry(t) == cases[i].reads);
        int col = 0;
        int rc = t ? px_template_check_key(t, err, sizeof(err), &col) : PX_ERR;
        snprintf(label, sizeof(label), "check_key: [%s]", cases[i].src);
        test_cond(label, cases[i].reads ? rc == PX_OK
                                        : rc == PX_ERR && col == 1 &&
                                              strstr(err, "reads nothing from the entry"));
        px_template_destroy(t);
    }

    /* a key written as literal text that is a property path: the #{...} meant */
    static const struct {
        const char *src, *want;
    } typos[] = {
        { "event.eventId", "did you mean \"#{event.eventId}\"?" },
        { "eventId", "did you mean \"#{event.eventId}\"?" },
        { "root.winner.name()", "did you mean \"#{root.winner.name()}\"?" },
        { "fields.a", "did you mean \"#{fields.a}\"?" },
        { "event?.a", "did you mean \"#{event?.a}\"?" },
    };
    for (size_t i = 0; i < sizeof(typos) / sizeof(typos[0]); i++) {
        px_template *t = px_template_compile(typos[i].src, err, sizeof(err), NULL);
        int col = 0;
        int rc = t ? px_template_check_key(t, err, sizeof(err), &col) : PX_OK;
        char label[128];
        snprintf(label, sizeof(label), "check_key: [%s] suggests the #{...}", typos[i].src);
        test_cond(label, rc == PX_ERR && col == 1 && strstr(err, typos[i].want) != NULL);
        if (rc == PX_ERR && strstr(err, typos[i].want) == NULL) fprintf(stderr, "    %s\n", err);
        px_template_destroy(t);
    }
    px_template *t = px_template_compile("orders-v1", err, sizeof(err), NULL);
    test_cond("check_key: a constant that is no path suggests nothing",
              t && px_template_check_key(t, err, sizeof(err), NULL) == PX_ERR &&
                  strstr(err, "did you mean") == NULL);
    px_template_destroy(t);
}


/* ------------------------------------------------------------------------ */
/* Fingerprints: canonical JSON, its hash (docs/configuration.md, issue 31) */
/* ------------------------------------------------------------------------ */

/* Render 'src' as a fingerprint over the JSON text 'json'. */
static int render_fp(const char *src, const char *json, px_buf *out, char *err)
{
    char cerr[ERRLEN];
    px_template *t = px_template_compile(src, cerr, sizeof(cerr), NULL);
    struct json_object *ev = json_tokener_parse(json);
    px_tvars vars = { ev, NULL, "room", "1-0" };
    int rc = t ? px_template_render_value(t, &vars, out, err, ERRLEN) : PX_ERR;
    json_object_put(ev);
    if (t) px_template_destroy(t);
    return rc;
}

static void test_fingerprint(void)
{
    px_buf a = { 0 }, b = { 0 };
    char err[ERRLEN];
    /* Keys sorted at every level, whatever the order written; no spaces. */
    test_cond("canon: object renders",
              render_fp("#event", "{\"b\": 1, \"a\": {\"y\": [1, 2.50, \"x\"], \"x\": null}}", &a,
                        err) == PX_OK);
    test_cond("canon: keys sorted, numbers as written",
              strcmp(a.data, "{\"a\":{\"x\":null,\"y\":[1,2.50,\"x\"]},\"b\":1}") == 0);
    test_cond("canon: other key order",
              render_fp("#event", "{\"a\":{\"x\":null, \"y\":[1,2.50,\"x\"]},  \"b\":1}", &b, err) ==
                  PX_OK);
    test_cond("canon: same text whatever the key order", strcmp(a.data, b.data) == 0);
    test_cond("canon: same hash", px_hash64(a.data, a.len) == px_hash64(b.data, b.len));
    /* 2.5 is not 2.50: numbers as written (a producer that changes its
     * number format changes the fingerprint; that is documented). */
    render_fp("#event", "{\"a\":{\"x\":null,\"y\":[1,2.5,\"x\"]},\"b\":1}", &b, err);
    test_cond("canon: 2.5 differs from 2.50", strcmp(a.data, b.data) != 0);
    /* Strings escaped one way: \u00e9 and é are one character. */
    render_fp("#event", "{\"s\":\"\\u00e9\\\"\\\\\\n\\u0001/\"}", &a, err);
    test_cond("canon: string escapes", strcmp(a.data, "{\"s\":\"\xc3\xa9\\\"\\\\\\u000a\\u0001/\"}") == 0);
    render_fp("#event", "{\"s\":\"\xc3\xa9\\\"\\\\\\u000a\\u0001\\/\"}", &b, err);
    test_cond("canon: one way of writing a string", strcmp(a.data, b.data) == 0);
    /* Keys that sort by bytes, a key with escapes. */
    render_fp("#event", "{\"b\":true,\"B\":false,\"a\\\"\":[],\"\":{}}", &a, err);
    test_cond("canon: byte order, empty containers",
              strcmp(a.data, "{\"\":{},\"B\":false,\"a\\\"\":[],\"b\":true}") == 0);
    /* A part of the event, and mixed with text. */
    test_cond("canon: a member object",
              render_fp("#event.o", "{\"o\":{\"z\":1,\"a\":2}}", &a, err) == PX_OK &&
                  strcmp(a.data, "{\"a\":2,\"z\":1}") == 0);
    test_cond("canon: an array in a template",
              render_fp("v:#{event.l}", "{\"l\":[3,{\"b\":1,\"a\":0}]}", &a, err) == PX_OK &&
                  strcmp(a.data, "v:[3,{\"a\":0,\"b\":1}]") == 0);
    test_cond("canon: a scalar renders as a key does",
              render_fp("#event.n", "{\"n\":-12}", &a, err) == PX_OK && strcmp(a.data, "-12") == 0);
    /* A key still refuses objects; a fingerprint still refuses null. */
    px_template *t = px_template_compile("#event", err, sizeof(err), NULL);
    struct json_object *ev = json_tokener_parse("{\"a\":1}");
    px_tvars vars = { ev, NULL, "room", "1-0" };
    test_cond("canon: a key is no object", px_template_render(t, &vars, &a, err, sizeof(err)) == PX_ERR);
    json_object_put(ev);
    px_template_destroy(t);
    test_cond("canon: null is an error", render_fp("#event.x", "{\"x\":null}", &a, err) == PX_ERR);
    test_cond("canon: missing is an error", render_fp("#event.x", "{}", &a, err) == PX_ERR);
    /* The hash: SHA-256's first 8 bytes, big-endian (sha256("abc") =
     * ba7816bf8f01cfea...), written as 16 hex digits. */
    test_cond("hash: sha-256 prefix", px_hash64("abc", 3) == 0xba7816bf8f01cfeaull);
    char hex[17];
    px_hash64_hex(0x00ab0000000000ffull, hex);
    test_cond("hash: hex", strcmp(hex, "00ab0000000000ff") == 0);
    px_buf_deinit(&a);
    px_buf_deinit(&b);
}

int main(int argc, char **argv)
{
    test_table(find_table(argc, argv));

    struct json_object *event = json_tokener_parse(EVENT);
    test_cond("the built-in event parses", event != NULL);
    test_buffer_reuse(event);
    test_growth(event);
    test_sugar(event);
    test_numbers();
    test_vars(event);
    test_facts();
    test_errors(event);
    test_utf8();
    test_reads_entry();
    test_fuzz(event);
    test_fingerprint();
    json_object_put(event);

    printf("%d table cases\n", cases_run);
    return test_report();
}
