/*
 * canary.c - a program with the faults tests/memcheck.sh must report, run
 * through the same options and scans as the daemon before the daemon is: a
 * scan that misses these would pass a leaking daemon too.
 *   canary leak      77 bytes definitely lost at exit
 *   canary ub        a shift past the width of int (UBSan)
 *   canary badfree   free() of a pointer malloc did not return
 *   canary           nothing wrong: exits 0, no report
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile keep;

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    char *p;

    if (strcmp(what, "leak") == 0) {
        p = malloc(77);
        memset(p, 1, 77);
        keep = p;
        keep = NULL;                 /* the only pointer is gone */
    } else if (strcmp(what, "ub") == 0) {
        volatile int width = 30 + argc;
        printf("%d\n", 1 << width);  /* 1 << 32 */
    } else if (strcmp(what, "badfree") == 0) {
        p = malloc(16);
        keep = p;
        free(p + 1);
    }
    return 0;
}
