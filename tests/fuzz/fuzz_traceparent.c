/*
 * fuzz_traceparent.c - libFuzzer target for the W3C traceparent parser
 * (proxy/trace.c; docs/configuration.md: a producer's trace_field is untrusted
 * input).
 *
 * Oracles: px_trace_parse never reads past the length it is given (the input
 * is copied into an exact-size buffer for ASan), leaves *out untouched when it
 * refuses, and accepts exactly what a plain reference reading of W3C
 * trace-context version 00 accepts; a header it accepts formats back
 * (px_trace_format) to the same 55 characters.
 */
#include <string.h>

#include "fuzz.h"
#include "trace.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static bool lhex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* The reference: 00-<32 hex>-<16 hex>-<2 hex>, lower case, ids not all zero. */
static bool reference(const char *s, size_t n)
{
    if (n != 55 || memcmp(s, "00-", 3) != 0 || s[35] != '-' || s[52] != '-') return false;
    bool tz = true, sz = true;
    for (size_t i = 3; i < 35; i++) {
        if (!lhex(s[i])) return false;
        if (s[i] != '0') tz = false;
    }
    for (size_t i = 36; i < 52; i++) {
        if (!lhex(s[i])) return false;
        if (s[i] != '0') sz = false;
    }
    return lhex(s[53]) && lhex(s[54]) && !tz && !sz;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size ? size : 1);
    memcpy(s, data, size);
    px_trace_ctx c, before;
    memset(&c, 0xa5, sizeof(c));
    before = c;
    bool ok = px_trace_parse(s, size, &c);
    bool want = reference(s, size);
    FUZZ_CHECK(ok == want, "parse says %d, the reference %d, for %zu bytes", ok, want, size);
    if (ok) {
        char out[PX_TRACEPARENT_LEN + 1];
        px_trace_format(&c, out);
        FUZZ_CHECK(strlen(out) == PX_TRACEPARENT_LEN && memcmp(out, s, size) == 0,
                   "formats back as %s", out);
    } else {
        FUZZ_CHECK(memcmp(&c, &before, sizeof(c)) == 0, "a refused header changed *out");
    }
    free(s);
    return 0;
}
