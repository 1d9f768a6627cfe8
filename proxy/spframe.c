/*
 * spframe.c - the SP wire's header and frames read from bytes, no I/O
 * (spframe.h). Nothing here looks past the n bytes it is given: a frame split
 * over reads is MORE until its last byte, then the same frame it would have
 * been in one read.
 */
#include "spframe.h"

#include <string.h>

px_spf_status px_spf_header(const unsigned char *b, size_t n, px_spf *f)
{
    *f = (px_spf){ 0 };
    if (n < 8) return PX_SPF_MORE;
    if (memcmp(b, "\0SP\0", 4) != 0 || b[4] != 0x00 || b[5] != 0x31) {
        f->why = "its header is not an SP REP socket's";
        return PX_SPF_BAD;
    }
    f->used = 8;
    return PX_SPF_WHOLE;
}

px_spf_status px_spf_frame(const unsigned char *b, size_t n, bool ipc, px_spf *f)
{
    *f = (px_spf){ 0 };
    size_t hl = ipc ? 9 : 8;
    if (n < hl) return PX_SPF_MORE;
    if (ipc && b[0] != 0x01) { /* nanomsg 1.1.5 aborted the process on this one */
        f->why = "an ipc frame whose type byte is not 01";
        return PX_SPF_BAD;
    }
    uint64_t size = 0;
    for (size_t i = hl - 8; i < hl; i++) size = size << 8 | b[i];
    if (size > PX_SP_RCVMAX) { /* the request id counts: it is in the frame */
        f->why = "a frame over 1 MiB";
        return PX_SPF_BAD;
    }
    if (n - hl < size) {
        f->need = hl + (size_t)size;
        return PX_SPF_MORE;
    }
    f->off = hl;
    f->len = (size_t)size;
    f->used = hl + (size_t)size;
    return PX_SPF_WHOLE;
}
