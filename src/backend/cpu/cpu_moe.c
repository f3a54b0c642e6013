/*
 * cpu_moe.c -- the matmul_experts op on the CPU: one MoE projection (gate, up or down) over
 * the grouped rows of every active expert of a layer (backend.h).
 *
 * Why: at moderate batch sizes (8-32 tokens) a step touches most experts with 1-2 tokens
 * each. Run one by one, every expert's product is a thread-pool dispatch with a barrier at its
 * end (a few us each, and a whole product's wait whenever the two threads finish unevenly,
 * e.g. when another process holds a core). Here all active experts' rows of one projection are
 * a single dynamic loop over (expert, 64-output-row block) units: one barrier per projection
 * instead of one per expert, and the faster thread simply takes more units.
 *
 * Invariant: each unit computes whole output rows with di_cpu_matmul_rows (the matmul's own
 * row kernels), so every value is bitwise the one a matmul per expert computes, whatever the
 * thread count or the order units are taken in (tests/ops/test_moe_ops.c).
 *
 * FP4 (e2m1) experts (DeepSeek-V4's routed experts) take another road: each active expert's
 * rows go through di_cpu_matmul_fp4, the very call matmul_fp4 makes for them, one expert
 * after the other. Its values depend only on the shape and the SIMD level, never on the
 * rows around them or the pool, so they are bitwise matmul_fp4's per expert.
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_v4_ops.h"
#include "core/core.h"

/* Output rows per unit: 64 rows of a bf16 2048-column weight are 256 KiB, long enough for
 * the row streams and short enough that 2 threads share even a single expert. */
#define MOE_UNIT_ROWS 64

typedef struct {
    const di_expert_weights *ew;
    const int32_t *offsets, *active;
    const float *x;
    float *y;
    int64_t units_per_expert;
    bool fast;
} experts_job;

static void expert_units(void *ctx, int64_t u0, int64_t u1, int tid) {
    (void)tid;
    const experts_job *job = ctx;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t j = u / job->units_per_expert;
        const int64_t r0 = u % job->units_per_expert * MOE_UNIT_ROWS;
        const int32_t e = job->active[1 + j];
        const di_weight *w = &job->ew->w[e];
        const int64_t g0 = job->offsets[e], ne = job->offsets[e + 1] - g0;
        if (ne <= 0) continue;
        di_mm_rows_args a = {.w = w,
                             .x = job->x + g0 * w->cols,
                             .ldx = w->cols,
                             .n = ne,
                             .y = job->y + g0 * w->rows,
                             .ldy = w->rows,
                             .fast = job->fast};
        di_cpu_matmul_rows(&a, r0, DI_MIN(r0 + MOE_UNIT_ROWS, w->rows));
    }
}

static void experts_fp4(di_pool *pool, const di_expert_weights *ew, const int32_t *offsets,
                        const int32_t *active, const float *x, float *y) {
    for (int64_t j = 0; j < active[0]; j++) {
        const int32_t e = active[1 + j];
        const di_weight *w = &ew->w[e];
        const int64_t g0 = offsets[e], ne = offsets[e + 1] - g0;
        if (ne <= 0) continue;
        const int64_t macs = ne * w->rows * w->cols;
        /* small products on this thread, as matmul_fp4 runs them (cpu_ops.h) */
        di_cpu_matmul_fp4(macs < DI_CPU_MIN_PARALLEL_MACS ? NULL : pool, w, x + g0 * w->cols, ne,
                          y + g0 * w->rows);
    }
}

void di_cpu_matmul_experts(di_pool *pool, const di_expert_weights *ew, const int32_t *offsets,
                           const int32_t *active, const float *x, float *y, bool fast) {
    const int64_t n_active = active[0];
    if (n_active <= 0 || ew->n_experts <= 0) return;
    if (ew->w[0].dtype == DI_DTYPE_F4_E2M1) { /* every expert has expert 0's dtype */
        experts_fp4(pool, ew, offsets, active, x, y);
        return;
    }
    const int64_t rows = ew->w[0].rows; /* every expert has the same shape */
    experts_job job = {.ew = ew,
                       .offsets = offsets,
                       .active = active,
                       .x = x,
                       .y = y,
                       .units_per_expert = (rows + MOE_UNIT_ROWS - 1) / MOE_UNIT_ROWS,
                       .fast = fast};
    di_pool_run_dynamic(pool, n_active * job.units_per_expert, 1, expert_units, &job);
}
