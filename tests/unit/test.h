/*
 * test.h - the smallest test harness that does the job (after hiredis' test.c).
 * Each test binary ends by printing "N passed, N failed" and exits non-zero on
 * any failure; tests/run adds the counts of every suite. Before it, the line
 * "N tests, N rows" says how many distinct checks (places in the source) ran
 * and how many times they ran in all (a table of 262 cases checked by one
 * line is 1 test and 262 rows), so the summary can say what the count is.
 */
#ifndef PX_TEST_H
#define PX_TEST_H

#include <stdio.h>
#include <string.h>

static int px_tests_passed, px_tests_failed;

/* The distinct check sites seen so far (file, line). */
static struct { const char *file; int line; } px_test_sites[4096];
static int px_test_nsites;

static inline void px_test_site(const char *file, int line)
{
    int i;

    for (i = px_test_nsites - 1; i >= 0; i--)
        if (px_test_sites[i].line == line && strcmp(px_test_sites[i].file, file) == 0)
            return;
    if (px_test_nsites < (int) (sizeof(px_test_sites) / sizeof(px_test_sites[0]))) {
        px_test_sites[px_test_nsites].file = file;
        px_test_sites[px_test_nsites].line = line;
        px_test_nsites++;
    }
}

#define test_cond(name, cond) do {                                           \
        px_test_site(__FILE__, __LINE__);                                    \
        if (cond) { px_tests_passed++; }                                     \
        else { px_tests_failed++;                                            \
               fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, name); } \
    } while (0)

#define test_streq(name, got, want) do {                                     \
        const char *g_ = (got), *w_ = (want);                                \
        px_test_site(__FILE__, __LINE__);                                    \
        if (g_ && w_ && strcmp(g_, w_) == 0) { px_tests_passed++; }          \
        else { px_tests_failed++;                                            \
               fprintf(stderr, "FAIL %s:%d: %s: got [%s] want [%s]\n",        \
                       __FILE__, __LINE__, name, g_ ? g_ : "(null)",         \
                       w_ ? w_ : "(null)"); }                                \
    } while (0)

static inline int test_report(void)
{
    printf("%d tests, %d rows\n", px_test_nsites, px_tests_passed + px_tests_failed);
    printf("%d passed, %d failed\n", px_tests_passed, px_tests_failed);
    return px_tests_failed ? 1 : 0;
}

#endif
