/*
 * spframe.h - the bytes of the app socket's SP wire, read without I/O
 * (docs/protocol.md, "The connection header" and "Framing"): sp.c reads the
 * socket and asks these what its bytes hold, so they can be fuzzed alone
 * (tests/fuzz/fuzz_spframe.c).
 */
#ifndef PX_SPFRAME_H
#define PX_SPFRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest frame a worker may send (its request id and its Ack): over it,
 * the connection is closed, as nanomsg's default NN_RCVMAXSIZE did. */
#define PX_SP_RCVMAX (1024 * 1024)

typedef enum {
    PX_SPF_MORE,  /* not whole yet: read more */
    PX_SPF_WHOLE, /* a whole header, or a whole frame */
    PX_SPF_BAD    /* the peer broke the wire: its connection is closed */
} px_spf_status;

typedef struct {
    size_t off, len; /* WHOLE frame: its payload (request id, body) is b[off, off + len) */
    size_t used;     /* WHOLE: the bytes it takes from the front of b */
    size_t need;     /* MORE: the bytes the frame takes in all once its length is read, else 0 */
    const char *why; /* BAD: what is wrong, for the log */
} px_spf;

/* The peer's 8-byte header at the front of b[0, n): WHOLE (used 8) when it is
 * SP's and from a REP socket. The two reserved bytes are not looked at, as
 * nanomsg does not. */
px_spf_status px_spf_header(const unsigned char *b, size_t n, px_spf *f);

/* The first frame in b[0, n): on ipc a type byte 01, then (both) a 64-bit
 * big-endian length and that many bytes. A length over PX_SP_RCVMAX is BAD
 * as soon as it is read, before its bytes come. */
px_spf_status px_spf_frame(const unsigned char *b, size_t n, bool ipc, px_spf *f);

#endif
