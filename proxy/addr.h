/*
 * addr.h - "host:port" split into its host and its port (addr.c). Pure: no
 * lookup, no allocation. One splitter for every address the daemon reads:
 * metrics.listen (the server and `idemproxy health`), the app endpoint's
 * tcp:// address and the redis.cluster startup nodes (config.c), and the addresses
 * Redis Cluster sends back in MOVED/ASK and CLUSTER SLOTS (slots.c, cluster.c).
 */
#ifndef PX_ADDR_H
#define PX_ADDR_H

#include <stdbool.h>
#include <stddef.h>

/* Room for any host: a DNS name is at most 253 characters. */
#define PX_ADDR_HOST_MAX 256

/* ":port" is accepted: an empty host (every interface, for a listen address). */
#define PX_ADDR_HOST_OPTIONAL 0x1u
/* An IPv6 host may come without brackets ("fe80::1:7000", as Redis Cluster
 * writes it): the port follows the last ':'. Without this flag a host that
 * holds a ':' must be in brackets. */
#define PX_ADDR_BARE_IPV6 0x2u

/*
 * Split 's' into 'host' (NUL-terminated, at most 'hostsize' bytes with the
 * NUL; brackets removed) and '*port'. 's' is "host:port" or "[ipv6]:port"
 * (and what 'flags' allow besides); the port is 1 to 5 decimal digits, 1 to
 * 65535, nothing else (no sign, no blank). The host is not otherwise checked:
 * which characters a host may hold is the caller's to say. Returns true, or
 * false (and 'host' and '*port' untouched) when 's' is not such an address,
 * or its host does not fit. 's' may be NULL (false).
 */
bool px_addr_split(const char *s, char *host, size_t hostsize, int *port, unsigned flags);

#endif
