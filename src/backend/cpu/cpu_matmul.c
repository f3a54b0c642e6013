/*
 * cpu_matmul.c -- the fast CPU matmuls: SIMD level dispatch, the tiling driver shared by all
 * levels, the scalar level, the transposed product and the read-bandwidth probe.
 *
 * Design stance: the driver (threads, panels, chunks, token blocks) is written once; a SIMD
 * level only supplies converters, micro-kernels and optionally a direct decode kernel
 * (cpu_matmul_impl.h). Threads claim the output rows in whole panels (ranges of 16 or 64
 * rows, dynamically: see mm_run).
 * Decode (n <= 16) runs the direct kernel over groups of 4 rows, tokens in groups of up to 4
 * while the rows are in L1: every weight byte comes from memory once, straight into
 * registers, while the next group is prefetched. Larger n runs
 *     row panel (16 rows) -> token block (48) -> column chunk (256) -> micro-tiles,
 * so a converted chunk (16 KiB of float32) is reused by up to 48 tokens from L1 and a panel's
 * weights come from memory once (later token blocks find them in L2). The transposed product
 * keeps m tokens x 64 columns in registers over a converted panel when the level has a
 * t_tile kernel. Token rows may be strided (di_cpu_matmul_strided), for per-head products.
 *
 * Invariant: see cpu_matmul_impl.h -- y[t][r]'s bits depend only on cols and the SIMD level.
 * Except in di_cpu_matmul_fast (batch invariance off): for n <= 8 it runs the last 1-2
 * tokens of a row group by the level's direct_fast kernel (two partial sums per output,
 * another summation order), so bits depend on n.
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Dispatch                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static _Atomic(const di_mm_kernels *) g_active;

/* The best level this CPU (and OS) supports. */
static const di_mm_kernels *detect_best(void) {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return &di_mm_kernels_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &di_mm_kernels_avx2; /* every AVX2+FMA CPU also has F16C */
#elif defined(__aarch64__)
    return &di_mm_kernels_neon; /* Advanced SIMD is mandatory on arm64 */
#endif
    return &di_mm_kernels_scalar;
}

/* Level rank, so that a request can only lower the level, never raise it past the CPU. */
static int rank_of(const char *name) {
    if (strcmp(name, "scalar") == 0) return 0;
    if (strcmp(name, "avx2") == 0 || strcmp(name, "neon") == 0) return 1;
    if (strcmp(name, "avx512") == 0) return 2;
    return -1;
}

static const di_mm_kernels *by_name(const char *name) {
    if (strcmp(name, "scalar") == 0) return &di_mm_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(name, "avx2") == 0) return &di_mm_kernels_avx2;
    if (strcmp(name, "avx512") == 0) return &di_mm_kernels_avx512;
#elif defined(__aarch64__)
    if (strcmp(name, "neon") == 0) return &di_mm_kernels_neon;
#endif
    return NULL;
}

/* Returns the kernels for `name` if this machine can run them, else NULL. */
static const di_mm_kernels *usable(const char *name) {
    const di_mm_kernels *best = detect_best(), *k = by_name(name);
    if (!k || rank_of(name) > rank_of(best->name)) return NULL;
    return k;
}

const di_mm_kernels *di_mm_active(void) {
    const di_mm_kernels *k = atomic_load_explicit(&g_active, memory_order_acquire);
    if (k) return k;
    k = detect_best();
    const char *env = getenv("DI_SIMD");
    if (env && *env) {
        const di_mm_kernels *req = usable(env);
        if (req)
            k = req;
        else
            di_log(DI_LOG_WARN, "DI_SIMD=%s is unknown or not supported here; using %s", env,
                   k->name);
    }
    atomic_store_explicit(&g_active, k, memory_order_release);
    return k;
}

const char *di_cpu_simd_name(void) {
    return di_mm_active()->name;
}

