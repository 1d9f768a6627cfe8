/*
 * bench_producer.c - the producer of `make bench`: XADDs JSON events to one
 * stream, some of them copies of earlier events.
 *
 * Every entry has one field, "payload", holding
 *   {"eventId":"<prefix>-<k>","type":"room.joined","roomId":"room-<k%1000>",
 *    "userId":"user-<k*7919%100000>","ts_us":<CLOCK_REALTIME us at send>}
 * Entry i is a copy with probability --copies (a re-publish of the eventId of
 * an earlier entry, picked uniformly among the keys published so far),
 * otherwise a new key. The choice comes from a PRNG seeded with --seed, so the
 * same arguments give the same keys in the same order: that is how the bench
 * reloads "the same data" after each FLUSHALL. Any prefix of the stream has
 * about the same copy ratio as the whole.
 *
 * Bulk mode (default): --entries N, pipelined in batches of 1000.
 * Rate mode (--rate R --seconds D): R*D entries at a steady R per second;
 * each is stamped when it is sent, for the worker's XADD-to-worker latency.
 * Prints one JSON line: {"entries":..,"unique":..,"copies":..,"seconds":..,"rate":..}
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

static uint64_t rng;
static uint64_t next_rand(void)      /* splitmix64 */
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned long long realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static const char *stream = "bench", *prefix = "evt";
static double copy_ratio = 0.5;
static unsigned long long nkeys;     /* distinct keys published so far */

/* Append the XADD of the next entry to c's output buffer. */
static void append_next(redisContext *c)
{
    unsigned long long k;
    if (nkeys > 0 && (double)(next_rand() >> 11) / 9007199254740992.0 < copy_ratio)
        k = next_rand() % nkeys;
    else
        k = nkeys++;
    char payload[256];
    int len = snprintf(payload, sizeof(payload),
                       "{\"eventId\":\"%s-%08llu\",\"type\":\"room.joined\",\"roomId\":\"room-%llu\","
                       "\"userId\":\"user-%llu\",\"ts_us\":%llu}",
                       prefix, k, k % 1000, k * 7919 % 100000, realtime_us());
    const char *argv[] = { "XADD", stream, "*", "payload", payload };
    size_t lens[] = { 4, strlen(stream), 1, 7, (size_t)len };
    if (redisAppendCommandArgv(c, 5, argv, lens) != REDIS_OK) {
        fprintf(stderr, "bench_producer: append: %s\n", c->errstr);
        exit(1);
    }
}

/* Read n XADD replies; each must be an entry id. */
static void read_replies(redisContext *c, long n)
{
    for (long i = 0; i < n; i++) {
        redisReply *r;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            fprintf(stderr, "bench_producer: reply: %s\n", c->errstr);
            exit(1);
        }
        if (r->type != REDIS_REPLY_STRING) {
            fprintf(stderr, "bench_producer: XADD answered %s\n",
                    r->type == REDIS_REPLY_ERROR ? r->str : "not an id");
            exit(1);
        }
        freeReplyObject(r);
    }
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 6379;
    long entries = 200000, seed = 1;
    double rate = 0, seconds = 0;
    static const struct option opts[] = {
        { "host", required_argument, NULL, 'h' },    { "port", required_argument, NULL, 'p' },
        { "stream", required_argument, NULL, 's' },  { "entries", required_argument, NULL, 'n' },
        { "copies", required_argument, NULL, 'c' },  { "seed", required_argument, NULL, 'S' },
        { "prefix", required_argument, NULL, 'P' },  { "rate", required_argument, NULL, 'r' },
        { "seconds", required_argument, NULL, 'd' }, { NULL, 0, NULL, 0 } };
    int o;
    while ((o = getopt_long(argc, argv, "h:p:s:n:c:S:P:r:d:", opts, NULL)) != -1) {
        switch (o) {
        case 'h': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 's': stream = optarg; break;
        case 'n': entries = atol(optarg); break;
        case 'c': copy_ratio = atof(optarg); break;
        case 'S': seed = atol(optarg); break;
        case 'P': prefix = optarg; break;
        case 'r': rate = atof(optarg); break;
        case 'd': seconds = atof(optarg); break;
        default:
            fprintf(stderr, "usage: bench_producer [--host H] [--port P] [--stream S] [--entries N]"
                            " [--copies F] [--seed S] [--prefix P] [--rate R --seconds D]\n");
            return 2;
        }
    }
    rng = (uint64_t)seed;
    if (rate > 0) entries = (long)(rate * seconds);

    redisContext *c = redisConnect(host, port);
    if (c == NULL || c->err) {
        fprintf(stderr, "bench_producer: connect %s:%d: %s\n", host, port, c ? c->errstr : "oom");
        return 1;
    }
    double t0 = now_s();
    long sent = 0;
    if (rate <= 0) {
        while (sent < entries) {
            long n = entries - sent < 1000 ? entries - sent : 1000;
            for (long i = 0; i < n; i++) append_next(c);
            read_replies(c, n);
            sent += n;
        }
    } else {
        /* Send what is due, read its replies, sleep until the next one is due. */
        while (sent < entries) {
            long due = (long)((now_s() - t0) * rate) + 1;
            if (due > entries) due = entries;
            if (due > sent) {
                for (long i = sent; i < due; i++) append_next(c);
                read_replies(c, due - sent);
                sent = due;
                continue;
            }
            double wake = t0 + (double)sent / rate;
            struct timespec ts = { (time_t)wake, (long)((wake - (double)(time_t)wake) * 1e9) };
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
    }
    double dt = now_s() - t0;
    printf("{\"entries\":%ld,\"unique\":%llu,\"copies\":%llu,\"seconds\":%.6f,\"rate\":%.1f}\n",
           entries, nkeys, (unsigned long long)entries - nkeys, dt, (double)entries / dt);
    redisFree(c);
    return 0;
}
