/*
 * cpu_ops.h -- the CPU backend's kernels.
 *
 * Every kernel has a scalar reference (`*_ref`, single-threaded, plain loops, the
 * definition of the result) and a fast version that picks AVX-512, AVX2+FMA or NEON code at
 * run time and splits work over the thread pool. tests/ops compare the two on random shapes.
 *
 * Activations are float32; weights are consumed in their stored dtype (see weight.h).
 * Batch invariance: the fast matmul computes each output element with a summation order
 * that depends only on `cols` (never on n, the thread count or the row split), so a row's
 * result is the same whatever batch it is in. di_cpu_matmul_fast drops that constraint
 * (the engine's batch_invariant = false) and picks its kernel by n.
 */
#ifndef DI_CPU_OPS_H
#define DI_CPU_OPS_H

#include "backend/backend.h"
#include "backend/weight.h"
#include "core/threadpool.h"

#include <stdbool.h>
#include <stdint.h>

/* Which SIMD level the fast kernels use on this machine: "avx512", "avx2", "neon", "scalar". */
const char *di_cpu_simd_name(void);

/* Makes the fast kernels use `level` ("scalar", "avx2", "avx512", "neon"; NULL = the best
 * this CPU has) from now on, process-wide. Returns 0, or -1 (nothing changed) if the level is
 * unknown or this CPU lacks it. For tests and benchmarks; the environment variable
 * DI_SIMD=<level> does the same at first use. Not to be called while kernels run. */
int di_cpu_simd_force(const char *level);

/* y[t][r] = sum_c x[t][c] * W[r][c]   for t < n, r < rows.
 * x: [n][w->cols] float, y: [n][w->rows] float (row stride = w->rows). */
void di_cpu_matmul(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y);
void di_cpu_matmul_ref(const di_weight *w, const float *x, int64_t n, float *y);

/* The same product without the batch-invariance constraint (engine batch_invariant = false):
 * free to pick, per n, a faster kernel whose summation order depends on n. Today: for
 * n <= 8 on bf16 / f16 / f32 weights with AVX-512, a decode kernel with two partial sums per
 * output (twice the FMA chains) run over token pairs while a 4-row group stays in L1,
 * instead of the direct (n <= 4) or chunked path. Otherwise, and on the other SIMD levels, it
 * is di_cpu_matmul. Results agree with di_cpu_matmul to float rounding (normalised error
 * ~1e-6), not bitwise, and may change with n. */
void di_cpu_matmul_fast(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y);

/* Transposed product: y[t][c] = sum_r x[t][r] * W[r][c]   for t < n, c < cols.
 * x: [n][w->rows], y: [n][w->cols]. Used by MLA's absorbed attention (W_UK^T q). */
void di_cpu_matmul_t(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y);
void di_cpu_matmul_t_ref(const di_weight *w, const float *x, int64_t n, float *y);

/* Dequantizes row r of w into out[w->cols]. */
void di_cpu_weight_row_f32(const di_weight *w, int64_t r, float *out);

/* Below this many multiply-adds a product runs on the calling thread: waking the pool costs
 * microseconds, more than a small product takes. The kernels' results do not depend on the
 * split, so this changes no bits. */
#define DI_CPU_MIN_PARALLEL_MACS 65536

/* One MoE projection over the grouped rows of every active expert (backend.h's
 * matmul_experts; cpu_moe.c): bitwise a matmul per expert, in one dynamic pool loop; for
 * F4_E2M1 experts bitwise a matmul_fp4 per expert (di_cpu_matmul_fp4, expert by expert). */
void di_cpu_matmul_experts(di_pool *pool, const di_expert_weights *ew, const int32_t *offsets,
                           const int32_t *active, const float *x, float *y, bool fast);

/* Measured memory read bandwidth in bytes/s over `bytes` of memory with all pool threads
 * (for the benchmarks' roofline). */
double di_cpu_measure_read_bandwidth(di_pool *pool, size_t bytes);

#endif /* DI_CPU_OPS_H */
