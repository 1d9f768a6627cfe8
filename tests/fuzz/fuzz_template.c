/*
 * fuzz_template.c - libFuzzer target for the key template language
 * (proxy/template.c, docs/configuration.md): px_template_compile and
 * px_template_render.
 *
 * Input: the template source, then optionally a NUL byte and a JSON text.
 * The source is compiled; if it compiles it is rendered over the fixed event
 * and fields of tests/unit/template_cases.json ("defaults"), and, when the
 * JSON after the NUL parses, over that value as #event, as #fields, and with
 * the variables unset.
 *
 * Beyond "no crash, no leak, no undefined behaviour", each call is held to
 * the contract in template.h:
 * - a compile error has a message and a column inside the source (1-based, in
 *   characters, at most one past the end);
 * - px_template_source gives the source back;
 * - a render is PX_OK with a NUL-terminated result, or PX_ERR with a message
 *   and an empty buffer; rendering again gives the same answer;
 * - rendering again into the grown buffer allocates nothing ("rendering a key
 *   allocates nothing it does not return");
 * - error buffers of any size, even 1 byte, are respected (ASan sees each
 *   one as a heap block of exactly that size), and every message is UTF-8
 *   (it reaches dead-letter reasons, `check` and JSON log lines).
 */
#include <string.h>

#include <json-c/json.h>

#include "fuzz.h"
#include "template.h"

/* tests/unit/template_cases.json "defaults", numbers as written there. */
static const char fixed_event_json[] =
    "{\"eventId\": \"e-42\", \"joinCode\": \"ABCD\", \"roomId\": 7, \"seq\": 0, \"neg\": -3,"
    " \"price\": 1.50, \"ratio\": 1e3, \"ok\": true, \"off\": false, \"empty\": \"\","
    " \"space\": \" \", \"nil\": null, \"quote\": \"it's\","
    " \"unicode\": \"\\u017c\\u00f3\\u0142w \\ud83d\\udc22\","
    " \"winner\": {\"name\": \"ann\", \"score\": 10, \"nick\": null, \"team\": {\"id\": \"t1\"}},"
    " \"items\": [{\"id\": \"i1\", \"qty\": 2}, {\"id\": \"i2\", \"tags\": [\"x\", \"y\"]},"
    " \"plain\", 5, null, [10, 20]],"
    " \"empties\": [], \"dotted.name\": \"dn\", \"with space\": \"ws\", \"key\": \"winner\","
    " \"idx\": 1, \"big\": 9007199254740993, \"near_max\": 9223372036854775806,"
    " \"u64\": 18446744073709551614, \"payload\": {\"eventId\": \"p-1\"}}";
static const char fixed_fields_json[] =
    "{\"eventId\": \"e-42\", \"kind\": \"join\", \"payload\": \"{\\\"eventId\\\":\\\"p-1\\\"}\"}";

static json_object *fixed_event, *fixed_fields;

/* Reused across inputs, as event.c reuses its buffer across entries. */
static px_buf out;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fixed_event = json_tokener_parse(fixed_event_json);
    fixed_fields = json_tokener_parse(fixed_fields_json);
    if (fixed_event == NULL || fixed_fields == NULL) {
        fprintf(stderr, "fuzz_template: the fixed event does not parse\n");
        abort();
    }
    fuzz_count_allocs_install();
    return 0;
}

