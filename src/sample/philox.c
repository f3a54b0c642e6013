/*
 * philox.c -- Philox4x32-10 (see philox.h). Written from the algorithm's description: ten
 * rounds of two 32x32->64 multiplications whose high halves are mixed with the other two
 * words and the round key; the key is bumped by the Weyl constants between rounds.
 *
 * Invariant: the output is bit-identical on every platform (only fixed-width unsigned
 * arithmetic, which wraps by definition).
 */
#include "sample/philox.h"

#define PHILOX_M0 0xD2511F53u /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* key schedule: golden ratio and sqrt(3) - 1, as 32-bit fractions   \
                               */
#define PHILOX_W1     0xBB67AE85u
#define PHILOX_ROUNDS 10

static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0];
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = (uint32_t)p1;
    c[2] = n2;
    c[3] = (uint32_t)p0;
}

void di_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(c, k);
    }
    for (int i = 0; i < 4; i++)
        out[i] = c[i];
}

double di_philox_uniform(int64_t seed, int32_t sample_index, int64_t position, uint32_t lane) {
    uint64_t s = (uint64_t)seed, pos = (uint64_t)position;
    const uint32_t key[2] = {(uint32_t)s, (uint32_t)(s >> 32)};
    const uint32_t ctr[4] = {(uint32_t)pos, (uint32_t)(pos >> 32), (uint32_t)sample_index, lane};
    uint32_t out[4];
    di_philox4x32_10(ctr, key, out);
    /* 27 + 26 = 53 bits, the full precision of a double: the result is k / 2^53, k < 2^53. */
    uint64_t bits = ((uint64_t)(out[0] >> 5) << 26) | (out[1] >> 6);
    return (double)bits * (1.0 / 9007199254740992.0);
}
