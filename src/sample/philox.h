/*
 * philox.h -- Philox4x32-10, the counter-based random number generator of Salmon et al.
 * ("Parallel random numbers: as easy as 1, 2, 3", SC'11), and the uniform draws the sampler
 * takes from it.
 *
 * Design stance: a counter-based generator has no state. The random number for a token is a
 * pure function of (request seed, sample index, token position, lane), so it never depends on
 * the batch a request sits in, the step, the thread, or how many numbers were drawn before.
 * That is what makes a seeded request reproduce alone or inside any batch.
 *
 * Keying: key = the 64-bit seed (low word, high word); counter = (position low word, position
 * high word, sample index, lane). Lane separates independent uses at one position (lane 0:
 * the token draw; other lanes are free for e.g. speculative rejection sampling).
 */
#ifndef DI_PHILOX_H
#define DI_PHILOX_H

#include <stdint.h>

/* One Philox4x32-10 block: encrypts counter ctr[4] under key[2] into out[4]. */
void di_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A uniform double in [0, 1) with 53 random bits, keyed only by its arguments. */
double di_philox_uniform(int64_t seed, int32_t sample_index, int64_t position, uint32_t lane);

#endif /* DI_PHILOX_H */