/* Characters (UTF-8 lead bytes and ASCII) in 's'. */
static int nchars(const char *s)
{
    int n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

/* Render 't' over 'vars' with an error buffer of exactly 'errlen' bytes; checks
 * the PX_OK / PX_ERR contract. Returns the result code. */
static int render_checked(const px_template *t, const px_tvars *vars, size_t errlen)
{
    char *err = errlen ? malloc(errlen) : NULL;
    if (err) memset(err, 'x', errlen);
    int rc = px_template_render(t, vars, &out, err, errlen);
    FUZZ_CHECK(rc == PX_OK || rc == PX_ERR, "rc %d", rc);
    FUZZ_CHECK(out.data != NULL, "no buffer after a render");
    FUZZ_CHECK(out.len < out.cap && out.data[out.len] == '\0', "result not NUL-terminated");
    if (rc == PX_ERR) {
        FUZZ_CHECK(out.len == 0, "a failed render leaves %zu bytes", out.len);
        if (errlen > 1) FUZZ_CHECK(err[0] != '\0', "a failed render without a message");
    }
    if (err) FUZZ_CHECK(memchr(err, '\0', errlen) != NULL, "error message not terminated");
    /* a dead letter's reason and a JSON log line: cut between characters */
    if (rc == PX_ERR && err)
        FUZZ_CHECK(px_utf8_valid(err, strlen(err)), "a render error that is not UTF-8: %s", err);
    free(err);
    return rc;
}

/* Render over 'vars' the ways the contract promises the same answer. */
static void render_all(const px_template *t, const px_tvars *vars)
{
    char err[256];
    int rc = render_checked(t, vars, sizeof(err));
    size_t len = out.len;
    char *first = malloc(len + 1);
    memcpy(first, out.data, len + 1);

    /* Again, into the buffer the first render grew: same answer, and not one
     * allocation (the buffer is big enough for everything this render does). */
    fuzz_count_start();
    int rc2 = px_template_render(t, vars, &out, err, sizeof(err));
    size_t allocs = fuzz_count_stop();
    FUZZ_CHECK(rc2 == rc, "second render %d, first %d", rc2, rc);
    FUZZ_CHECK(out.len == len && memcmp(out.data, first, len) == 0,
               "second render gives another key");
    FUZZ_CHECK(allocs == 0, "a render into a big enough buffer made %zu allocations", allocs);
    free(first);

    /* Tiny and missing error buffers. */
    FUZZ_CHECK(render_checked(t, vars, 1) == rc, "answer depends on the error buffer");
    FUZZ_CHECK(render_checked(t, vars, 7) == rc, "answer depends on the error buffer");
    FUZZ_CHECK(render_checked(t, vars, 0) == rc, "answer depends on the error buffer");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The source ends at the first NUL (templates are C strings); the rest is JSON. */
    const uint8_t *nul = memchr(data, 0, size);
    size_t srclen = nul ? (size_t)(nul - data) : size;
    char *src = malloc(srclen + 1);
    memcpy(src, data, srclen);
    src[srclen] = '\0';

    char err[256];
    int col = -1;
    px_template *t = px_template_compile(src, err, sizeof(err), &col);
    if (t == NULL) {
        FUZZ_CHECK(err[0] != '\0', "compile error without a message");
        FUZZ_CHECK(px_utf8_valid(err, strlen(err)), "a compile error that is not UTF-8: %s", err);
        FUZZ_CHECK(col >= 1 && col <= nchars(src) + 1, "column %d outside 1..%d", col,
                   nchars(src) + 1);
        /* Same answer without an error buffer or a column. */
        px_template *t2 = px_template_compile(src, NULL, 0, NULL);
        FUZZ_CHECK(t2 == NULL, "compiles only without an error buffer");
        free(src);
        return 0;
    }
    FUZZ_CHECK(strcmp(px_template_source(t), src) == 0, "source not kept");

    px_tvars vars = { fixed_event, fixed_fields, "orders", "1700000000000-0" };
    render_all(t, &vars);

    if (nul) {
        const char *json = (const char *)nul + 1;
        size_t jlen = size - srclen - 1;
        json_tokener *tok = json_tokener_new();
        json_object *o = json_tokener_parse_ex(tok, json, (int)jlen);
        if (o == NULL && json_tokener_get_error(tok) == json_tokener_continue)
            o = json_tokener_parse_ex(tok, "", 1);   /* end of input: "12" is a number */
        json_tokener_free(tok);
        if (o != NULL) {
            px_tvars v1 = { o, fixed_fields, "orders", "1700000000000-0" };
            px_tvars v2 = { fixed_event, o, "", "" };
            render_all(t, &v1);
            render_all(t, &v2);
        }
        json_object_put(o);
        px_tvars none = { NULL, NULL, NULL, NULL };
        render_all(t, &none);
    }
    px_template_destroy(t);
    free(src);
    return 0;
}
