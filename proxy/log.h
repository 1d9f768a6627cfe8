/*
 * log.h - one line per message on stderr, as text or JSON
 * (docs/configuration.md, log). Messages never contain secrets: callers pass
 * redacted values.
 */
#ifndef PX_LOG_H
#define PX_LOG_H

#include <stdarg.h>

#include "config.h"

void px_log_setup(px_log_level level, px_log_format format);
bool px_log_enabled(px_log_level level);
void px_log(px_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A repeating condition logs at most once per 'every_s' seconds per place:
 * px_log_limited(&limit, 1.0, PX_LOG_WARN, fmt, ...). The first line after a
 * quiet spell says how many were left out. */
typedef struct px_log_limit {
    double next;
    unsigned long left_out;
} px_log_limit;
void px_log_limited(px_log_limit *l, double every_s, px_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The entry a line is about: text lines begin with
 * "stream S entry ID key K attempt N: ", JSON lines carry them as the fields
 * "stream", "entry_id", "key" (null when it has none) and "attempt". entry.c's
 * px_log_entry fills it from an entry; NULL for a line about no entry. */
typedef struct px_log_about {
    const char *stream;
    const char *entry_id;
    const char *key;
    unsigned attempt;
} px_log_about;
void px_log_about_v(px_log_level level, px_log_limit *l, double every_s, const px_log_about *about,
                    const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

#define px_log_error(...) px_log(PX_LOG_ERROR, __VA_ARGS__)
#define px_log_warn(...)  px_log(PX_LOG_WARN, __VA_ARGS__)
#define px_log_info(...)  px_log(PX_LOG_INFO, __VA_ARGS__)
#define px_log_debug(...) \
    do { \
        if (px_log_enabled(PX_LOG_DEBUG)) px_log(PX_LOG_DEBUG, __VA_ARGS__); \
    } while (0)

#endif
