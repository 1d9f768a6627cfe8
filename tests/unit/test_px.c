/*
 * test_px.c - px.c's text helpers (issue 37): the one escape every printer of
 * untrusted bytes uses (log lines, text and JSON; inspect and redrive), and
 * the cut of a message that ran out of room, between characters.
 */
#include <stdlib.h>
#include <string.h>

#include "px.h"
#include "test.h"

static void check_escape(const char *in, size_t n, int flags, const char *want)
{
    char label[160];
    px_buf b = { 0 };
    px_buf_escape(&b, in, n, flags);
    snprintf(label, sizeof(label), "escape of %s (flags %d)", want, flags);
    test_streq(label, b.data ? b.data : "", want);
    test_cond("the escaped text is UTF-8", b.data == NULL || px_utf8_valid(b.data, b.len));
    px_buf_deinit(&b);
}

#define ESC(s, flags, want) check_escape(s, sizeof(s) - 1, flags, want)

static void test_escape(void)
{
    /* kept: text, UTF-8 characters (2, 3 and 4 bytes) */
    ESC("plain", 0, "plain");
    ESC("gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x98\x80", 0, "gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x98\x80");
    ESC("gr\xc3\xb6\xc3\x9f" "e", PX_ESC_JSON, "gr\xc3\xb6\xc3\x9f" "e");
    /* controls: C0, DEL, C1 (U+009B) */
    ESC("a\nb\rc\td", 0, "a\\nb\\rc\\x09d");
    ESC("a\nb\rc\td", PX_ESC_JSON, "a\\nb\\rc\\td");
    ESC("\x1b[2J\x7f", 0, "\\x1b[2J\\x7f");
    ESC("\x1b[2J\x7f", PX_ESC_JSON, "\\u001b[2J\\u007f");
    ESC("\xc2\x9b" "1m \xc2\xa0", 0, "\\xc2\\x9b" "1m \xc2\xa0");   /* U+00A0 is no control */
    ESC("\xc2\x9b", PX_ESC_JSON, "\\u009b");
    ESC("a\0b", PX_ESC_JSON, "a\\u0000b");
    /* bytes that are not UTF-8: invalid, overlong, a surrogate, cut short */
    ESC("\xff\xfe", 0, "\\xff\\xfe");
    ESC("\xff", PX_ESC_JSON, "\\\\xff");
    ESC("\xc0\xaf", 0, "\\xc0\\xaf");
    ESC("\xed\xa0\x80", 0, "\\xed\\xa0\\x80");
    ESC("ab\xe2\x82", 0, "ab\\xe2\\x82");
    /* only the bytes that are not UTF-8, for a JSON writer that escapes the rest */
    ESC("\x1b[2J \xff \"\\ \xc3\xb6", PX_ESC_BYTES, "\x1b[2J \\xff \"\\ \xc3\xb6");
    /* quotes and backslashes */
    ESC("\"q\" \\", 0, "\"q\" \\");
    ESC("\"q\" \\", PX_ESC_BACKSLASH, "\"q\" \\\\");
    ESC("\"q\" \\", PX_ESC_JSON, "\\\"q\\\" \\\\");
}

static void test_cut_end(void)
{
    static const struct { const char *in, *want; } cases[] = {
        { "abc", "abc" },
        { "ab\xe2\x82\xac", "ab\xe2\x82\xac" },   /* whole: kept */
        { "ab\xe2\x82", "ab" },                   /* cut inside: dropped */
        { "ab\xe2", "ab" },
        { "ab\xf0\x9f\x98", "ab" },
        { "ab\xc3", "ab" },
        { "\xc3\xb6", "\xc3\xb6" },
        { "", "" },
        { "ab\xe2\x82\xac\xe2\x82", "ab\xe2\x82\xac" },   /* as snprintf cuts one */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char s[32];
        snprintf(s, sizeof(s), "%s", cases[i].in);
        px_utf8_cut_end(s);
        test_streq("cut at the end between characters", s, cases[i].want);
    }
}

int main(void)
{
    test_escape();
    test_cut_end();
    return test_report();
}
