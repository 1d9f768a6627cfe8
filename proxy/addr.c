/*
 * addr.c - see addr.h. Four splitters (main.c, metrics.c, config.c, slots.c)
 * agreed on well-formed addresses and differed on the rest; this one is the
 * rule for all of them (issue 19).
 */
#include "addr.h"

#include <string.h>

/* 's' up to 'end' is a port: 1 to 5 digits, 1..65535. */
static bool port_of(const char *s, const char *end, int *port)
{
    size_t n = (size_t)(end - s);
    if (n == 0 || n > 5) return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535) return false;
    *port = v;
    return true;
}

bool px_addr_split(const char *s, char *host, size_t hostsize, int *port, unsigned flags)
{
    if (s == NULL) return false;
    const char *h, *he, *p;
    if (s[0] == '[') {
        /* "[v6]:port": the brackets hold a non-empty host, the port follows them. */
        const char *close = strchr(s, ']');
        if (close == NULL || close == s + 1 || close[1] != ':') return false;
        /* "[[::1]:7000" is a typo, not the host "[::1" (that would not split again). */
        if (memchr(s + 1, '[', (size_t)(close - s - 1))) return false;
        h = s + 1;
        he = close;
        p = close + 2;
    } else {
        const char *colon = (flags & PX_ADDR_BARE_IPV6) ? strrchr(s, ':') : strchr(s, ':');
        if (colon == NULL) return false;
        h = s;
        he = colon;
        p = colon + 1;
        if (he == h && !(flags & PX_ADDR_HOST_OPTIONAL)) return false;
        /* A bracket outside "[...]:" is a typo, not a host. */
        if (memchr(h, '[', (size_t)(he - h)) || memchr(h, ']', (size_t)(he - h))) return false;
    }
    size_t hl = (size_t)(he - h);
    int v;
    if (hl >= hostsize || !port_of(p, p + strlen(p), &v)) return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = v;
    return true;
}