int di_cpu_simd_force(const char *level) {
    const di_mm_kernels *k = level ? usable(level) : detect_best();
    if (!k) return -1;
    atomic_store_explicit(&g_active, k, memory_order_release);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Scalar level: 8 lanes of plain float multiply-then-add (C11 does not contract them).      */
/* ---------------------------------------------------------------------------------------- */

#define SC_L 8

static void sc_convert(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    di_mm_convert_scalar(w, r, c0, len, out);
    for (int64_t i = len; i % SC_L; i++)
        out[i] = 0.0f;
}

static void sc_convert_raw(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    const uint8_t *d = (const uint8_t *)w->data + r * w->row_stride + c0;
    int64_t i = 0;
    for (; i < len; i++)
        out[i] = di_e4m3_to_f32(d[i]) * 0x1p-8f; /* exact */
    for (; i % SC_L; i++)
        out[i] = 0.0f;
}

static void sc_micro(int m, const di_mm_tile *t) {
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < DI_MM_NR; j++) {
            float a[SC_L];
            float *dst = t->acc + i * t->acc_stride + j * SC_L;
            for (int l = 0; l < SC_L; l++)
                a[l] = t->init ? 0.0f : dst[l];
            const float *wr = t->wb + j * t->ldw, *xr = t->x + i * t->ldx;
            for (int64_t k = 0; k < t->kc; k += SC_L) {
                for (int l = 0; l < SC_L; l++) {
                    float xv = k + l < t->kc ? xr[k + l] : 0.0f; /* the masked tail */
                    a[l] = a[l] + wr[k + l] * xv;
                }
            }
            if (t->finish) {
                float *tot = t->tot + i * t->acc_stride + j * SC_L;
                for (int l = 0; l < SC_L; l++)
                    tot[l] = (t->tot_init ? 0.0f : tot[l]) + a[l] * t->scale[j];
            } else {
                for (int l = 0; l < SC_L; l++)
                    dst[l] = a[l];
            }
        }
    }
}

static void sc_micro_1(const di_mm_tile *t) {
    sc_micro(1, t);
}
static void sc_micro_2(const di_mm_tile *t) {
    sc_micro(2, t);
}

static uint64_t sc_read_sum(const void *p, size_t bytes) {
    const uint64_t *q = p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) {
        s0 ^= q[i];
        s1 ^= q[i + 1];
        s2 ^= q[i + 2];
        s3 ^= q[i + 3];
    }
    return s0 ^ s1 ^ s2 ^ s3;
}

const di_mm_kernels di_mm_kernels_scalar = {
    .name = "scalar",
    .lanes = SC_L,
    .mt = 2,
    .convert = sc_convert,
    .convert_raw = sc_convert_raw,
    .micro = {NULL, sc_micro_1, sc_micro_2},
    .read_sum = sc_read_sum,
};

/* ---------------------------------------------------------------------------------------- */
/* di_cpu_matmul: the tiling driver                                                           */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const di_mm_kernels *k;
    const di_weight *w;
    const float *x; /* [n][cols], rows ldx apart */
    int64_t n;
    float *y;  /* [n][rows], rows ldy apart */
    bool fast; /* di_cpu_matmul_fast: not batch-invariant */
    int64_t ldx, ldy;
    const int32_t *yrow; /* NULL, or token t's output row: y + yrow[t] * ldy (a scatter) */
} mm_job;

/* Token t's output row. */
static inline float *mm_y(const mm_job *job, int64_t t) {
    return job->y + (job->yrow ? job->yrow[t] : t) * job->ldy;
}

/* Sums L lanes by halving: lane i += lane i + L/2, ... A fixed tree, the same for all n. */
static float hsum(const float *v, int L) {
    float t[DI_MM_MAXL];
    memcpy(t, v, (size_t)L * sizeof(float));
    for (int h = L / 2; h >= 1; h /= 2)
        for (int i = 0; i < h; i++)
            t[i] = t[i] + t[i + h];
    return t[0];
}

/* Asks for the weights of the chunk after (panel p0, columns c0): the next DI_MM_KC columns of
 * the panel's np rows, or past the last chunk the first chunk of the next panel. The chunked
 * path converts a chunk and then computes on it; without this, each conversion waits for
 * DRAM on 16 short row streams (latency, not bandwidth), which costs as much as the
 * compute for 9-32 tokens. The prefetches run under the micro-kernels instead. Changes no
 * arithmetic. */
