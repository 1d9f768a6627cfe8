/*
 * log.c - stderr logging. Text lines look like
 *   2026-11-22T10:00:00.123Z info  redis: ready
 * and JSON lines like {"ts":"...","level":"warn","msg":"..."}. A line about
 * one entry (px_log_entry, entry.c) names it: text lines begin with
 * "stream S entry ID key K attempt N: ", JSON lines carry "stream",
 * "entry_id", "key" and "attempt" as fields before "msg".
 */
#include "log.h"
#include "px.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static px_log_level log_level = PX_LOG_INFO;
static px_log_format log_format = PX_LOG_TEXT;

static const char *level_names[] = { "error", "warn", "info", "debug" };

void px_log_setup(px_log_level level, px_log_format format)
{
    log_level = level;
    log_format = format;
}

bool px_log_enabled(px_log_level level)
{
    return level <= log_level;
}

static void log_line(px_log_level level, const px_log_about *about, const char *msg);

void px_log_about_v(px_log_level level, px_log_limit *l, double every_s, const px_log_about *about,
                    const char *fmt, va_list ap)
{
    if (!px_log_enabled(level)) return;
    if (l) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
        if (now < l->next) {
            l->left_out++;
            return;
        }
        l->next = now + every_s;
    }
    char msg[2048];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (l && l->left_out && n >= 0 && (size_t)n < sizeof(msg))
        snprintf(msg + n, sizeof(msg) - (size_t)n, " (and %lu more like it since the last)",
                 l->left_out);
    if (l) l->left_out = 0;
    px_utf8_cut_end(msg); /* a long message cut between characters */
    log_line(level, about, msg);
}

void px_log(px_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_log_about_v(level, NULL, 0, NULL, fmt, ap);
    va_end(ap);
}

void px_log_limited(px_log_limit *l, double every_s, px_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_log_about_v(level, l, every_s, NULL, fmt, ap);
    va_end(ap);
}

/* 's' as the inside of a JSON string: valid UTF-8 whatever its bytes (a
 * worker's reason, a key, a Redis error), or the line would not be JSON. */
static void json_chars(px_buf *b, const char *s)
{
    px_buf_escape(b, s, strlen(s), PX_ESC_JSON);
}

static void log_line(px_log_level level, const px_log_about *about, const char *msg)
{
    char ts[40];

    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - n, ".%03dZ", (int)(tv.tv_usec / 1000));

    if (log_format == PX_LOG_TEXT) {
        px_buf line = { 0 };
        if (about)
            px_buf_printf(&line, "stream %s entry %s key %s attempt %u: ", about->stream,
                          about->entry_id, about->key ? about->key : "-", about->attempt);
        px_buf_appends(&line, msg);
        /* One message, one line: a key or a Redis error holding a newline or
         * another control character cannot forge a line of its own, nor send
         * a terminal an escape sequence; bytes that are not UTF-8 read \xNN. */
        px_buf t = { 0 };
        px_buf_escape(&t, line.data, line.len, 0);
        fprintf(stderr, "%s %-5s %s\n", ts, level_names[level], t.data ? t.data : "");
        px_buf_deinit(&t);
        px_buf_deinit(&line);
        return;
    }
    px_buf b = { 0 };
    px_buf_printf(&b, "{\"ts\":\"%s\",\"level\":\"%s\"", ts, level_names[level]);
    if (about) {
        px_buf_appends(&b, ",\"stream\":\"");
        json_chars(&b, about->stream);
        px_buf_appends(&b, "\",\"entry_id\":\"");
        json_chars(&b, about->entry_id);
        if (about->key) {
            px_buf_appends(&b, "\",\"key\":\"");
            json_chars(&b, about->key);
            px_buf_appends(&b, "\"");
        } else {
            px_buf_appends(&b, "\",\"key\":null");
        }
        px_buf_printf(&b, ",\"attempt\":%u", about->attempt);
    }
    px_buf_appends(&b, ",\"msg\":\"");
    json_chars(&b, msg);
    px_buf_appends(&b, "\"}\n");
    fputs(b.data, stderr);
    px_buf_deinit(&b);
}

void px_assert_fail(const char *cond, const char *file, int line)
{
    px_log_error("assertion failed: %s (%s:%d)", cond, file, line);
    abort();
}
