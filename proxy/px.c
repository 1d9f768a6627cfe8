/*
 * px.c - allocation helpers, px_buf and UTF-8 validation shared by all modules.
 */
#include "px.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <openssl/evp.h>

static void px_oom(size_t size)
{
    fprintf(stderr, "idemproxy: out of memory allocating %zu bytes\n", size);
    abort();
}

void *px_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p == NULL) px_oom(size);
    return p;
}

void *px_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) px_oom(n * size);
    return p;
}

void *px_realloc(void *ptr, size_t size)
{
    void *p = realloc(ptr, size ? size : 1);
    if (p == NULL) px_oom(size);
    return p;
}

char *px_strndup(const char *s, size_t n)
{
    char *p = px_malloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *px_strdup(const char *s)
{
    return s ? px_strndup(s, strlen(s)) : NULL;
}

void px_free_secret(char *s)
{
    if (s == NULL) return;
    explicit_bzero(s, strlen(s));
    free(s);
}

void px_buf_reserve(px_buf *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->data = px_realloc(b->data, cap);
    b->cap = cap;
}

void px_buf_append(px_buf *b, const void *p, size_t n)
{
    px_buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void px_buf_appends(px_buf *b, const char *s)
{
    px_buf_append(b, s, strlen(s));
}

void px_buf_printf(px_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof(small)) { /* the common case: one pass */
        px_buf_append(b, small, (size_t)n);
        return;
    }
    px_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void px_buf_reset(px_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void px_buf_deinit(px_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

size_t px_utf8_char(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    if (n == 0) return 0;
    unsigned c = s[0], cp;
    size_t k;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) {
        if (c < 0xC2) return 0;
        k = 1;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        k = 2;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0 && c <= 0xF4) {
        k = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (k >= n) return 0; /* truncated sequence */
    for (size_t j = 1; j <= k; j++) {
        if ((s[j] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[j] & 0x3F);
    }
    if (k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return k + 1;
}

bool px_utf8_valid(const char *str, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if ((k = px_utf8_char(str + i, n - i)) == 0) return false;
    return true;
}

void px_utf8_cut_end(char *s)
{
    size_t n = strlen(s), i = n;
    while (i > 0 && n - i < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
    if (i > 0 && (unsigned char)s[i - 1] >= 0xC0 && px_utf8_char(s + i - 1, n - i + 1) == 0)
        s[i - 1] = '\0';
}

void px_buf_escape(px_buf *b, const char *s, size_t n, int flags)
{
    bool json = flags & PX_ESC_JSON;
    px_buf_reserve(b, n);
    for (size_t i = 0, k; i < n; i += k) {
        unsigned char c = (unsigned char)s[i];
        k = px_utf8_char(s + i, n - i);
        if (k == 0) { /* not a character: the byte, as text */
            px_buf_printf(b, json ? "\\\\x%02x" : "\\x%02x", c);
            k = 1;
        } else if (flags & PX_ESC_BYTES) {
            px_buf_append(b, s + i, k);
        } else if (c == '\n' || c == '\r' || (c == '\t' && json)) {
            px_buf_appends(b, c == '\n' ? "\\n" : c == '\r' ? "\\r"
                                                            : "\\t");
        } else if (c < 0x20 || c == 0x7f || (c == 0xC2 && (unsigned char)s[i + 1] < 0xA0)) {
            /* C0 controls, DEL and the C1 controls U+0080-U+009F (a terminal
             * may take U+009B for an escape sequence) */
            unsigned cp = c == 0xC2 ? (unsigned char)s[i + 1] : c;
            if (json) px_buf_printf(b, "\\u%04x", cp);
            else if (c == 0xC2) px_buf_printf(b, "\\xc2\\x%02x", cp);
            else px_buf_printf(b, "\\x%02x", cp);
        } else if (c == '"' && json) {
            px_buf_appends(b, "\\\"");
        } else if (c == '\\' && (json || (flags & PX_ESC_BACKSLASH))) {
            px_buf_appends(b, "\\\\");
        } else {
            px_buf_append(b, s + i, k);
        }
    }
}

uint64_t px_now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

uint64_t px_mono_ms(void)
{
    struct timespec ts;
#ifdef CLOCK_BOOTTIME
    clock_gettime(CLOCK_BOOTTIME, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 + 1;
}

uint64_t px_hash64(const void *p, size_t n)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen < 8) abort();
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h = h << 8 | md[i];
    return h;
}

void px_hash64_hex(uint64_t h, char out[17])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, h >>= 4) out[i] = hex[h & 15];
    out[16] = '\0';
}
