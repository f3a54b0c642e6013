/*
 * cpu_moe.c -- a MoE layer's routed experts in one op (di_moe_experts_params in backend.h).
 *
 * Why: at moderate batch sizes (8-32 tokens) a step touches most experts with 1-2 tokens
 * each. Run one by one, every expert costs three products, each a thread-pool dispatch with
 * a barrier at its end (a few us each, and a whole product's wait whenever the two threads
 * finish unevenly, e.g. when another process holds a core). Here all experts' gate and up
 * products are one dynamic loop over (expert, 64-row block) units, fused with the SiLU, and
 * all down products a second one: two barriers per layer instead of ~3 per expert, and the
 * faster thread simply takes more units.
 *
 * Invariant: each unit computes whole output rows with di_cpu_matmul_rows (the matmul's own
 * row kernels) and silu_mul's arithmetic, so every value is bitwise the one the expert-by-
 * expert path computes, whatever the thread count or the order units are taken in.
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <string.h>

/* Output rows per unit: 64 rows of a bf16 2048-column weight are 256 KiB, long enough for
 * the row streams and short enough that 2 threads share even a single expert. */
#define MOE_UNIT_ROWS 64

typedef struct {
    const di_moe_experts_params *p;
    bool fast;
    int64_t nb_up, nb_down; /* units per expert in each phase */
} moe_job;

static const di_weight *expert_weight(const di_weight *w0, size_t stride, int64_t e) {
    return (const di_weight *)((const char *)w0 + (size_t)e * stride);
}

/* Positions [*begin, *end) of expert e's entries. */
static void expert_span(const di_moe_experts_params *p, int64_t e, int64_t *begin, int64_t *end) {
    *begin = e ? p->expert_end[e - 1] : 0;
    *end = p->expert_end[e];
}

/* Phase 1 unit: rows [r0, r1) of h = silu(gate x) * (up x) for one expert's tokens. */
static void up_units(void *ctx, int64_t u0, int64_t u1, int tid) {
    (void)tid;
    const moe_job *job = ctx;
    const di_moe_experts_params *p = job->p;
    const int64_t H = p->hidden, I = p->inter;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t e = u / job->nb_up, r0 = u % job->nb_up * MOE_UNIT_ROWS;
        const int64_t r1 = DI_MIN(r0 + MOE_UNIT_ROWS, I);
        int64_t begin, end;
        expert_span(p, e, &begin, &end);
        if (end == begin) continue;
        di_mm_rows_args a = {.w = expert_weight(p->gate, p->weight_stride, e),
                             .x = p->out + begin * H, /* the gathered inputs */
                             .ldx = H,
                             .n = end - begin,
                             .y = p->h + begin * I,
                             .ldy = I,
                             .fast = job->fast};
        di_cpu_matmul_rows(&a, r0, r1);
        a.w = expert_weight(p->up, p->weight_stride, e);
        a.y = p->u + begin * I;
        di_cpu_matmul_rows(&a, r0, r1);
        for (int64_t q = begin; q < end; q++) {
            float *hq = p->h + q * I + r0;
            di_cpu_silu_mul(NULL, hq, p->u + q * I + r0, r1 - r0, hq);
        }
    }
}

/* Phase 2 unit: rows [r0, r1) of out[ent[q]] = down h_q for one expert's positions q. */
static void down_units(void *ctx, int64_t u0, int64_t u1, int tid) {
    (void)tid;
    const moe_job *job = ctx;
    const di_moe_experts_params *p = job->p;
    const int64_t H = p->hidden, I = p->inter;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t e = u / job->nb_down, r0 = u % job->nb_down * MOE_UNIT_ROWS;
        int64_t begin, end;
        expert_span(p, e, &begin, &end);
        if (end == begin) continue;
        di_mm_rows_args a = {.w = expert_weight(p->down, p->weight_stride, e),
                             .x = p->h + begin * I,
                             .ldx = I,
                             .n = end - begin,
                             .y = p->out,
                             .ldy = H,
                             .yrow = p->ent + begin,
                             .fast = job->fast};
        di_cpu_matmul_rows(&a, r0, DI_MIN(r0 + MOE_UNIT_ROWS, H));
    }
}

void di_cpu_moe_experts(di_pool *pool, const di_moe_experts_params *p, bool fast) {
    const int64_t n_ent = p->n_tokens * p->top_k, H = p->hidden;
    if (n_ent <= 0 || p->n_experts <= 0) return;
    /* Gather each entry's input row at its grouped position (out is free until phase 2). */
    for (int64_t q = 0; q < n_ent; q++)
        memcpy(p->out + q * H, p->x + (p->ent[q] / p->top_k) * H, (size_t)H * sizeof(float));
    moe_job job = {.p = p,
                   .fast = fast,
                   .nb_up = (p->inter + MOE_UNIT_ROWS - 1) / MOE_UNIT_ROWS,
                   .nb_down = (H + MOE_UNIT_ROWS - 1) / MOE_UNIT_ROWS};
    /* Phase 2 reads every h row of an expert, so all of phase 1 ends first (the barrier at
     * the end of di_pool_run_dynamic). */
    di_pool_run_dynamic(pool, p->n_experts * job.nb_up, 1, up_units, &job);
    di_pool_run_dynamic(pool, p->n_experts * job.nb_down, 1, down_units, &job);
}