static void prefetch_next_chunk(const di_weight *w, int64_t p0, int64_t np, int64_t c0) {
    const size_t esz = di_dtype_bytes(w->dtype, 1);
    if (esz == 0) return; /* sub-byte dtypes do not take this path */
    int64_t c = c0 + DI_MM_KC;
    if (c >= w->cols) {
        c = 0;
        p0 += np;
        np = DI_MIN((int64_t)DI_MM_PANEL, w->rows - p0);
    }
    const int64_t len = DI_MIN((int64_t)DI_MM_KC, w->cols - c);
    for (int64_t j = 0; j < np; j++) {
        const char *row = (const char *)w->data + (size_t)((p0 + j) * w->row_stride + c) * esz;
        for (int64_t b = 0; b < len * (int64_t)esz; b += 64)
            __builtin_prefetch(row + b, 0, 2); /* into L2 */
    }
}

/* Rows [p0, p0 + np) (np <= DI_MM_PANEL) for tokens [t0, t0 + tb) (tb <= DI_MM_TB) by the
 * chunked path: convert a chunk of the panel once, run every token over it. In fp8 block
 * order a chunk is cut at scale-block boundaries, each piece ending its block folds in. */
static void panel_chunked(const mm_job *job, int64_t t0, int64_t tb, int64_t p0, int64_t np) {
    const di_mm_kernels *k = job->k;
    const di_weight *w = job->w;
    const int64_t cols = w->cols, L = k->lanes;
    const int64_t acc_stride = DI_MM_PANEL * L; /* floats between one token's accumulators */
    const int64_t np_up = (np + DI_MM_NR - 1) / DI_MM_NR * DI_MM_NR;
    const int blocked = di_mm_block_order(w);
    const int64_t bc = blocked ? w->block_cols : cols;
    const float *xb = job->x + t0 * job->ldx;
    /* Thread-private scratch on the stack (112 KiB): the hot loop never allocates. */
    _Alignas(64) float wbuf[DI_MM_PANEL * DI_MM_KC];
    _Alignas(64) float acc[DI_MM_TB * DI_MM_PANEL * DI_MM_MAXL];
    _Alignas(64) float tot[DI_MM_TB * DI_MM_PANEL * DI_MM_MAXL]; /* block order only */
    float sc[DI_MM_PANEL];
    const float *srow[DI_MM_PANEL];
    for (int64_t j = 0; blocked && j < np_up; j++)
        srow[j] = di_mm_scale_row(w, p0 + DI_MIN(j, np - 1));

    if (cols == 0) {
        memset(acc, 0, sizeof acc);
        memset(tot, 0, sizeof tot);
    }
    for (int64_t c0 = 0; c0 < cols; c0 += DI_MM_KC) {
        const int64_t kc = DI_MIN(DI_MM_KC, cols - c0);
        const di_mm_convert_fn cvt = blocked ? k->convert_raw : k->convert;
        for (int64_t j = 0; j < np; j++)
            cvt(w, p0 + j, c0, kc, wbuf + j * DI_MM_KC);
        /* Rows past the panel's end in the last micro-tile: zeros, results unused. */
        for (int64_t j = np; j < np_up; j++)
            memset(wbuf + j * DI_MM_KC, 0, sizeof(float) * DI_MM_KC);
        /* The first token block reads the panel from memory; later ones find it in L2. */
        if (t0 == 0) prefetch_next_chunk(w, p0, np, c0);
        for (int64_t s0 = c0, s1; s0 < c0 + kc; s0 = s1) {
            s1 = DI_MIN((s0 / bc + 1) * bc, c0 + kc);
            di_mm_tile t = {
                .ldw = DI_MM_KC, .ldx = job->ldx, .acc_stride = acc_stride, .kc = s1 - s0};
            t.init = blocked ? s0 % bc == 0 : c0 == 0;
            t.finish = blocked && (s1 % bc == 0 || s1 == cols);
            t.tot_init = s0 < bc;
            for (int64_t j = 0; t.finish && j < np_up; j++)
                sc[j] = srow[j][s0 / bc] * 256.0f;
            for (int64_t ti = 0; ti < tb; ti += k->mt) {
                const int m = (int)DI_MIN((int64_t)k->mt, tb - ti);
                for (int64_t g = 0; g < np; g += DI_MM_NR) {
                    t.acc = acc + ti * acc_stride + g * L;
                    t.tot = tot + ti * acc_stride + g * L;
                    t.scale = sc + g;
                    t.wb = wbuf + g * DI_MM_KC + (s0 - c0);
                    t.x = xb + ti * job->ldx + s0;
                    k->micro[m](&t);
                }
            }
        }
    }
    const float *res = blocked ? tot : acc;
    if (k->hsum_n) {
        for (int64_t ti = 0; ti < tb; ti++)
            k->hsum_n(res + ti * acc_stride, np, mm_y(job, t0 + ti) + p0);
        return;
    }
    for (int64_t ti = 0; ti < tb; ti++)
        for (int64_t j = 0; j < np; j++)
            mm_y(job, t0 + ti)[p0 + j] = hsum(res + ti * acc_stride + j * L, (int)L);
}

