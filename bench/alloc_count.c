/*
 * alloc_count.c - LD_PRELOAD'ed into one idemproxy run of `make bench`: counts
 * malloc, calloc and realloc calls by the library that made them (the caller's
 * return address, resolved with dladdr at exit) and writes "COUNT LIBRARY"
 * lines to $ALLOC_COUNT_OUT when the process exits. run.py divides by the
 * entries read: heap allocations per entry, and whose they are.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 8192   /* distinct call sites; a full table drops the rest into 'lost' */

static struct { void *pc; unsigned long n; } sites[SLOTS];
static unsigned long lost;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);

/* dlsym may itself calloc before real_calloc is known: serve that from here. */
static _Alignas(16) char boot[16384];
static size_t boot_used;

static void count(void *pc)
{
    size_t h = ((uintptr_t)pc >> 4) % SLOTS;
    for (size_t i = 0; i < SLOTS; i++) {
        size_t j = (h + i) % SLOTS;
        void *cur = __atomic_load_n(&sites[j].pc, __ATOMIC_ACQUIRE);
        if (cur == NULL) {
            void *expect = NULL;
            if (__atomic_compare_exchange_n(&sites[j].pc, &expect, pc, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                cur = pc;
            else
                cur = expect;
        }
        if (cur == pc) {
            __atomic_add_fetch(&sites[j].n, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    __atomic_add_fetch(&lost, 1, __ATOMIC_RELAXED);
}

static void resolve(void)
{
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_free = dlsym(RTLD_NEXT, "free");
}

void *malloc(size_t size)
{
    if (real_malloc == NULL) resolve();
    count(__builtin_return_address(0));
    return real_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    if (real_calloc == NULL) {
        size_t need = (n * size + 15) & ~(size_t)15;
        if (boot_used + need > sizeof(boot)) return NULL;
        void *p = boot + boot_used;
        boot_used += need;
        return p;   /* static memory is zero */
    }
    count(__builtin_return_address(0));
    return real_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
    if (real_realloc == NULL) resolve();
    count(__builtin_return_address(0));
    if ((char *)p >= boot && (char *)p < boot + sizeof(boot)) {   /* grown out of 'boot' */
        void *q = real_malloc(size);
        size_t have = (size_t)(boot + boot_used - (char *)p);
        if (q) memcpy(q, p, have < size ? have : size);
        return q;
    }
    return real_realloc(p, size);
}

void free(void *p)
{
    if ((char *)p >= boot && (char *)p < boot + sizeof(boot)) return;
    if (real_free == NULL) resolve();
    real_free(p);
}

__attribute__((constructor)) static void start(void)
{
    resolve();
}

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("ALLOC_COUNT_OUT");
    if (path == NULL) return;
    /* Sum by library; a handful of libraries, so a small table. */
    const char *name[64];
    unsigned long total[64];
    size_t nlib = 0;
    for (size_t i = 0; i < SLOTS; i++) {
        if (sites[i].pc == NULL) continue;
        Dl_info d;
        const char *lib = dladdr(sites[i].pc, &d) && d.dli_fname ? d.dli_fname : "?";
        const char *base = strrchr(lib, '/');
        lib = base ? base + 1 : lib;
        size_t k = 0;
        while (k < nlib && strcmp(name[k], lib) != 0) k++;
        if (k == nlib) {
            if (nlib == 64) continue;
            name[nlib] = lib;
            total[nlib++] = 0;
        }
        total[k] += sites[i].n;
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) return;
    for (size_t k = 0; k < nlib; k++) fprintf(f, "%lu %s\n", total[k], name[k]);
    if (lost) fprintf(f, "%lu ?\n", lost);
    fclose(f);
}
