/*
 * log.h - one line per message on stderr, as text or JSON (SPEC 4 log.*).
 * Messages never contain secrets: callers pass redacted values.
 */
#ifndef PX_LOG_H
#define PX_LOG_H

#include "config.h"

void px_log_setup(px_log_level level, px_log_format format);
bool px_log_enabled(px_log_level level);
void px_log(px_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define px_log_error(...) px_log(PX_LOG_ERROR, __VA_ARGS__)
#define px_log_warn(...)  px_log(PX_LOG_WARN, __VA_ARGS__)
#define px_log_info(...)  px_log(PX_LOG_INFO, __VA_ARGS__)
#define px_log_debug(...) do { if (px_log_enabled(PX_LOG_DEBUG)) px_log(PX_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
