/*
 * log.c - stderr logging. Text lines look like
 *   2026-11-22T10:00:00.123Z warn  bad entry room 1-0: no key
 * and JSON lines like {"ts":"...","level":"warn","msg":"..."}.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
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

void px_log(px_log_level level, const char *fmt, ...)
{
    if (!px_log_enabled(level)) return;

    char msg[2048], ts[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - n, ".%03dZ", (int)(tv.tv_usec / 1000));

    if (log_format == PX_LOG_TEXT) {
        fprintf(stderr, "%s %-5s %s\n", ts, level_names[level], msg);
        return;
    }
    px_buf b = {0};
    px_buf_printf(&b, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", ts, level_names[level]);
    for (const char *p = msg; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') px_buf_printf(&b, "\\%c", c);
        else if (c < 0x20) px_buf_printf(&b, "\\u%04x", c);
        else px_buf_append(&b, p, 1);
    }
    px_buf_appends(&b, "\"}\n");
    fputs(b.data, stderr);
    px_buf_deinit(&b);
}
