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
/* Free a password (NULL is fine) after overwriting it, so no freed heap
 * block keeps it. */
void px_free_secret(char *s);

void px_buf_reserve(px_buf *b, size_t extra); /* room for 'extra' more bytes + NUL */
void px_buf_append(px_buf *b, const void *p, size_t n);
void px_buf_appends(px_buf *b, const char *s);
void px_buf_printf(px_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void px_buf_reset(px_buf *b);  /* len = 0, keeps the memory */
void px_buf_deinit(px_buf *b); /* frees the memory */

/* True when 's' ('n' bytes) is well-formed UTF-8 (no overlongs, no surrogates). */
bool px_utf8_valid(const char *s, size_t n);
/* The length (1-4) of the well-formed UTF-8 character at 's', or 0. */
size_t px_utf8_char(const char *s, size_t n);
/* Cut the NUL-terminated 's' before a character left incomplete at its end
 * (where a snprintf ran out of room). */
void px_utf8_cut_end(char *s);

/* Append 's' ('n' bytes) as text that is valid UTF-8 and holds no control
 * character: what a terminal or a JSON parser can take whatever the bytes.
 * Characters are kept; newline and return become \n and \r, other C0 and
 * C1 controls and DEL \xNN (in JSON \u00NN, tab \t); a byte that is not
 * part of a well-formed character becomes the text \xNN. PX_ESC_JSON also
 * escapes '"' and '\' (the inside of a JSON string); PX_ESC_BACKSLASH
 * writes '\' as \\, so the text reads back without doubt. */
#define PX_ESC_JSON      1
#define PX_ESC_BACKSLASH 2
#define PX_ESC_BYTES     4 /* only the bytes that are not UTF-8 (for a JSON writer that
                              escapes the rest) */
void px_buf_escape(px_buf *b, const char *s, size_t n, int flags);

/* A 64-bit hash of 'n' bytes: the first 8 bytes of their SHA-256 (OpenSSL),
 * big-endian. Stable across builds, machines and versions, so fingerprints
 * kept in Redis by one instance are compared by another. */
uint64_t px_hash64(const void *p, size_t n);
/* 'h' as 16 lowercase hex digits and a NUL. */
void px_hash64_hex(uint64_t h, char out[17]);

/* Invariants, checked where they are relied on. PX_ENSURE is always on, for
 * those whose violation would break the guarantee (as Redis' serverAssert):
 * a failure logs the expression, the file and the line, and aborts; each is a
 * compare and a branch predicted taken. PX_ASSERT is compiled only into debug
 * and sanitizer builds (-DPX_DEBUG), as twemproxy's ASSERT, for the rest.
 * px_assert_fail is in log.c (the line goes where the logs go). */
#define PX_ENSURE(cond) \
    (__builtin_expect(!!(cond), 1) ? (void)0 : px_assert_fail(#cond, __FILE__, __LINE__))
#ifdef PX_DEBUG
#define PX_ASSERT(cond) PX_ENSURE(cond)
#else
#define PX_ASSERT(cond) ((void)0)
#endif
void px_assert_fail(const char *cond, const char *file, int line) __attribute__((noreturn));

/* Wall clock in milliseconds since the epoch. */
uint64_t px_now_ms(void);
/* A clock that never steps, in milliseconds: for the ages that decide
 * whether a lease is still held (claim.c), which a step of the wall clock
 * must not change. CLOCK_BOOTTIME, which also counts the time the machine
 * was suspended (Redis' leases ran on meanwhile); CLOCK_MONOTONIC where
 * there is none. Never 0. */
uint64_t px_mono_ms(void);

#endif
