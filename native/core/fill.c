/* --fill rand_crc32: each message made as a sender that generates and checksums its data does (nettest's
 * xmit: rand() times a seed per word, then a crc32), seeded by its place in the transfer (repeatable, each
 * message different). The crc32 (zlib's polynomial) is folded into a volatile sink so nothing is optimised away.
 */
#include "zc_internal.h"

#include <pthread.h>
#include <string.h>

static uint32_t crc_table[256];
static volatile uint32_t fill_sink;

static void crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc32(uint32_t crc, const unsigned char *p, size_t len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    crc = ~crc;
    while (len--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

void zc_fill_rand_crc32(const zc_ctx *c, unsigned char *dst, uint64_t off, size_t len)
{
    /* the C standard's sample rand() (an LCG, 15 bits a step) per word, times a seed that changes per message */
    uint64_t where = c->base + off;
    uint32_t state = (uint32_t)(where ^ (where >> 32)) | 1u;
    uint32_t seed = (uint32_t)(where >> 16) * 2654435761u + 1u;
    size_t words = len / sizeof(uint32_t);
    for (size_t i = 0; i < words; i++) {
        state = state * 1103515245u + 12345u;
        uint32_t v = ((state >> 16) & 0x7fff) * seed;
        memcpy(dst + i * sizeof v, &v, sizeof v);
    }
    for (size_t i = words * sizeof(uint32_t); i < len; i++)
        dst[i] = (unsigned char)(i * seed);
    __atomic_fetch_xor(&fill_sink, crc32(0, dst, len), __ATOMIC_RELAXED);
}
