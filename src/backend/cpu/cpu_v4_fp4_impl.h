/*
 * cpu_v4_fp4_impl.h -- internal contract between the FP4 (e2m1) matmul driver in
 * cpu_v4_ops.c and its SIMD kernels (cpu_v4_fp4_avx2.c, cpu_v4_fp4_avx512.c).
 *
 * Summation order (per SIMD level, L lanes): each (token, row) output owns one L-lane total.
 * Every lane only ever sums columns of one 32-column group at a time: per step (a 32-column
 * group, or on AVX-512 a 128-column chunk whose lane k holds group k / 4), the unscaled
 * products are summed into an L-lane vector a in a fixed lane/column assignment, then
 * total = fma(a, scale, total) with each lane's scale = 2^(e - 127) of its group's stored
 * E8M0 byte. The L lanes are summed at the end by a fixed halving tree. This depends only on
 * cols and the level, never on n, the token's position, the row split or the thread count:
 * results are batch- and thread-invariant (tests/ops/test_v4_ops.c checks bitwise).
 *
 * x is handed to the kernels in the level's column order (its `prep` function, an exact
 * permutation per token), so that the weights need no shuffle beyond the nibble decode:
 *   - "pairs" (AVX2, and AVX-512's last cols % 128 columns): per 32-column group,
 *     xd[32g + i] = x[32g + 2i], xd[32g + 16 + i] = x[32g + 2i + 1] (i < 16), matching the
 *     group's low nibbles (even columns) and high nibbles (odd columns);
 *   - "nibbles" (AVX-512, per 128-column chunk at c): xd[c + 16s + k] = x[c + 8k + s]
 *     (s < 8, k < 16), matching nibble s of dword k of the chunk's 64 bytes.
 */
#ifndef DI_CPU_V4_FP4_IMPL_H
#define DI_CPU_V4_FP4_IMPL_H

#include "backend/weight.h"

#include <stdint.h>

/* Widest row the kernels take (columns): bounds their stack scratch (x block, scales).
 * Wider FP4 matrices go to the scalar rows (V4-Flash experts have 4096 / 2048 columns). */
#define DI_FP4_MAX_COLS 16384
#define DI_FP4_NR       4 /* rows per kernel call */

/* Rows [r, r + nr) of w (nr <= DI_FP4_NR; w->cols a multiple of 32, <= DI_FP4_MAX_COLS) for
 * nt tokens of de-interleaved x (token i at xd + i * w->cols) into y[i * ldy + j]. */
typedef void (*di_fp4_rows_fn)(const di_weight *w, int64_t r, int nr, const float *xd, int64_t nt,
                               float *y, int64_t ldy);

/* Writes token row x (w->cols floats) in the level's order into xd. */
typedef void (*di_fp4_prep_fn)(const float *x, int64_t cols, float *xd);

/* The "pairs" order of 32-column groups [g0, g1) (shared by the levels). */
static inline void di_fp4_prep_pairs(const float *x, int64_t g0, int64_t g1, float *xd) {
    for (int64_t c = 32 * g0; c < 32 * g1; c += 32)
        for (int64_t i = 0; i < 16; i++) {
            xd[c + i] = x[c + 2 * i];
            xd[c + 16 + i] = x[c + 2 * i + 1];
        }
}

#if defined(__x86_64__) || defined(_M_X64)
void di_cpu_fp4_prep_avx2(const float *x, int64_t cols, float *xd);
void di_cpu_fp4_prep_avx512(const float *x, int64_t cols, float *xd);
void di_cpu_fp4_rows_avx2(const di_weight *w, int64_t r, int nr, const float *xd, int64_t nt,
                          float *y, int64_t ldy);
void di_cpu_fp4_rows_avx512(const di_weight *w, int64_t r, int nr, const float *xd, int64_t nt,
                            float *y, int64_t ldy);
#endif

#endif /* DI_CPU_V4_FP4_IMPL_H */
