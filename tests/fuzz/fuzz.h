/*
 * fuzz.h - what the libFuzzer harnesses share: the entry points, a check that
 * turns a broken contract into a crash libFuzzer records, and a counter of
 * heap allocations for "rendering allocates nothing it does not return".
 */
#ifndef PX_FUZZ_H
#define PX_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A contract of the code under test does not hold: report it and abort, so
 * libFuzzer saves the input as a crash. */
#define FUZZ_CHECK(cond, ...) do {                                             \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FUZZ CHECK FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            abort();                                                           \
        }                                                                      \
    } while (0)

/*
 * Known, reported problems in proxy/ that a check would otherwise stop at
 * first sight (a fuzzer stops at its first crash, so one known bug would hide
 * every other). By default every check is on; PX_FUZZ_KNOWN lists the ids of
 * the ones to let pass until the fix lands, e.g. PX_FUZZ_KNOWN=key-nul,echo-utf8.
 * The ids and their reproducers are in tests/fuzz/crashes/README.
 */
static inline bool fuzz_known(const char *id)
{
    const char *k = getenv("PX_FUZZ_KNOWN");
    size_t n = strlen(id);
    for (const char *p = k; p && (p = strstr(p, id)) != NULL; p += n)
        if ((p == k || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return true;
    return false;
}

/* ASan's allocator hooks (compiler-rt, sanitizer/allocator_interface.h). */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));

/* Heap allocations counted while 'fuzz_counting' is set. */
static volatile int    fuzz_counting;
static volatile size_t fuzz_allocs;

static void fuzz_malloc_hook(const volatile void *p, size_t n)
{
    (void)p;
    (void)n;
    if (fuzz_counting) fuzz_allocs++;
}

static void fuzz_free_hook(const volatile void *p)
{
    (void)p;
}

static inline void fuzz_count_allocs_install(void)
{
    __sanitizer_install_malloc_and_free_hooks(fuzz_malloc_hook, fuzz_free_hook);
}

static inline void fuzz_count_start(void)
{
    fuzz_allocs = 0;
    fuzz_counting = 1;
}

static inline size_t fuzz_count_stop(void)
{
    fuzz_counting = 0;
    return fuzz_allocs;
}

#endif
