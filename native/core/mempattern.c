/* The bytes of source "mem": a function of the stream offset, so a sink can be verified without the sender.
 * Little-endian 64-bit words: the word at offset 8*k is (k mod (PERIOD/8) + 1) * 0x9E3779B97F4A7C15. No word
 * repeats within the 1 MiB period, and a sender keeps one period (+ one buffer), filled once.
 */
#include "zc_internal.h"

#include <string.h>

#define ZC_MEM_PERIOD (1ULL << 20)
#define ZC_MEM_MULT 0x9E3779B97F4A7C15ULL

uint64_t zc_mem_pattern_period(void) { return ZC_MEM_PERIOD; }

static inline uint64_t word_at(uint64_t k) { return ((k % (ZC_MEM_PERIOD / 8)) + 1) * ZC_MEM_MULT; }

static inline uint64_t le64(uint64_t w)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap64(w);
#else
    return w;
#endif
}

void zc_mem_pattern(uint64_t off, unsigned char *out, size_t len)
{
    /* a partial first word, then whole words (fast: a word at a time), then a partial last word */
    while (len && (off % 8 || len < 8)) {
        uint64_t w = word_at(off / 8);
        size_t n = 8 - off % 8 < len ? 8 - off % 8 : len;
        for (size_t i = 0; i < n; i++)
            out[i] = (unsigned char)(w >> (8 * ((off % 8) + i)));
        out += n;
        off += n;
        len -= n;
    }
    uint64_t k = off / 8;
    for (; len >= 8; len -= 8, k++, out += 8) {
        uint64_t w = le64(word_at(k));
        memcpy(out, &w, 8);
    }
    if (len) {
        uint64_t w = word_at(k);
        for (size_t i = 0; i < len; i++)
            out[i] = (unsigned char)(w >> (8 * i));
    }
}
