/*
 * fuzz_sphdr.c - libFuzzer target for the request id of a worker's reply
 * (px_codec_reply_id, codec.c): the control data nn_recvmsg fills in holds
 * the SP header a peer on the app socket chose.
 *
 * The input is the control buffer, copied into a heap block of exactly its
 * size (ASan stops any read past it). The oracles:
 *  1. the answer is the same with bytes after the buffer (0x00 and 0xff):
 *     nothing past the control length decides it;
 *  2. the answer is the same from an unaligned copy;
 *  3. an id found is 4 bytes of the buffer preceded by a size_t length of at
 *     least 4 whose bytes all lie in the buffer.
 */
#include "codec.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static bool parse_in(const uint8_t *data, size_t size, size_t pad, uint8_t fill, size_t shift,
                     uint32_t *id)
{
    uint8_t *b = malloc(size + pad + shift + 1);
    memset(b, fill, size + pad + shift + 1);
    if (size) memcpy(b + shift, data, size);
    bool ok = px_codec_reply_id(b + shift, size, id);
    free(b);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t id = 0, id2 = 0;
    bool ok = parse_in(data, size, 0, 0, 0, &id);
    for (int fill = 0; fill < 2; fill++) {
        bool ok2 = parse_in(data, size, 64, fill ? 0xff : 0x00, 0, &id2);
        FUZZ_CHECK(ok2 == ok && (!ok || id2 == id), "bytes after the buffer changed the answer");
    }
    bool ok3 = parse_in(data, size, 0, 0, 1, &id2);
    FUZZ_CHECK(ok3 == ok && (!ok || id2 == id), "an unaligned buffer changed the answer");
    if (ok) {
        bool found = false;
        for (size_t p = sizeof(size_t); !found && p + 4 <= size; p++) {
            uint32_t v = (uint32_t)data[p] << 24 | (uint32_t)data[p + 1] << 16 |
                         (uint32_t)data[p + 2] << 8 | data[p + 3];
            size_t len;
            memcpy(&len, data + p - sizeof(len), sizeof(len));
            found = v == id && len >= 4 && len <= size - p;
        }
        FUZZ_CHECK(found, "id %08x is not a header in the buffer", id);
    }
    return 0;
}
