/*
 * fuzz_spframe.c - libFuzzer target for the app socket's SP header and frames
 * (px_spf_header, px_spf_frame: proxy/spframe.c): a peer on the app socket
 * chooses every byte of them.
 *
 * The input: a flags byte (bit 0: ipc, else tcp; bit 1: the header is done
 * already, the stream starts with frames), then the bytes a peer sends. A
 * driver reads them as sp.c's pipe_frames does: the header, then frame after
 * frame from the front of what has come, until MORE or BAD. The oracles:
 *  1. each answer keeps its contract: a frame lies within the n bytes given,
 *     right after its length, and takes no more than n; MORE asks for more
 *     than n, at most a whole frame of PX_SP_RCVMAX; BAD says why;
 *  2. an ipc frame whose type byte is not 01, or a length over PX_SP_RCVMAX,
 *     is BAD as soon as its 9 (tcp: 8) bytes have come, whatever follows;
 *  3. the frames and the end (MORE, or BAD and why) are those of a plain
 *     reading of docs/protocol.md over the whole stream (reference());
 *  4. the stream fed in two parts split anywhere, and fed a byte at a time,
 *     gives the same frames and end as fed whole;
 *  5. nothing past the bytes given is read: fed whole, the stream is a heap
 *     block of exactly its size (ASan), and a split's first part is too.
 */
#include "fuzz.h"
#include "spframe.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/* One connection's reading: the frames it handed on, and where it stopped. */
typedef struct {
    bool ipc, open;
    size_t done;        /* bytes of the stream taken */
    size_t *frames;     /* each frame's payload: its offset in the stream, its length */
    size_t nframes;
    px_spf_status end;  /* MORE, or BAD: closed */
    const char *why;
} conn;

static uint64_t be64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return v;
}

/* What has come of the stream is s[0, upto): read the frames whole in it. */
static void feed(conn *c, const uint8_t *s, size_t upto)
{
    size_t hl = c->ipc ? 9 : 8;
    while (c->end != PX_SPF_BAD) {
        const uint8_t *b = s + c->done;
        size_t n = upto - c->done;
        px_spf f;
        px_spf_status st = c->open ? px_spf_frame(b, n, c->ipc, &f) : px_spf_header(b, n, &f);
        FUZZ_CHECK(st == PX_SPF_MORE || st == PX_SPF_WHOLE || st == PX_SPF_BAD, "status %d", (int)st);
        if (c->open && n >= hl) {
            FUZZ_CHECK(!(c->ipc && b[0] != 0x01) || st == PX_SPF_BAD, "an ipc type byte %02x passed", b[0]);
            uint64_t len = be64(b + hl - 8);
            FUZZ_CHECK(len <= PX_SP_RCVMAX || st == PX_SPF_BAD, "a length %llu over the limit passed",
                       (unsigned long long)len);
        }
        c->end = st;
        if (st == PX_SPF_BAD) {
            FUZZ_CHECK(f.why != NULL && f.why[0] != '\0', "bad, and no reason");
            c->why = f.why;
            return;
        }
        if (st == PX_SPF_MORE) {
            FUZZ_CHECK(f.need == 0 || (f.need > n && f.need <= hl + PX_SP_RCVMAX), "more: needs %zu, has %zu",
                       f.need, n);
            FUZZ_CHECK(c->open || f.need == 0, "the header needs %zu", f.need);
            return;
        }
        FUZZ_CHECK(f.used > 0 && f.used <= n, "took %zu of %zu bytes", f.used, n);
        if (!c->open) {
            FUZZ_CHECK(f.used == 8 && f.len == 0, "a header of %zu bytes", f.used);
            c->open = true;
        } else {
            FUZZ_CHECK(f.off == hl && f.len <= PX_SP_RCVMAX && f.used == f.off + f.len,
                       "a frame at %zu, %zu bytes, taking %zu of %zu", f.off, f.len, f.used, n);
            c->frames[2 * c->nframes] = c->done + f.off;
            c->frames[2 * c->nframes + 1] = f.len;
            c->nframes++;
        }
        c->done += f.used;
    }
}

static void conn_init(conn *c, bool ipc, bool open, size_t size)
{
    *c = (conn){ .ipc = ipc, .open = open, .end = PX_SPF_MORE };
    c->frames = malloc(2 * sizeof(size_t) * (size / 8 + 1)); /* a frame takes 8 bytes at least */
}

static void same(const conn *a, const conn *b, const char *how, size_t at)
{
    bool why = (a->why == NULL) == (b->why == NULL) && (a->why == NULL || strcmp(a->why, b->why) == 0);
    FUZZ_CHECK(a->nframes == b->nframes && a->end == b->end && a->done == b->done && a->open == b->open &&
                   memcmp(a->frames, b->frames, 2 * sizeof(size_t) * a->nframes) == 0 && why,
               "%s (at %zu): %zu frames, end %d (%s), %zu taken; whole: %zu frames, end %d (%s), %zu taken", how,
               at, b->nframes, (int)b->end, b->why ? b->why : "-", b->done, a->nframes, (int)a->end,
               a->why ? a->why : "-", a->done);
}

/* docs/protocol.md read plainly over the whole stream. */
static void reference(conn *c, const uint8_t *s, size_t n)
{
    size_t i = 0, hl = c->ipc ? 9 : 8;
    if (!c->open) {
        if (n < 8) return;
        if (memcmp(s, "\0SP\0\0\x31", 6) != 0) {
            c->end = PX_SPF_BAD;
            c->why = "its header is not an SP REP socket's";
            return;
        }
        c->open = true;
        i = 8;
    }
    while (n - i >= hl) {
        if (c->ipc && s[i] != 1) {
            c->end = PX_SPF_BAD;
            c->why = "an ipc frame whose type byte is not 01";
            break;
        }
        uint64_t len = be64(s + i + hl - 8);
        if (len > 1024 * 1024) {
            c->end = PX_SPF_BAD;
            c->why = "a frame over 1 MiB";
            break;
        }
        if (len > n - i - hl) break;
        c->frames[2 * c->nframes] = i + hl;
        c->frames[2 * c->nframes + 1] = (size_t)len;
        c->nframes++;
        i += hl + (size_t)len;
    }
    c->done = i;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool ipc = data[0] & 1, open = data[0] & 2;
    size_t n = size - 1;
    uint8_t *s = malloc(n ? n : 1);
    memcpy(s, data + 1, n);

    conn whole, ref, part;
    conn_init(&whole, ipc, open, n);
    feed(&whole, s, n);
    conn_init(&ref, ipc, open, n);
    reference(&ref, s, n);
    same(&whole, &ref, "the reference", n);
    conn_init(&part, ipc, open, n);

    /* A byte at a time. */
    for (size_t k = 0; k <= n; k++) feed(&part, s, k);
    same(&whole, &part, "a byte at a time", n);
    free(part.frames);

    /* In two parts, split at every point (a long input: at 64 of them). */
    size_t step = n <= 512 ? 1 : n / 64;
    for (size_t k = 0; k <= n; k += step) {
        conn_init(&part, ipc, open, n);
        uint8_t *first = malloc(k ? k : 1);
        memcpy(first, s, k);
        feed(&part, first, k);
        free(first);
        feed(&part, s, n); /* the rest: it goes on from where the first part ended */
        same(&whole, &part, "split", k);
        free(part.frames);
    }
    free(s);
    free(whole.frames);
    free(ref.frames);
    return 0;
}