/* The most tokens one call of a direct (decode) kernel takes, and the most tokens the
 * invariant path runs through it in groups; larger batches reuse converted chunks. Up to 16
 * the direct kernel wins: re-converting a 4-row group from L1 for each group of 4 tokens
 * costs less than the chunked path's convert-and-store, and its prefetch of the next rows
 * keeps the weights streaming (batch-16 decode steps on V2-Lite shapes ~7% faster than with 8;
 * 32 was slower). */
#define DIRECT_MAX_N         4
#define GROUPED_DIRECT_MAX_N 16

/* Rows [r0, r1) of every token, batch-invariant. */
static void mm_rows_invariant(const mm_job *job, int64_t r0, int64_t r1) {
    const di_mm_kernels *k = job->k;
    const int64_t L = k->lanes;
    if (job->n <= GROUPED_DIRECT_MAX_N && k->direct && job->w->cols > 0) {
        /* Decode: each weight byte is read once, straight into registers. Up to
         * GROUPED_DIRECT_MAX_N tokens run in groups of DIRECT_MAX_N over each group of rows
         * while its weights are in L1; the direct kernel sums every token in the chunked
         * path's order, so the grouping changes no bit. */
        _Alignas(64) float acc[DIRECT_MAX_N * DI_MM_NR * DI_MM_MAXL];
        const int64_t as = DI_MM_NR * L, ldx = job->ldx;
        for (int64_t g = r0; g < r1; g += DI_MM_NR) {
            const int nr = (int)DI_MIN((int64_t)DI_MM_NR, r1 - g);
            for (int64_t t0 = 0; t0 < job->n; t0 += DIRECT_MAX_N) {
                const int m = (int)DI_MIN((int64_t)DIRECT_MAX_N, job->n - t0);
                if (!k->direct(job->w, g, nr, job->x + t0 * ldx, ldx, m, acc, as)) {
                    /* Not for this weight or n (or a NaN byte): same bits by the chunked
                     * path, which rewrites every token of the remaining rows. */
                    for (int64_t p0 = g; p0 < r1; p0 += DI_MM_PANEL)
                        panel_chunked(job, 0, job->n, p0, DI_MIN(DI_MM_PANEL, r1 - p0));
                    return;
                }
                for (int i = 0; i < m; i++) {
                    if (k->hsum_n) {
                        k->hsum_n(acc + i * as, nr, mm_y(job, t0 + i) + g);
                        continue;
                    }
                    for (int j = 0; j < nr; j++)
                        mm_y(job, t0 + i)[g + j] = hsum(acc + i * as + j * L, (int)L);
                }
            }
        }
        return;
    }
    /* Panels outer, token blocks inner: a panel's weights (64 KiB of bf16) come from memory
     * once and stay in L2 for the later token blocks. The order of the blocks changes no
     * arithmetic. */
    for (int64_t p0 = r0; p0 < r1; p0 += DI_MM_PANEL)
        for (int64_t t0 = 0; t0 < job->n; t0 += DI_MM_TB)
            panel_chunked(job, t0, DI_MIN(DI_MM_TB, job->n - t0), p0, DI_MIN(DI_MM_PANEL, r1 - p0));
}

/* Up to this many tokens the fast (non-invariant) mode stays on the decode kernels: for each
 * group of DI_MM_NR rows it runs the tokens in groups (the last <= direct_fast_mt of them by
 * direct_fast, the others 4 at a time by direct), so the group's weights (<= 4 rows) stay in
 * L1 between token groups and no converted chunk is stored. */
#define FAST_DIRECT_MAX_N 8

/* Rows [r0, r1) by the decode kernels; returns 0 when a kernel declines (then the caller
 * recomputes the whole range, overwriting whatever was written). */
