/*
 * philox.c -- Philox4x32-10 (see philox.h). Written from the algorithm's description; the
 * code is sample_full_row.h's, shared with the device-side sampler.
 *
 * Invariant: the output is bit-identical on every platform (only fixed-width unsigned
 * arithmetic, which wraps by definition).
 */
#include "sample/philox.h"
#include "sample/sample_full_row.h"

void di_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    ds_philox4x32_10(ctr, key, out);
}

double di_philox_uniform(int64_t seed, int32_t sample_index, int64_t position, uint32_t lane) {
    return ds_philox_uniform(seed, sample_index, position, lane);
}
