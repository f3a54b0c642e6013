/*
 * cpu_backend.c -- binds the backend op interface (backend.h) to the CPU kernels.
 *
 * The backend owns only the attention's per-thread score rows ([n_threads][max_ctx]
 * floats); the thread pool is borrowed. Everything else is a thin forwarding call, so the
 * forward pass pays one indirect call per op and nothing more.
 *
 * Batch invariance is on by default; di_backend_cpu_set_batch_invariant(be, false) lets the
 * matmul pick n-dependent kernels (di_cpu_matmul_fast). The other ops have no faster
 * non-invariant variant yet, so they are the same in both modes.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_nn.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_v4_ops.h"
#include "sample/sample_full_row.h"
#include "sample/sampler.h"

#include <math.h>
#include <string.h>

typedef struct cpu_backend {
    di_pool *pool;  /* borrowed */
    float *scratch; /* [n_threads][max_ctx], owned */
    int64_t max_ctx;
    bool fast; /* batch invariance off: di_cpu_matmul_fast (default false) */
} cpu_backend;

static di_pool *pool_for(const cpu_backend *be, int64_t macs) {
    return macs < DI_CPU_MIN_PARALLEL_MACS ? NULL : be->pool;
}

static void cpu_matmul(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    di_pool *pool = pool_for(ctx, n * w->rows * w->cols);
    if (((const cpu_backend *)ctx)->fast)
        di_cpu_matmul_fast(pool, w, x, n, y);
    else
        di_cpu_matmul(pool, w, x, n, y);
}

static void cpu_matmul_t(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    di_cpu_matmul_t(pool_for(ctx, n * w->rows * w->cols), w, x, n, y);
}

static void cpu_head_matmul(void *ctx, const di_head_matmul_params *p) {
    di_cpu_head_matmul(((cpu_backend *)ctx)->pool, p);
}

static void cpu_embed(void *ctx, const di_weight *table, const int32_t *ids, int64_t n,
                      float *out) {
    di_cpu_embed(((cpu_backend *)ctx)->pool, table, ids, n, out);
}

static void cpu_rmsnorm(void *ctx, const float *x, int64_t x_stride, const float *w, int64_t n,
                        int64_t dim, float eps, float *y, int64_t y_stride) {
    di_cpu_rmsnorm(((cpu_backend *)ctx)->pool, x, x_stride, w, n, dim, eps, y, y_stride);
}

static void cpu_rope(void *ctx, const di_rope_op_params *p) {
    di_cpu_rope(((cpu_backend *)ctx)->pool, p);
}

static void cpu_mla_attention(void *ctx, const di_mla_attn_params *p) {
    cpu_backend *be = ctx;
    if (!p->q_pos) {
        di_cpu_mla_attention(be->pool, p, be->scratch, be->max_ctx);
        return;
    }
    /* Queries of different sequences: each one alone, as its own call would run it. */
    for (int64_t t = 0; t < p->n_tokens; t++) {
        di_mla_attn_params q = *p;
        q.n_tokens = 1;
        q.pos0 = p->q_pos[t];
        q.block_table = p->q_tables + p->q_table_off[t];
        q.q_lat = di_mla_attn_q(p, 0, t);
        q.out = di_mla_attn_out(p, 0, t);
        q.q_lat_hstride = p->q_lat_hstride ? p->q_lat_hstride : p->n_tokens * p->kv_lora_rank;
        q.out_hstride = p->out_hstride ? p->out_hstride : p->n_tokens * p->kv_lora_rank;
        q.q_rope = p->q_rope + t * p->q_rope_tstride;
        q.q_pos = NULL;
        q.q_tables = q.q_table_off = NULL;
        di_cpu_mla_attention(be->pool, &q, be->scratch, be->max_ctx);
    }
}

static void cpu_silu_mul(void *ctx, const float *gate, const float *up, int64_t n, float *out) {
    di_cpu_silu_mul(((cpu_backend *)ctx)->pool, gate, up, n, out);
}

static void cpu_axpy(void *ctx, float a, const float *x, int64_t n, float *y) {
    di_cpu_axpy(((cpu_backend *)ctx)->pool, a, x, n, y);
}

static void cpu_copy2d(void *ctx, float *dst, int64_t dst_stride, const float *src,
                       int64_t src_stride, int64_t rows, int64_t cols) {
    (void)ctx;
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * dst_stride, src + r * src_stride, (size_t)cols * sizeof(float));
}

/* Memory: backend memory is aligned host memory, so the copies are memcpy and there is
 * nothing to wait for. */
