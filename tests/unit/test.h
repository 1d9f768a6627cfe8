/*
 * test.h - the smallest test harness that does the job (after hiredis' test.c).
 * Each test binary ends by printing "N passed, N failed" and exits non-zero on
 * any failure; tests/run adds the counts of every suite.
 */
#ifndef PX_TEST_H
#define PX_TEST_H

#include <stdio.h>
#include <string.h>

static int px_tests_passed, px_tests_failed;

#define test_cond(name, cond) do {                                           \
        if (cond) { px_tests_passed++; }                                     \
        else { px_tests_failed++;                                            \
               fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, name); } \
    } while (0)

#define test_streq(name, got, want) do {                                     \
        const char *g_ = (got), *w_ = (want);                                \
        if (g_ && w_ && strcmp(g_, w_) == 0) { px_tests_passed++; }          \
        else { px_tests_failed++;                                            \
               fprintf(stderr, "FAIL %s:%d: %s: got [%s] want [%s]\n",        \
                       __FILE__, __LINE__, name, g_ ? g_ : "(null)",         \
                       w_ ? w_ : "(null)"); }                                \
    } while (0)

static inline int test_report(void)
{
    printf("%d passed, %d failed\n", px_tests_passed, px_tests_failed);
    return px_tests_failed ? 1 : 0;
}

#endif
