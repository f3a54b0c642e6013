/*
 * cpu_matmul_impl.h -- internal contract between the matmul driver (cpu_matmul.c) and the
 * per-SIMD-level kernel files (cpu_matmul_avx512.c, _avx2.c, _neon.c, scalar in cpu_matmul.c).
 *
 * Design stance: one summation order per (weight, SIMD level), two ways to evaluate it.
 * Each (token, row) output owns one L-lane accumulator that walks the columns in order,
 * c = 0, L, 2L, ... with fused multiply-adds (the last group under a mask), and the L lanes
 * are summed at the end by a fixed halving tree. fp8 weights follow one of two orders (see
 * di_mm_block_order). The two evaluations:
 *   - chunked (prefill, any n): a panel of DI_MM_PANEL rows x DI_MM_KC columns is converted to
 *     float32 in a thread-private buffer, then register-tiled micro-kernels of m tokens x
 *     DI_MM_NR rows run over it; accumulators are parked in memory between chunks (a store
 *     does not round).
 *   - direct (decode, n <= 4): a level's optional kernel converts the weights of DI_MM_NR
 *     rows straight into registers, reading each byte once.
 *
 * Invariant (batch invariance): the arithmetic for y[t][r] is a fixed function of the weight
 * (cols, dtype, fp8 block shape) and the SIMD level: converted weights are exact functions of
 * the stored bytes, the FMA chain is in column order whatever m or the evaluation, and the
 * chunking never cuts an L-group. So n, t's position, the thread count and the row split
 * never change a result bit (tests/ops/test_matmul.c checks this bitwise).
 */
#ifndef DI_CPU_MATMUL_IMPL_H
#define DI_CPU_MATMUL_IMPL_H

#include "backend/weight.h"
#include "core/threadpool.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DI_MM_NR    4   /* weight rows per micro-kernel call */
#define DI_MM_PANEL 16  /* weight rows converted together (a multiple of DI_MM_NR) */
/* Columns per chunk: a multiple of every lane count and of 128. 256 rather than 128: half the
 * accumulator loads and stores per FMA in the micro-kernels (prefill products 15-30% faster
 * on AVX-512); 512 was no better with 2 threads. */
#define DI_MM_KC 256
#define DI_MM_TB    48  /* tokens sharing one converted chunk (a multiple of every mt) */
#define DI_MM_MAXL  16  /* the widest lane count (AVX-512) */
#define DI_MM_MAXMT 6   /* the most tokens a micro-kernel handles */

/* One micro-kernel call: m tokens x DI_MM_NR weight rows over kc columns of a chunk. */
typedef struct di_mm_tile {
    float *acc;         /* [m][acc_stride]: row j's L lanes at acc + i*acc_stride + j*L */
    float *tot;         /* fp8 block order only: block totals, same layout (else unused) */
    const float *scale; /* fp8 block order only: DI_MM_NR multipliers, scale * 2^8 */
    const float *wb;    /* DI_MM_NR converted rows, ldw apart, zero-padded to a multiple of L */
    const float *x;     /* m token rows, ldx apart; only [0, kc) is read */
    int64_t ldw, ldx, acc_stride, kc;
    int init;   /* acc starts from zero (else it is loaded) */
    int finish; /* end of a scale block: tot = fma(acc, scale[j], tot_init ? 0 : tot) */
    int tot_init;
} di_mm_tile;

/* For each (token i, row j) and lane l: acc = fma(wb[j][k], x[i][k], acc) for k = l, l+L, ...
 * below kc in order (the scalar level multiplies then adds), the last group under a mask.
 * Then either stores acc or, with finish, folds it into tot. */
typedef void (*di_mm_micro_fn)(const di_mm_tile *t);

/* Converts w[r][c0 .. c0+len) to float32 (fp8: times its block scale) into out (64-byte
 * aligned), then zero-fills out up to the next multiple of the level's lane count. Values are
 * bitwise those of di_mm_convert_scalar on every level. */
typedef void (*di_mm_convert_fn)(const di_weight *w, int64_t r, int64_t c0, int64_t len,
                                 float *out);

/* Optional decode path: the accumulators (same bits as the chunked path's) of m <= mt tokens
 * x nr <= DI_MM_NR rows starting at row r over all columns, converting weights on the fly
 * straight into registers, so each weight byte is read once and never stored. Writes
 * acc[i * acc_stride + j * L + l]. Returns 0 without writing when it cannot do w (fp8
 * blocks not a multiple of L columns, huge scales, NaN bytes); the driver then falls back. */
typedef int (*di_mm_direct_fn)(const di_weight *w, int64_t r, int nr, const float *x, int64_t ldx,
                               int m, float *acc, int64_t acc_stride);