static void *cpu_buf_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = di_aligned_alloc(bytes ? bytes : 1);
    if (!p) {
        di_error(DI_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

static void cpu_buf_free(void *ctx, void *p) {
    (void)ctx;
    di_aligned_free(p);
}

static di_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes) memcpy(dst, src, bytes);
    return DI_OK;
}

static void cpu_fill_zero(void *ctx, void *p, size_t bytes) {
    (void)ctx;
    if (bytes) memset(p, 0, bytes);
}

static di_status cpu_sync(void *ctx) {
    (void)ctx;
    return DI_OK;
}

static void cpu_copy_rows(void *ctx, float *dst, int64_t dst_stride, const int32_t *dst_rows,
                          const float *src, int64_t src_stride, const int32_t *src_rows, int64_t n,
                          int64_t cols) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        int64_t d = dst_rows ? dst_rows[i] : i, s = src_rows ? src_rows[i] : i;
        memcpy(dst + d * dst_stride, src + s * src_stride, (size_t)cols * sizeof(float));
    }
}

/* Zero, then one axpy per slot in slot order: the same bits as the model's former loop. */
static void cpu_moe_combine(void *ctx, const float *rows, const int32_t *rows_of, const float *w,
                            int64_t n, int64_t K, int64_t dim, float *out) {
    di_pool *pool = ((cpu_backend *)ctx)->pool;
    memset(out, 0, (size_t)(n * dim) * sizeof(float));
    for (int64_t t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            di_cpu_axpy(pool, w[t * K + k], rows + (int64_t)rows_of[t * K + k] * dim, dim,
                        out + t * dim);
}

/* MoE routing: di_router_select per token (the model's former host loop, the same bits),
 * then a stable counting sort of the entries by expert. rows_of holds the selected ids
 * until the sort overwrites it with grouped rows; the router scratch then serves as the
 * per-expert cursors. */
static void cpu_moe_route(void *ctx, const di_moe_route_params *p) {
    (void)ctx;
    const int64_t E = p->router.n_experts, K = p->router.top_k, nk = p->n * K;
    for (int64_t t = 0; t < p->n; t++) {
        int32_t *ids = p->rows_of + t * K;
        if (!p->hash_table) {
            di_router_select(&p->router, p->logits + t * E, ids, p->w + t * K, p->scratch);
            continue;
        }
        memcpy(ids, p->hash_table + (int64_t)p->tokens[t] * K, (size_t)K * sizeof *ids);
        di_router_hash(&p->router, p->logits + t * E, ids, p->w + t * K, p->scratch);
    }
    int32_t *cur = (int32_t *)p->scratch;
    memset(cur, 0, (size_t)E * sizeof *cur);
    for (int64_t i = 0; i < nk; i++)
        cur[p->rows_of[i]]++;
    int32_t *act = p->active + 1;
    int32_t na = 0, off = 0;
    for (int64_t e = 0; e < E; e++) {
        p->offsets[e] = off;
        if (cur[e] > 0) act[na++] = (int32_t)e;
        off += cur[e];
        cur[e] = p->offsets[e];
    }
    p->offsets[E] = off;
    p->active[0] = na;
    for (int64_t i = 0; i < nk; i++) {
        int32_t g = cur[p->rows_of[i]]++;
        p->src[g] = (int32_t)(i / K);
        p->rows_of[i] = g;
    }
}

/* Each active expert's rows through matmul, as the model's former per-expert loop did. */
static void cpu_matmul_experts(void *ctx, const di_expert_weights *ew, const int32_t *offsets,
                               const int32_t *active, int64_t max_active, int64_t n_rows,
                               const float *x, float *y) {
    (void)max_active, (void)n_rows;
    cpu_backend *be = ctx;
    di_cpu_matmul_experts(be->pool, ew, offsets, active, x, y, be->fast);
}

static di_status cpu_expert_table(void *ctx, const di_weight *w, int64_t n, void **out) {
    (void)ctx, (void)w, (void)n;
    *out = NULL; /* host weights are addressed through the di_weight array itself */
    return DI_OK;
}

/* DeepSeek-V4 ops (cpu_v4_ops.c). */
static void cpu_matmul_fp4(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    if (w->dtype != DI_DTYPE_F4_E2M1) {
        cpu_matmul(ctx, w, x, n, y);
        return;
    }
    di_cpu_matmul_fp4(pool_for(ctx, n * w->rows * w->cols), w, x, n, y);
}

static void cpu_v4_hc_pre(void *ctx, const di_v4_hc_params *p) {
    di_cpu_v4_hc_pre(((cpu_backend *)ctx)->pool, p);
}

static void cpu_v4_hc_post(void *ctx, int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                           const float *y, const float *post, const float *mix, float *out) {
    di_cpu_v4_hc_post(((cpu_backend *)ctx)->pool, n_tokens, n_hc, dim, x, y, post, mix, out);
}

static void cpu_v4_attention(void *ctx, const di_v4_attn_params *p) {
    di_cpu_v4_attention(((cpu_backend *)ctx)->pool, p);
}

static void cpu_v4_pool(void *ctx, const di_v4_pool_params *p) {
    di_cpu_v4_pool(((cpu_backend *)ctx)->pool, p);
}

static void cpu_v4_index_scores(void *ctx, const di_v4_index_params *p) {
    di_cpu_v4_index_scores(((cpu_backend *)ctx)->pool, p);
}

static void cpu_v4_swiglu(void *ctx, const float *gate, const float *up, int64_t n, float limit,
                          float *out) {
    di_cpu_v4_swiglu(((cpu_backend *)ctx)->pool, gate, up, n, limit, out);
}

/* The device-side token ops (backend.h: argmax_rows, sample_rows) on the host, for runners
 * that treat this backend's memory as separate (tests): the sampler's scan, and the sampler
 * itself with each row's parameters. */
static void cpu_argmax_rows(void *ctx, const float *x, int64_t n, int64_t V, int32_t *out) {
    (void)ctx;
    for (int64_t t = 0; t < n; t++) {
        bool bad;
        int64_t first;
        const float max = di_sample_kernels_active()->scan(x + t * V, V, &bad, &first);
        out[t] = bad || max == -INFINITY ? -1 : (int32_t)first;
    }
}

static void cpu_sample_rows(void *ctx, const float *x, int64_t n, int64_t V,
                            const di_sample_row *rows, int32_t *out) {
    (void)ctx;
    void *scratch = di_malloc(di_sampler_scratch_size(V));
    for (int64_t t = 0; t < n; t++) {
        const di_sample_row *r = &rows[t];
        const di_sampling_params p = di_sample_row_params(r);
        const di_sample_input in = {.logits = x + t * V,
                                    .vocab = V,
                                    .eos_token_id = -1,
                                    .seed = r->seed,
                                    .sample_index = r->sample_index,
                                    .position = r->position};
        di_sample_result res;
        out[t] = scratch && di_sampler_sample(&p, &in, scratch, &res) == DI_OK ? res.token : -1;
    }
    di_free(scratch);
}

static void cpu_free(void *ctx) {
    cpu_backend *be = ctx;
    if (!be) return;
    di_aligned_free(be->scratch);
    di_free(be);
}

static const di_backend_ops g_cpu_ops = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .matmul_t = cpu_matmul_t,
    .head_matmul = cpu_head_matmul,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .mla_attention = cpu_mla_attention,
    .silu_mul = cpu_silu_mul,
    .axpy = cpu_axpy,
    .copy2d = cpu_copy2d,
    .free = cpu_free,
    .matmul_fp4 = cpu_matmul_fp4,
    .v4_hc_pre = cpu_v4_hc_pre,
    .v4_hc_post = cpu_v4_hc_post,
    .v4_attention = cpu_v4_attention,
    .v4_pool = cpu_v4_pool,
    .v4_index_scores = cpu_v4_index_scores,
    .v4_swiglu = cpu_v4_swiglu,
    .host_memory = true,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .fill_zero = cpu_fill_zero,
    .sync = cpu_sync,
    .weight_upload = NULL, /* weights are used in place (the checkpoint mapping) */
    .weight_free = NULL,
    .copy_rows = cpu_copy_rows,
    .moe_combine = cpu_moe_combine,
    .moe_route = cpu_moe_route,
    .matmul_experts = cpu_matmul_experts,
    .expert_table = cpu_expert_table,
    .argmax_rows = cpu_argmax_rows,
    .sample_rows = cpu_sample_rows,
};

di_status di_backend_cpu_init(di_backend *out, di_pool *pool, int64_t max_ctx) {
    if (!out || max_ctx <= 0) return di_error(DI_ERR_INVALID_ARG, "cpu backend: bad arguments");
    cpu_backend *be = di_calloc(1, sizeof *be);
    if (!be) return di_error(DI_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    be->pool = pool;
    be->max_ctx = max_ctx;
    size_t n = (size_t)di_pool_size(pool) * (size_t)max_ctx;
    be->scratch = di_aligned_alloc(n * sizeof(float));
    if (!be->scratch) {
        di_free(be);
        return di_error(DI_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes of scratch",
                        n * sizeof(float));
    }
    out->ops = &g_cpu_ops;
    out->ctx = be;
    return DI_OK;
}

void di_backend_cpu_set_batch_invariant(di_backend *be, bool on) {
    if (be && be->ops == &g_cpu_ops && be->ctx) ((cpu_backend *)be->ctx)->fast = !on;
}
