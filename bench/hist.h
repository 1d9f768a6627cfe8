/*
 * hist.h - the latency histogram of the bench programs, and the producer's
 * timestamp. Microseconds, log-linear: 1 us steps below 1024 us, then 512
 * steps per power of two (about 0.2 % resolution) up to 2^41 us. Percentiles
 * report the middle of their bucket. Header-only: static functions.
 */
#ifndef BENCH_HIST_H
#define BENCH_HIST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKETS (1024 + 31 * 512)

typedef struct hist { uint64_t n, max, b[NBUCKETS]; } hist;

static inline int bucket_of(uint64_t v)
{
    if (v < 1024) return (int)v;
    if (v >= (1ULL << 41)) v = (1ULL << 41) - 1;
    int m = 63 - __builtin_clzll(v);              /* 10..40 */
    return 1024 + (m - 10) * 512 + (int)((v >> (m - 9)) - 512);
}

/* The middle of bucket i, in microseconds. */
static inline double bucket_mid(int i)
{
    if (i < 1024) return i;
    int k = i - 1024, m = 10 + k / 512;
    uint64_t lo = (uint64_t)(k % 512 + 512) << (m - 9);
    return (double)lo + (double)(1ULL << (m - 9)) / 2.0;
}

static inline void hist_add(hist *h, uint64_t us)
{
    h->b[bucket_of(us)]++;
    h->n++;
    if (us > h->max) h->max = us;
}

static inline void hist_merge(hist *into, const hist *h)
{
    into->n += h->n;
    if (h->max > into->max) into->max = h->max;
    for (int i = 0; i < NBUCKETS; i++) into->b[i] += h->b[i];
}

static inline double percentile(const hist *h, double p)
{
    if (h->n == 0) return -1;
    uint64_t rank = (uint64_t)(p * (double)h->n + 0.999999), cum = 0;
    if (rank < 1) rank = 1;
    for (int i = 0; i < NBUCKETS; i++) {
        cum += h->b[i];
        if (cum >= rank) return bucket_mid(i);
    }
    return (double)h->max;
}

/* "lat_n":..,"p50_us":..,"p99_us":..,"p999_us":..,"max_us":.. (no braces). */
static inline void hist_print_json(const hist *h)
{
    printf("\"lat_n\":%llu,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%llu",
           (unsigned long long)h->n, percentile(h, 0.50), percentile(h, 0.99), percentile(h, 0.999),
           (unsigned long long)h->max);
}

static inline uint64_t now_us(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The producer's stamp (CLOCK_REALTIME us) from a payload such as
 * {"eventId":"..","ts_us":123}; -1 when there is none. */
static inline int payload_ts(const void *p, size_t len, uint64_t *ts)
{
    static const char tag[] = "\"ts_us\":";
    char buf[512];
    if (len >= sizeof(buf)) len = sizeof(buf) - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    const char *at = strstr(buf, tag);
    if (at == NULL) return -1;
    *ts = strtoull(at + sizeof(tag) - 1, NULL, 10);
    return 0;
}

#endif
