/*
 * test_trace.c - unit tests of trace.c's W3C traceparent parser and formatter:
 * every malformed form is refused (and never read past its length), every
 * valid one formats back to the same text.
 */
#include "trace.h"
#include "test.h"

#include <stdlib.h>

#define GOOD "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static bool parse(const char *s)
{
    px_trace_ctx c;
    /* An exact-size copy, so a read past the length shows under ASan. */
    size_t n = strlen(s);
    char *p = malloc(n ? n : 1);
    memcpy(p, s, n);
    bool ok = px_trace_parse(p, n, &c);
    free(p);
    return ok;
}

static void test_valid(void)
{
    px_trace_ctx c;
    char out[PX_TRACEPARENT_LEN + 1];
    test_cond("the W3C example parses", px_trace_parse(GOOD, strlen(GOOD), &c));
    test_cond("trace id", c.trace_id[0] == 0x4b && c.trace_id[15] == 0x36);
    test_cond("span id", c.span_id[0] == 0x00 && c.span_id[1] == 0xf0 && c.span_id[7] == 0xb7);
    test_cond("sampled", c.flags == 1);
    px_trace_format(&c, out);
    test_streq("formats back", out, GOOD);
    static const char *const more[] = {
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", /* not sampled */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", /* unknown flags kept */
        "00-00000000000000000000000000000001-0000000000000001-01",
    };
    for (size_t i = 0; i < sizeof(more) / sizeof(*more); i++) {
        bool ok = px_trace_parse(more[i], strlen(more[i]), &c);
        test_cond(more[i], ok);
        if (ok) {
            px_trace_format(&c, out);
            test_streq("formats back", out, more[i]);
        }
    }
}

static void test_malformed(void)
{
    static const char *const bad[] = {
        "",
        "00",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",    /* short */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",  /* long */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", /* version 00 has no more */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* not version 00 */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* the invalid version */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   /* zero span id */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   /* upper case */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   /* not hex */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* separators */
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) test_cond(bad[i], !parse(bad[i]));
    px_trace_ctx c = { .flags = 7 };
    test_cond("NULL refused", !px_trace_parse(NULL, 55, &c));
    test_cond("a refused header leaves *out alone", c.flags == 7);
    /* A NUL inside: the length counts, not the string. */
    char nul[PX_TRACEPARENT_LEN];
    memcpy(nul, GOOD, sizeof(nul));
    nul[40] = '\0';
    test_cond("NUL inside", !px_trace_parse(nul, sizeof(nul), &c));
}

int main(void)
{
    test_valid();
    test_malformed();
    return test_report();
}