/* The fp8 summation order ("block order"), used when block_cols is a multiple of DI_MM_MAXL:
 * per scale block, sum e4m3 * 2^-8 times x into a block accumulator, then
 * tot = fma(block, scale * 2^8, tot). One multiply per block instead of per weight; scales
 * must stay below 2^120. Other block widths use the "scaled order": weights pre-multiplied
 * by their scale (convert), summed like any dtype. Either way, a fixed function of w. */
static inline int di_mm_block_order(const di_weight *w) {
    return w->dtype == DI_DTYPE_F8_E4M3 && w->block_cols > 0 && w->block_cols % DI_MM_MAXL == 0;
}

/* Optional transposed-product tile (di_cpu_matmul_t): for tokens i < m (<= DI_MM_MAXMT) and
 * columns c < nc (<= DI_MMT_NC), y[i][c] = init ? +0 : y[i][c], then for r = 0 .. rb - 1 in
 * order y[i][c] = y[i][c] + x[i][r] * wb[r][c], a multiply then an add (no FMA), as the
 * generic loop does. wb: rb converted rows, ldw floats apart (64-byte aligned, zero past nc
 * up to DI_MMT_NC); x rows ldx apart, y rows ldy apart; only columns < nc are written. */
#define DI_MMT_NC 64
#define DI_MMT_RB 128
typedef void (*di_mm_t_tile_fn)(const float *wb, int64_t ldw, int64_t rb, const float *x,
                                int64_t ldx, int m, float *y, int64_t ldy, int64_t nc, int init);

typedef struct di_mm_kernels {
    const char *name; /* "avx512", "avx2", "neon", "scalar" */
    int lanes;        /* L: accumulator width, fixes the reduction order */
    int mt;           /* micro[1..mt] are set */
    di_mm_convert_fn convert;
    di_mm_convert_fn convert_raw; /* F8_E4M3 only: e4m3 * 2^-8 (exact), no scale */
    di_mm_micro_fn micro[DI_MM_MAXMT + 1];
    di_mm_direct_fn direct; /* may be NULL */
    /* Optional, NOT batch-invariant (di_cpu_matmul_fast only): a decode kernel with the same
     * contract as direct for m <= direct_fast_mt tokens but free to sum in another order
     * (e.g. several partial sums per output); 0 when it cannot do w. May be NULL. */
    di_mm_direct_fn direct_fast;
    int direct_fast_mt;
    di_mm_t_tile_fn t_tile; /* may be NULL */
    /* Optional: out[i] = the halving-tree sum (hsum in cpu_matmul.c: lane l += lane l + L/2,
     * then L/4, ... 1) of the L lanes at v + i * L, for i < cnt; bitwise the same tree. */
    void (*hsum_n)(const float *v, int64_t cnt, float *out);
    /* Reads [p, p + bytes) with the level's widest loads, returns a value depending on all
     * of it (so the reads cannot be optimised away). bytes is a multiple of 256. */
    uint64_t (*read_sum)(const void *p, size_t bytes);
} di_mm_kernels;

extern const di_mm_kernels di_mm_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const di_mm_kernels di_mm_kernels_avx2;
extern const di_mm_kernels di_mm_kernels_avx512;
#endif
#if defined(__aarch64__)
extern const di_mm_kernels di_mm_kernels_neon;
#endif

/* The exact scalar conversion every level reproduces: writes len floats (no padding). */
void di_mm_convert_scalar(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out);

/* Row r's scale row (fp8 only): scale[(row_offset + r) / block_rows][0 ..]. */
static inline const float *di_mm_scale_row(const di_weight *w, int64_t r) {
    return w->scale + ((w->row_offset + r) / w->block_rows) * w->scale_cols;
}

/* The kernels the fast entry points use now (DI_SIMD and di_cpu_simd_force apply). */
const di_mm_kernels *di_mm_active(void);

/* di_cpu_matmul / di_cpu_matmul_t with token rows ldx (x) and ldy (y) floats apart; the
 * same bits as the packed versions. */
void di_cpu_matmul_strided(di_pool *pool, const di_weight *w, const float *x, int64_t ldx,
                           int64_t n, float *y, int64_t ldy);
void di_cpu_matmul_t_strided(di_pool *pool, const di_weight *w, const float *x, int64_t ldx,
                             int64_t n, float *y, int64_t ldy);

/* Rows [r0, r1) of y = x W^T for n tokens, on the calling thread: the body of one range of
 * di_cpu_matmul (or, with fast, di_cpu_matmul_fast), so the same bits. Token t's input row is
 * x + t * ldx, its output row y + (yrow ? yrow[t] : t) * ldy. For ops that schedule their
 * own work (cpu_moe.c). */
typedef struct di_mm_rows_args {
    const di_weight *w;
    const float *x;
    int64_t ldx, n;
    float *y;
    int64_t ldy;
    const int32_t *yrow; /* [n] or NULL */
    bool fast;
} di_mm_rows_args;
void di_cpu_matmul_rows(const di_mm_rows_args *a, int64_t r0, int64_t r1);

#endif /* DI_CPU_MATMUL_IMPL_H */