static int mm_rows_fast(const mm_job *job, int64_t r0, int64_t r1) {
    const di_mm_kernels *k = job->k;
    const int64_t ldx = job->ldx, L = k->lanes, as = DI_MM_NR * L;
    _Alignas(64) float acc[DI_MM_MAXMT * DI_MM_NR * DI_MM_MAXL];
    for (int64_t g = r0; g < r1; g += DI_MM_NR) {
        const int nr = (int)DI_MIN((int64_t)DI_MM_NR, r1 - g);
        for (int64_t t0 = 0, m; t0 < job->n; t0 += m) {
            m = job->n - t0;
            const float *x = job->x + t0 * ldx;
            int ok;
            if (m <= k->direct_fast_mt) {
                ok = k->direct_fast(job->w, g, nr, x, ldx, (int)m, acc, as);
            } else {
                m = DI_MIN(m, (int64_t)DIRECT_MAX_N);
                ok = k->direct && k->direct(job->w, g, nr, x, ldx, (int)m, acc, as);
            }
            if (!ok) return 0;
            for (int i = 0; i < m; i++) {
                if (k->hsum_n) {
                    k->hsum_n(acc + i * as, nr, mm_y(job, t0 + i) + g);
                    continue;
                }
                for (int j = 0; j < nr; j++)
                    mm_y(job, t0 + i)[g + j] = hsum(acc + i * as + j * L, (int)L);
            }
        }
    }
    return 1;
}

static void mm_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const mm_job *job = ctx;
    if (job->fast && job->k->direct_fast && job->n <= FAST_DIRECT_MAX_N && job->w->cols > 0 &&
        mm_rows_fast(job, r0, r1))
        return;
    mm_rows_invariant(job, r0, r1);
}

void di_cpu_matmul_rows(const di_mm_rows_args *a, int64_t r0, int64_t r1) {
    if (a->n <= 0 || r0 >= r1) return;
    mm_job job = {di_mm_active(), a->w, a->x, a->n, a->y, a->fast, a->ldx, a->ldy, a->yrow};
    mm_rows(&job, r0, r1, 0);
}

/* Runs mm_rows over all rows. Threads claim row ranges dynamically (a range's values do not
 * depend on who computes it): on a core shared with other work, or with uneven ranges, the
 * faster thread takes more instead of waiting at the end of every product. A range is 4
 * panels (64 rows: 256 KiB of a bf16 2048-column weight, so the row streams stay long), or
 * one panel for small weights so both threads get work. */
static void mm_run(di_pool *pool, const mm_job *job) {
    const int64_t grain = job->w->rows >= 32 * DI_MM_PANEL ? 4 * DI_MM_PANEL : DI_MM_PANEL;
    di_pool_run_dynamic(pool, job->w->rows, grain, mm_rows, (void *)job);
}

void di_cpu_matmul(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y) {
    di_cpu_matmul_strided(pool, w, x, w->cols, n, y, w->rows);
}

void di_cpu_matmul_strided(di_pool *pool, const di_weight *w, const float *x, int64_t ldx,
                           int64_t n, float *y, int64_t ldy) {
    if (n <= 0 || w->rows <= 0) return;
    mm_job job = {di_mm_active(), w, x, n, y, false, ldx, ldy, NULL};
    /* Whole panels per range; the split never changes a value, only who computes it. */
    mm_run(pool, &job);
}

void di_cpu_matmul_fast(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y) {
    if (n <= 0 || w->rows <= 0) return;
    mm_job job = {di_mm_active(), w, x, n, y, true, w->cols, w->rows, NULL};
    mm_run(pool, &job);
}

/* ---------------------------------------------------------------------------------------- */
/* di_cpu_matmul_t: y[t][c] = sum_r x[t][r] W[r][c], rows accumulated in order               */
/* ---------------------------------------------------------------------------------------- */

/* Each thread owns a range of columns; for every chunk of them it walks all rows in order,
 * y[t][c] = y[t][c] + x[t][r] * w[r][c] (plain mul-then-add, so every level agrees). */
/* With a level's t_tile: a panel of up to DI_MMT_RB rows x DI_MMT_NC columns is converted
 * once, then up to DI_MM_MAXMT tokens at a time keep their outputs in registers over its
 * rows. Same arithmetic as below (rows in order, multiply then add, from +0), so same bits. */
