/*
 * px.h - what every idemproxy module shares: return codes, the growable
 * byte buffer and allocation helpers that abort with the size on OOM
 * (as Redis' zmalloc does: a sidecar that cannot allocate cannot help).
 */
#ifndef PX_H
#define PX_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#define PX_OK     0
#define PX_ERR    -1
#define PX_EAGAIN -2

#define PX_VERSION "0.1.0"

/* A growable byte buffer; 'data' is always NUL-terminated once used. */
typedef struct px_buf {
    char *data; /* owned; NULL until first use */
    size_t len; /* bytes in use, excluding the terminating NUL */
    size_t cap; /* bytes allocated */
} px_buf;

void *px_malloc(size_t size);
void *px_calloc(size_t n, size_t size);
void *px_realloc(void *ptr, size_t size);
char *px_strdup(const char *s);
char *px_strndup(const char *s, size_t n);

void px_buf_reserve(px_buf *b, size_t extra); /* room for 'extra' more bytes + NUL */
void px_buf_append(px_buf *b, const void *p, size_t n);
void px_buf_appends(px_buf *b, const char *s);
void px_buf_printf(px_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void px_buf_reset(px_buf *b);  /* len = 0, keeps the memory */
void px_buf_deinit(px_buf *b); /* frees the memory */

/* True when 's' ('n' bytes) is well-formed UTF-8 (no overlongs, no surrogates). */
bool px_utf8_valid(const char *s, size_t n);

/* Wall clock in milliseconds since the epoch. */
uint64_t px_now_ms(void);

#endif
