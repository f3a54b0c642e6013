/*
 * test_fp4_util.h -- a random FP4 (e2m1) weight for the V4 op tests (include after
 * test_rand.h): nibbles from rnd_u32, one E8M0 exponent per block_cols columns.
 */
#ifndef DI_TEST_FP4_UTIL_H
#define DI_TEST_FP4_UTIL_H

#include "backend/weight.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint8_t *q, *sc; /* nibbles ([rows][stride / 2]) and E8M0 bytes ([rows][scale_cols]) */
    di_weight w;
} fp4_weight;

/* Random [rows][cols] FP4 weight, row stride cols + extra (rounded up to even), E8M0
 * exponents in [lo_e, hi_e] (scales 2^(e - 127)) per block_cols columns. */
static inline fp4_weight make_fp4(int64_t rows, int64_t cols, int64_t extra, int64_t block_cols,
                                  int lo_e, int hi_e) {
    fp4_weight t;
    const int64_t stride = (cols + extra + 1) / 2 * 2,
                  sc_cols = (cols + block_cols - 1) / block_cols;
    t.q = malloc((size_t)(rows * stride / 2));
    for (int64_t i = 0; i < rows * stride / 2; i++)
        t.q[i] = (uint8_t)rnd_u32();
    t.sc = malloc((size_t)(rows * sc_cols));
    for (int64_t i = 0; i < rows * sc_cols; i++)
        t.sc[i] = (uint8_t)rnd_int(lo_e, hi_e);
    t.w = (di_weight){.dtype = DI_DTYPE_F4_E2M1,
                      .rows = rows,
                      .cols = cols,
                      .row_stride = stride,
                      .data = t.q,
                      .scale_e8m0 = t.sc,
                      .scale_cols = sc_cols,
                      .block_rows = 1,
                      .block_cols = block_cols};
    return t;
}

static inline void free_fp4(fp4_weight *t) {
    free(t->q), free(t->sc);
}

#endif /* DI_TEST_FP4_UTIL_H */