static void mmt_cols_tiled(const mm_job *job, int64_t c_begin, int64_t c_end) {
    const di_weight *w = job->w;
    const int64_t rows = w->rows;
    _Alignas(64) float wbuf[DI_MMT_RB * DI_MMT_NC];
    for (int64_t c0 = c_begin; c0 < c_end; c0 += DI_MMT_NC) {
        const int64_t nc = DI_MIN(DI_MMT_NC, c_end - c0);
        for (int64_t r0 = 0; r0 < rows; r0 += DI_MMT_RB) {
            const int64_t rb = DI_MIN(DI_MMT_RB, rows - r0);
            for (int64_t r = 0; r < rb; r++) {
                job->k->convert(w, r0 + r, c0, nc, wbuf + r * DI_MMT_NC);
                for (int64_t c = (nc + job->k->lanes - 1) / job->k->lanes * job->k->lanes;
                     c < DI_MMT_NC; c++)
                    wbuf[r * DI_MMT_NC + c] = 0.0f;
            }
            for (int64_t t0 = 0; t0 < job->n; t0 += DI_MM_MAXMT) {
                const int m = (int)DI_MIN((int64_t)DI_MM_MAXMT, job->n - t0);
                job->k->t_tile(wbuf, DI_MMT_NC, rb, job->x + t0 * job->ldx + r0, job->ldx, m,
                               job->y + t0 * job->ldy + c0, job->ldy, nc, r0 == 0);
            }
        }
    }
}

static void mmt_cols(void *ctx, int64_t c_begin, int64_t c_end, int tid) {
    const mm_job *job = ctx;
    const di_weight *w = job->w;
    (void)tid;
    if (job->k->t_tile && w->rows > 0) {
        mmt_cols_tiled(job, c_begin, c_end);
        return;
    }
    _Alignas(64) float wbuf[DI_MM_KC + DI_MM_MAXL];
    for (int64_t c0 = c_begin; c0 < c_end; c0 += DI_MM_KC) {
        const int64_t kc = DI_MIN(DI_MM_KC, c_end - c0);
        for (int64_t t = 0; t < job->n; t++)
            memset(job->y + t * job->ldy + c0, 0, sizeof(float) * (size_t)kc);
        for (int64_t r = 0; r < w->rows; r++) {
            job->k->convert(w, r, c0, kc, wbuf);
            for (int64_t t = 0; t < job->n; t++) {
                const float xv = job->x[t * job->ldx + r];
                float *yr = job->y + t * job->ldy + c0;
                for (int64_t c = 0; c < kc; c++)
                    yr[c] = yr[c] + xv * wbuf[c];
            }
        }
    }
}

void di_cpu_matmul_t(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y) {
    di_cpu_matmul_t_strided(pool, w, x, w->rows, n, y, w->cols);
}

void di_cpu_matmul_t_strided(di_pool *pool, const di_weight *w, const float *x, int64_t ldx,
                             int64_t n, float *y, int64_t ldy) {
    if (n <= 0 || w->cols <= 0) return;
    mm_job job = {di_mm_active(), w, x, n, y, false, ldx, ldy, NULL};
    di_pool_run(pool, w->cols, 64, mmt_cols, &job);
}

/* ---------------------------------------------------------------------------------------- */
/* Read bandwidth                                                                             */
/* ---------------------------------------------------------------------------------------- */

#define BW_PAGE 4096

typedef struct {
    const di_mm_kernels *k;
    const unsigned char *buf;
    uint64_t sink[256]; /* one slot per thread id, so the reads are used */
} bw_job;

static void bw_pages(void *ctx, int64_t b, int64_t e, int tid) {
    bw_job *job = ctx;
    job->sink[tid & 255] ^= job->k->read_sum(job->buf + b * BW_PAGE, (size_t)(e - b) * BW_PAGE);
}

double di_cpu_measure_read_bandwidth(di_pool *pool, size_t bytes) {
    size_t pages = bytes / BW_PAGE;
    if (pages == 0) pages = 1;
    unsigned char *buf = di_aligned_alloc(pages * BW_PAGE);
    if (!buf) return 0.0;
    memset(buf, 1, pages * BW_PAGE); /* touch every page so faults are not timed */
    bw_job job = {.k = di_mm_active(), .buf = buf};
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t = di_time_now();
        di_pool_run(pool, (int64_t)pages, 1, bw_pages, &job);
        t = di_time_now() - t;
        if (t < best) best = t;
    }
    di_aligned_free(buf);
    return (double)(pages * BW_PAGE) / best;
}
