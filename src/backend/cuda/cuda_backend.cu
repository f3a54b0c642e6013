/*
 * cuda_backend.cu -- binds the backend op interface (backend.h) to the CUDA kernels, and the
 * C helpers of cuda_backend.h (weight upload, device memory, sync).
 *
 * The backend owns a non-blocking main stream, a second one for the ops a caller puts beside
 * the main ones (side_begin .. side_join: an attention layer's latent projection and store, a
 * MoE layer's shared experts) and the attention's
 * split-KV scratch; every op fills a params struct and enqueues one or two kernels on the
 * current stream, never synchronizes and never allocates. Ops cannot return errors
 * (backend.h), so the first failed launch is kept in the context and reported by
 * di_backend_cuda_sync().
 *
 * Data placement: activations, caches and token ids are device pointers; weights are
 * di_weight views whose data and scale live on the device (di_cuda_weight_upload). The
 * di_weight structs themselves stay in host memory (head_matmul's array too); a kernel gets
 * the fields it needs by value.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int di_cuda_pdl = 0;                   /* cuda_internal.cuh: set by di_backend_cuda_init */
static int64_t di_cuda_side_forks = 0; /* side_begin calls that forked (a test's check) */
static int64_t di_cuda_fences = 0;     /* fence calls (a test's check) */

/* Split arrival counters: one per (query, head group) block of a split launch (a split runs
 * only while those blocks cannot fill the device, far fewer than this). */
#define DI_CUDA_ATTN_COUNTERS 4096

typedef struct cuda_backend {
    int device;
    cudaStream_t stream;        /* where ops go now: main, or side between side_begin / _end */
    cudaStream_t main, side;    /* owned; side NULL with DI_CUDA_STREAMS=1 */
    cudaEvent_t forked, joined; /* side_begin's and side_join's points (no timing) */
    bool side_open;             /* forked since the last join */
    float *attn_partial;        /* owned: split-KV chunk states, attn_partial_floats floats */
    int *attn_counters;         /* owned: split arrivals, DI_CUDA_ATTN_COUNTERS ints (zeroed) */
    di_cuda_am_part *am_part;   /* owned: argmax slices, DI_CUDA_AM_PARTS */
    int *am_counters;           /* owned: their arrivals, DI_CUDA_AM_ROWS ints (zeroed) */
    bool sample_clusters;       /* the device runs sample_rows' clusters (a few rows each) */
    int64_t sample_pair_rows;   /* ... and draws calls of up to this many rows by pairs */
    int *route_arrivals; /* owned: moe_route's selection blocks' arrivals, one int (zeroed) */
    /* The last moe_route's offsets and stream, and whether a grouped product of that routing
     * has been launched after it on that stream (then later ones have routing_settled). */
    const int32_t *route_off;
    cudaStream_t route_stream;
    bool route_settled;
    float *hc_mix;  /* owned: V4 mHC mixing rows, DI_CUDA_HC_MIX_FLOATS floats */
    int attn_heads; /* heads per attention block: 0 (by shape), 2, 4 or 8 */
    int64_t attn_partial_floats;
    int n_sms;
    int64_t max_ctx; /* the longest context a call may attend over (init's max_ctx) */
    di_cuda_attn_mode attn_mode;
    di_cuda_tuning tune;     /* the products' knobs, read from DI_CUDA_* at init */
    bool invariant;          /* batch-invariant (default): one matmul path for every n */
    cudaError_t first_error; /* first failed launch since the last sync */
    bool capturing;          /* between graph_begin and graph_end, capture started */
    cudaError_t capture_saved_error, capture_error;
    /* DI_CUDA_GRAPH_TIMING=1: each graph replay timed on the device between two events (the
     * host waits for it), reported when the backend is freed -- a decode step's device time
     * apart from the host's share of the step. */
    bool time_graphs;
    cudaEvent_t replay_start, replay_end;
    double replay_ms;
    int64_t replays;
    di_cuda_async *async; /* owned: staging and fences of steps queued behind others */
    char name[256];
} cuda_backend;

static void note(cuda_backend *be, cudaError_t err) {
    if (err != cudaSuccess && be->first_error == cudaSuccess) be->first_error = err;
}

static cuda_backend *ctx_of(const di_backend *be) {
    return (cuda_backend *)be->ctx;
}

/* ---------------------------------------------------------------------------------------- */
/* Ops                                                                                        */
/* ---------------------------------------------------------------------------------------- */

static di_cuda_mm_params mm_params(const di_weight *w, const cuda_backend *be) {
    di_cuda_mm_params p;
    memset(&p, 0, sizeof p);
    p.dtype = w->dtype;
    p.rows = w->rows;
    p.cols = w->cols;
    p.row_stride = w->row_stride;
    p.data = w->data;
    p.scale = w->scale;
    p.scale_cols = w->scale_cols;
    p.block_rows = w->block_rows > 0 ? w->block_rows : 1;
    p.block_cols = w->block_cols > 0 ? w->block_cols : 1;
    p.row_offset = w->row_offset;
    p.n_heads = 1;
    p.tune = be->tune;
    /* Batch-invariant: the tensor cores for every n. Otherwise the SIMT GEMV where it is
     * faster (up to 8 tokens: bandwidth-bound, fewer rows per load) and the tensor cores
     * above. */
    p.tc_min_n = be->invariant ? 1 : 9;
    p.stream = be->stream;
    return p;
}

/* The parameters of y = W x over n contiguous rows of x and y. */
static di_cuda_mm_params product_params(const di_weight *w, const cuda_backend *be, const float *x,
                                        int64_t n, float *y) {
    di_cuda_mm_params p = mm_params(w, be);
    p.n_tokens = n;
    p.x = x;
    p.x_tstride = w->cols;
    p.y = y;
    p.y_tstride = w->rows;
    return p;
}

static void cuda_matmul(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    di_cuda_mm_params p = product_params(w, be, x, n, y);
    note(be, di_cuda_launch_matmul(&p));
}

/* Can two weights share one GLU launch (the kernel reads the gate's shape fields for both)? */
static bool glu_pair_ok(const di_weight *a, const di_weight *b) {
    return a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols &&
           a->row_stride == b->row_stride && a->scale_cols == b->scale_cols &&
           a->block_rows == b->block_rows && a->block_cols == b->block_cols &&
           a->row_offset == b->row_offset && (a->scale == NULL) == (b->scale == NULL);
}

static void cuda_matmul_glu(void *ctx, const di_weight *gate, const di_weight *up, const float *x,
                            int64_t n, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (!glu_pair_ok(gate, up)) {
        note(be, cudaErrorInvalidValue);
        return;
    }
    di_cuda_mm_params p = product_params(gate, be, x, n, y);
    p.glu_data = up->data;
    p.glu_scale = up->scale;
    note(be, di_cuda_launch_matmul(&p));
}

/* y += W x in the product's epilogue. */
static void cuda_matmul_add(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    di_cuda_mm_params p = product_params(w, be, x, n, y);
    p.accumulate = true;
    note(be, di_cuda_launch_matmul(&p));
}

static void cuda_matmul_t(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    di_cuda_mm_params p = mm_params(w, be);
    p.transposed = true;
    p.n_tokens = n;
    p.x = x;
    p.x_tstride = w->rows;
    p.y = y;
    p.y_tstride = w->cols;
    note(be, di_cuda_launch_matmul(&p));
}

/* Whether heads 1.. are head 0 shifted by a constant number of elements and stored rows
 * (the model's per-head views of kv_b_proj are); then one launch covers all heads. */
static bool heads_uniform(const di_head_matmul_params *hp, int64_t *elem_stride,
                          int64_t *row_stride) {
    const di_weight *w = hp->w;
    *elem_stride = *row_stride = 0;
    if (hp->n_heads == 1) return true;
    const size_t esz = di_dtype_bytes(w[0].dtype, 1);
    const ptrdiff_t d = (const char *)w[1].data - (const char *)w[0].data;
    if (d % (ptrdiff_t)esz) return false;
    *elem_stride = d / (ptrdiff_t)esz;
    *row_stride = w[1].row_offset - w[0].row_offset;
    for (int64_t h = 1; h < hp->n_heads; h++) {
        const di_weight *a = &w[0], *b = &w[h];
        if (b->dtype != a->dtype || b->rows != a->rows || b->cols != a->cols ||
            b->row_stride != a->row_stride || b->scale != a->scale ||
            b->scale_cols != a->scale_cols || b->block_rows != a->block_rows ||
            b->block_cols != a->block_cols ||
            (const char *)b->data != (const char *)a->data + h * *elem_stride * (int64_t)esz ||
            b->row_offset != a->row_offset + h * *row_stride)
            return false;
    }
    return true;
}

static void cuda_head_matmul(void *ctx, const di_head_matmul_params *hp) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (hp->n_heads <= 0) return;
    int64_t es, rs;
    const bool uniform = heads_uniform(hp, &es, &rs);
    const int64_t launches = uniform ? 1 : hp->n_heads;
    for (int64_t h = 0; h < launches; h++) {
        di_cuda_mm_params p = mm_params(&hp->w[h], be);
        p.transposed = hp->transposed;
        p.n_heads = uniform ? hp->n_heads : 1;
        p.head_elem_stride = es;
        p.head_row_offset_stride = rs;
        p.n_tokens = hp->n_tokens;
        p.x = hp->x + h * hp->x_hstride;
        p.x_hstride = hp->x_hstride;
        p.x_tstride = hp->x_tstride;
        p.y = hp->y + h * hp->y_hstride;
        p.y_hstride = hp->y_hstride;
        p.y_tstride = hp->y_tstride;
        note(be, di_cuda_launch_matmul(&p));
    }
}

static void cuda_embed(void *ctx, const di_weight *table, const int32_t *ids, int64_t n,
                       float *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    di_weight t = *table;
    if (t.block_rows <= 0) t.block_rows = 1;
    if (t.block_cols <= 0) t.block_cols = 1;
    note(be, di_cuda_launch_embed(&t, ids, n, out, be->stream));
}

static void cuda_rmsnorm(void *ctx, const float *x, int64_t x_stride, const float *w, int64_t n,
                         int64_t dim, float eps, float *y, int64_t y_stride) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_rmsnorm(x, x_stride, w, n, dim, eps, y, y_stride, be->stream));
}

static void cuda_rope(void *ctx, const di_rope_op_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_rope(p, be->stream));
}

static void cuda_argmax_rows(void *ctx, const float *x, int64_t n, int64_t V, int32_t *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_argmax(x, n, V, out, be->am_part, be->am_counters, be->stream));
}

static void cuda_sample_rows(void *ctx, const float *x, int64_t n, int64_t V,
                             const di_sample_row *rows, int32_t *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_sample_rows(x, n, V, rows, out, be->sample_clusters,
                                        be->sample_pair_rows, be->stream));
}

static void cuda_mla_store(void *ctx, const di_mla_store_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_mla_store(p, be->stream));
}

static void cuda_mla_attention(void *ctx, const di_mla_attn_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (p->kv_lora_rank > DI_CUDA_ATTN_MAX_R || p->rope_dim > DI_CUDA_ATTN_MAX_DR) {
        note(be, cudaErrorNotSupported);
        return;
    }
    di_cuda_attn_launch a;
    a.p = *p;
    a.partial = be->attn_partial;
    a.partial_floats = be->attn_partial_floats;
    a.counters = be->attn_counters;
    a.n_counters = DI_CUDA_ATTN_COUNTERS;
    a.heads_per_block = be->attn_heads;
    a.max_keys = be->max_ctx;
    a.n_sms = be->n_sms;
    a.stream = be->stream;
    /* The launcher splits where that gives a query more than one block (its blocks alone
     * cannot fill the device); the schedule does not change the result's bits. */
    a.split = be->attn_mode != DI_CUDA_ATTN_SEQUENTIAL;
    note(be, di_cuda_launch_mla_attention(&a));
}

static void cuda_silu_mul(void *ctx, const float *gate, const float *up, int64_t n, float *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_silu_mul(gate, up, n, out, be->stream));
}

static void cuda_axpy(void *ctx, float a, const float *x, int64_t n, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_axpy(a, x, n, y, be->stream));
}

static void cuda_copy2d(void *ctx, float *dst, int64_t dst_stride, const float *src,
                        int64_t src_stride, int64_t rows, int64_t cols) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (rows <= 0 || cols <= 0) return;
    note(be, cudaMemcpy2DAsync(dst, (size_t)dst_stride * sizeof(float), src,
                               (size_t)src_stride * sizeof(float), (size_t)cols * sizeof(float),
                               (size_t)rows, cudaMemcpyDeviceToDevice, be->stream));
}

static void cuda_copy_rows(void *ctx, float *dst, int64_t dst_stride, const int32_t *dst_rows,
                           const float *src, int64_t src_stride, const int32_t *src_rows, int64_t n,
                           int64_t cols) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_copy_rows(dst, dst_stride, dst_rows, src, src_stride, src_rows, n, cols,
                                      be->stream));
}

static void cuda_moe_combine(void *ctx, const float *rows, const int32_t *rows_of, const float *w,
                             int64_t n, int64_t K, int64_t dim, float *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_moe_combine(rows, rows_of, w, n, K, dim, out, NULL, NULL, be->stream));
}

static void cuda_moe_combine_add(void *ctx, const float *rows, const int32_t *rows_of,
                                 const float *w, int64_t n, int64_t K, int64_t dim,
                                 const float *add, float *resid) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_moe_combine(rows, rows_of, w, n, K, dim, NULL, add, resid, be->stream));
}

static void cuda_moe_combine_add_norm(void *ctx, const float *rows, const int32_t *rows_of,
                                      const float *w, int64_t n, int64_t K, int64_t dim,
                                      const float *add, float *resid, const float *norm_w,
                                      float eps, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_moe_combine_norm(rows, rows_of, w, n, K, dim, add, resid, norm_w, eps,
                                             y, be->tune.combine_norm_max_n, be->stream));
}

/* CUDA graphs: stream capture of the ops enqueued between graph_begin and graph_end.
 * Relaxed capture mode, so another thread's allocations (another context loading) do not
 * break it. A launch that fails while capturing ends in graph_end's error; the errors noted
 * during the capture are dropped with the capture (nothing ran), and the caller runs the
 * ops directly. */
static void cuda_graph_begin(void *ctx) {
    cuda_backend *be = (cuda_backend *)ctx;
    be->capture_saved_error = be->first_error;
    cudaError_t err = cudaStreamBeginCapture(be->main, cudaStreamCaptureModeRelaxed);
    be->capturing = err == cudaSuccess;
    if (!be->capturing) be->capture_error = err;
}

static di_status cuda_graph_end(void *ctx, void **out) {
    cuda_backend *be = (cuda_backend *)ctx;
    *out = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t err = be->capturing ? cudaStreamEndCapture(be->main, &graph) : be->capture_error;
    be->capturing = false;
    if (err == cudaSuccess && be->first_error != be->capture_saved_error) err = be->first_error;
    be->first_error = be->capture_saved_error;
    cudaGraphExec_t exec = NULL;
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError(); /* a failed capture leaves nothing for the next launch to report */
    if (err != cudaSuccess)
        return di_error(DI_ERR_INTERNAL, "cuda backend: graph capture: %s",
                        cudaGetErrorString(err));
    *out = exec;
    return DI_OK;
}

static void cuda_graph_launch(void *ctx, void *graph) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (be->time_graphs) note(be, cudaEventRecord(be->replay_start, be->main));
    note(be, cudaGraphLaunch((cudaGraphExec_t)graph, be->main));
    if (!be->time_graphs) return;
    float ms = 0.0f;
    note(be, cudaEventRecord(be->replay_end, be->main));
    if (cudaEventSynchronize(be->replay_end) == cudaSuccess &&
        cudaEventElapsedTime(&ms, be->replay_start, be->replay_end) == cudaSuccess) {
        be->replay_ms += ms;
        be->replays++;
    }
}

/* The second stream (backend.h): a fork and a join through events, which a capture records
 * as graph edges. Without a side stream (DI_CUDA_STREAMS=1) the ops stay in call order. */
static void cuda_side_begin(void *ctx) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (!be->side || be->stream == be->side) return;
    cudaError_t err = cudaEventRecord(be->forked, be->main);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(be->side, be->forked, 0);
    note(be, err);
    if (err != cudaSuccess) return; /* the ops stay on the main stream, in call order */
    be->stream = be->side;
    be->side_open = true;
    di_cuda_side_forks++;
}

static void cuda_side_end(void *ctx) {
    cuda_backend *be = (cuda_backend *)ctx;
    be->stream = be->main;
}

static void cuda_side_join(void *ctx) {
    cuda_backend *be = (cuda_backend *)ctx;
    be->stream = be->main;
    /* Nothing forked: no wait (inside a capture, a wait on an event recorded outside it
     * would break the capture). */
    if (!be->side_open) return;
    be->side_open = false;
    cudaError_t err = cudaEventRecord(be->joined, be->side);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(be->main, be->joined, 0);
    note(be, err);
}

static void cuda_graph_free(void *ctx, void *graph) {
    (void)ctx;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* Memory slots: the C helpers below, called with a di_backend made from the context. */
static di_backend wrap(void *ctx);

static void *cuda_buf_alloc(void *ctx, size_t bytes) {
    cuda_backend *be = (cuda_backend *)ctx;
    di_backend b = wrap(ctx);
    void *p = di_cuda_malloc(&b, bytes);
    if (!p) return NULL;
    cudaError_t err = cudaMemsetAsync(p, 0, bytes ? bytes : 1, be->main);
    if (err == cudaSuccess) err = cudaStreamSynchronize(be->main);
    if (err != cudaSuccess) {
        cudaFree(p);
        di_error(DI_ERR_INTERNAL, "cuda backend: zero-fill of %zu bytes: %s", bytes,
                 cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

/* A freed buffer's address may come back filled by other means than moe_route, and an
 * upload may refill the routing's: either ends route_settled. */
static void cuda_buf_free(void *ctx, void *p) {
    ((cuda_backend *)ctx)->route_settled = false;
    di_backend b = wrap(ctx);
    di_cuda_free(&b, p);
}

static di_status cuda_upload_op(void *ctx, void *dst, const void *src, size_t bytes) {
    ((cuda_backend *)ctx)->route_settled = false;
    di_backend b = wrap(ctx);
    return di_cuda_upload(&b, dst, src, bytes);
}

static void cuda_moe_route(void *ctx, const di_moe_route_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_moe_route(p, be->route_arrivals, be->stream));
    be->route_off = p->offsets;
    be->route_stream = be->stream;
    be->route_settled = false;
}

/* Is offsets the last moe_route's, on the stream ops go to now? */
static bool route_current(const cuda_backend *be, const int32_t *offsets) {
    return offsets == be->route_off && be->stream == be->route_stream;
}

/* A grouped product of the routing at offsets was launched on the current stream (err: how
 * the launch went; ran: whether the launcher had a kernel to run -- it returns success
 * without one for an empty shape): later ones of it there find it settled
 * (di_cuda_mm_params.routing_settled). */
static void route_used(cuda_backend *be, const int32_t *offsets, cudaError_t err, bool ran) {
    note(be, err);
    if (err == cudaSuccess && ran && route_current(be, offsets)) be->route_settled = true;
}

/* The parameters of the GEMV in grouped mode (cuda_internal.cuh): the common shape from
 * expert 0, the per-expert pointers from the table. */
static di_cuda_mm_params grouped_params(const di_expert_weights *ew, const cuda_backend *be,
                                        const int32_t *offsets, const int32_t *active,
                                        int64_t max_active, int64_t n_rows, const float *x,
                                        float *y) {
    di_cuda_mm_params p = mm_params(&ew->w[0], be);
    p.n_heads = max_active;
    p.n_tokens = n_rows;
    p.x = x;
    p.x_tstride = p.cols;
    p.y = y;
    p.y_tstride = p.rows;
    p.experts = (const di_cuda_expert_ptrs *)ew->table;
    /* Not batch-invariant: the SIMT GEMV while experts average one row each (it streams one
     * token's weights faster), the tensor cores once a weight serves more rows. */
    p.tc_min_n = be->invariant ? 1 : 2;
    p.g_off = offsets;
    p.g_active = active;
    p.routing_settled = be->route_settled && route_current(be, offsets);
    return p;
}

/* The FP4 GEMV's parameters for y = W x over n rows of x (an FP4 weight: cuda_matmul_fp4). */
static di_cuda_fp4_params fp4_params(const di_weight *w, const cuda_backend *be, const float *x,
                                     int64_t n, float *y) {
    di_cuda_fp4_params p;
    memset(&p, 0, sizeof p);
    p.rows = w->rows;
    p.cols = w->cols;
    p.row_bytes = w->row_stride / 2;
    p.data = (const uint8_t *)w->data;
    p.scale = w->scale_e8m0;
    p.scale_cols = w->scale_cols;
    p.block_cols = w->block_cols > 0 ? w->block_cols : 32;
    p.n_tokens = n;
    p.x = x;
    p.y = y;
    p.stream = be->stream;
    return p;
}

/* The FP4 GEMV in grouped mode (cuda_internal.cuh): the fields cuda_matmul_fp4 fills, from
 * expert 0 (the common shape), and the table's per-expert data and E8M0 pointers. */
static di_cuda_fp4_params grouped_fp4_params(const di_expert_weights *ew, const cuda_backend *be,
                                             const int32_t *offsets, const int32_t *active,
                                             int64_t max_active, int64_t n_rows, const float *x,
                                             float *y) {
    /* expert 0's data stands in for the launcher's alignment test */
    di_cuda_fp4_params p = fp4_params(&ew->w[0], be, x, n_rows, y);
    p.experts = (const di_cuda_expert_ptrs *)ew->table;
    p.g_off = offsets;
    p.g_active = active;
    p.max_active = max_active;
    return p;
}

/* One launch per projection over all active experts: the GEMV's grouped mode, or for FP4
 * experts (DeepSeek-V4's routed experts) the FP4 GEMV's, each row as matmul_fp4 computes it. */
static void cuda_matmul_experts(void *ctx, const di_expert_weights *ew, const int32_t *offsets,
                                const int32_t *active, int64_t max_active, int64_t n_rows,
                                const float *x, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (max_active <= 0 || n_rows <= 0) return;
    if (ew->w[0].dtype == DI_DTYPE_F4_E2M1) {
        di_cuda_fp4_params p =
            grouped_fp4_params(ew, be, offsets, active, max_active, n_rows, x, y);
        route_used(be, offsets, di_cuda_launch_matmul_fp4(&p), p.rows > 0 && p.cols > 0);
        return;
    }
    di_cuda_mm_params p = grouped_params(ew, be, offsets, active, max_active, n_rows, x, y);
    route_used(be, offsets, di_cuda_launch_matmul(&p), p.rows > 0 && p.cols > 0);
}

/* FP4 experts have no fused form: the call notes cudaErrorNotSupported (sync reports it) and
 * writes nothing. V4, whose routed experts are FP4, clamps its SwiGLU (v4_swiglu), which this
 * epilogue does not compute: its model runs two matmul_experts and v4_swiglu. */
static void cuda_matmul_experts_glu(void *ctx, const di_expert_weights *gate,
                                    const di_expert_weights *up, const int32_t *offsets,
                                    const int32_t *active, int64_t max_active, int64_t n_rows,
                                    const float *x, const int32_t *x_rows, float *x_scratch,
                                    float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (max_active <= 0 || n_rows <= 0) return;
    if (gate->w[0].dtype == DI_DTYPE_F4_E2M1 || up->w[0].dtype == DI_DTYPE_F4_E2M1) {
        note(be, cudaErrorNotSupported);
        return;
    }
    if (!glu_pair_ok(&gate->w[0], &up->w[0]) || gate->n_experts != up->n_experts) {
        note(be, cudaErrorInvalidValue);
        return;
    }
    di_cuda_mm_params p = grouped_params(gate, be, offsets, active, max_active, n_rows, x, y);
    p.glu_experts = (const di_cuda_expert_ptrs *)up->table;
    p.x_rows = x_rows;
    if (x_rows && !di_cuda_mm_reads_x_rows(&p)) { /* a kernel that reads gathered rows */
        note(be, di_cuda_launch_copy_rows(x_scratch, p.cols, NULL, x, p.cols, x_rows, n_rows,
                                          p.cols, be->stream));
        p.x = x_scratch;
        p.x_rows = NULL;
    }
    route_used(be, offsets, di_cuda_launch_matmul(&p), p.rows > 0 && p.cols > 0);
}

/* The device table of n experts' data / scale pointers (FP4: data / E8M0 bytes); every field
 * the kernels read from expert 0 must be the same for all, and so must the data's alignment
 * (the launchers choose 16-byte loads from expert 0's). */
static di_status cuda_expert_table(void *ctx, const di_weight *w, int64_t n, void **out) {
    *out = NULL;
    if (n <= 0) return di_error(DI_ERR_INVALID_ARG, "expert_table: n = %lld", (long long)n);
    di_cuda_expert_ptrs *h = (di_cuda_expert_ptrs *)malloc((size_t)n * sizeof *h);
    if (!h) return di_error(DI_ERR_OUT_OF_MEMORY, "expert_table: out of memory");
    for (int64_t e = 0; e < n; e++) {
        const di_weight *a = &w[0], *b = &w[e];
        if (b->dtype != a->dtype || b->rows != a->rows || b->cols != a->cols ||
            b->row_stride != a->row_stride || b->scale_cols != a->scale_cols ||
            b->block_rows != a->block_rows || b->block_cols != a->block_cols ||
            b->row_offset != a->row_offset || (b->scale == NULL) != (a->scale == NULL) ||
            (b->scale_e8m0 == NULL) != (a->scale_e8m0 == NULL) ||
            ((uintptr_t)b->data & 15u) != ((uintptr_t)a->data & 15u)) {
            free(h);
            return di_error(DI_ERR_INVALID_ARG,
                            "expert_table: expert %lld differs from expert 0 in shape, dtype or "
                            "alignment",
                            (long long)e);
        }
        if (b->dtype == DI_DTYPE_F4_E2M1 && !b->scale_e8m0) {
            free(h);
            return di_error(DI_ERR_INVALID_ARG, "expert_table: FP4 expert %lld has no E8M0 scales",
                            (long long)e);
        }
        h[e].data = b->data;
        h[e].scale = b->scale;
        h[e].scale_e8m0 = b->scale_e8m0;
    }
    const size_t bytes = (size_t)n * sizeof *h;
    void *d = cuda_buf_alloc(ctx, bytes);
    di_status st = d ? cuda_upload_op(ctx, d, h, bytes) : DI_ERR_OUT_OF_MEMORY;
    free(h);
    if (st) {
        if (d) cuda_buf_free(ctx, d);
        return di_error_prefix(st, "expert_table");
    }
    *out = d;
    return DI_OK;
}

static di_status cuda_download_op(void *ctx, void *dst, const void *src, size_t bytes) {
    di_backend b = wrap(ctx);
    return di_cuda_download(&b, dst, src, bytes);
}

static void cuda_fill_zero(void *ctx, void *p, size_t bytes) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (bytes) note(be, cudaMemsetAsync(p, 0, bytes, be->stream));
}

static di_status cuda_sync_op(void *ctx) {
    di_backend b = wrap(ctx);
    return di_backend_cuda_sync(&b);
}

static di_status cuda_weight_upload_op(void *ctx, const di_weight *w, di_weight *out) {
    di_backend b = wrap(ctx);
    return di_cuda_weight_upload(&b, w, out);
}

static void cuda_weight_free_op(void *ctx, di_weight *w) {
    di_backend b = wrap(ctx);
    di_cuda_weight_free(&b, w);
}

/* ---- DeepSeek-V4 ---------------------------------------------------------------------- */

static void cuda_matmul_fp4(void *ctx, const di_weight *w, const float *x, int64_t n, float *y) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (w->dtype != DI_DTYPE_F4_E2M1) { /* backend.h: other dtypes go to matmul */
        cuda_matmul(ctx, w, x, n, y);
        return;
    }
    const di_cuda_fp4_params p = fp4_params(w, be, x, n, y);
    note(be, di_cuda_launch_matmul_fp4(&p));
}

static void cuda_v4_hc_pre(void *ctx, const di_v4_hc_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (p->n_hc > 64) { /* the CPU's HC_MAX */
        note(be, cudaErrorNotSupported);
        return;
    }
    note(be, di_cuda_launch_v4_hc_pre(p, be->hc_mix, DI_CUDA_HC_MIX_FLOATS, be->stream));
}

static void cuda_v4_hc_post(void *ctx, int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                            const float *y, const float *post, const float *mix, float *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_v4_hc_post(n_tokens, n_hc, dim, x, y, post, mix, out, be->stream));
}

static void cuda_v4_attention(void *ctx, const di_v4_attn_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_v4_attention(p, be->stream));
}

static void cuda_v4_pool(void *ctx, const di_v4_pool_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_v4_pool(p, be->stream));
}

static void cuda_v4_index_scores(void *ctx, const di_v4_index_params *p) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_v4_index_scores(p, be->n_sms, be->stream));
}

static void cuda_v4_swiglu(void *ctx, const float *gate, const float *up, int64_t n, float limit,
                           float *out) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_v4_swiglu(gate, up, n, limit, out, be->stream));
}

static void cuda_free_ctx(void *ctx) {
    cuda_backend *be = (cuda_backend *)ctx;
    if (!be) return;
    cudaSetDevice(be->device);
    if (be->replays > 0)
        fprintf(stderr, "cuda backend: %lld graph replays, %.3f ms of device time each\n",
                (long long)be->replays, be->replay_ms / (double)be->replays);
    if (be->main) cudaStreamSynchronize(be->main);
    if (be->side) cudaStreamSynchronize(be->side);
    cudaFree(be->attn_partial);
    cudaFree(be->attn_counters);
    cudaFree(be->am_part);
    cudaFree(be->am_counters);
    cudaFree(be->route_arrivals);
    cudaFree(be->hc_mix);
    if (be->main) cudaStreamDestroy(be->main);
    if (be->side) cudaStreamDestroy(be->side);
    if (be->forked) cudaEventDestroy(be->forked);
    if (be->joined) cudaEventDestroy(be->joined);
    if (be->replay_start) cudaEventDestroy(be->replay_start);
    if (be->replay_end) cudaEventDestroy(be->replay_end);
    di_cuda_async_free(be->async);
    di_free(be);
}

/* ---- A step queued behind the running one (backend.h; cuda_async.cu) ------------------- */

static di_status async_error(const char *what, cudaError_t err) {
    return di_error(DI_ERR_INTERNAL, "cuda backend: %s: %s", what, cudaGetErrorString(err));
}

/* Transfers the staging cannot take are copied synchronously (correct, not overlapped). */
static di_status cuda_upload_async(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_backend *be = (cuda_backend *)ctx;
    be->route_settled = false; /* (as cuda_upload_op) */
    bool staged = false;
    const cudaError_t err = di_cuda_async_upload(be->async, be->main, dst, src, bytes, &staged);
    note(be, err); /* also reported by the step's fence: a caller may not look */
    if (err != cudaSuccess) return async_error("upload", err);
    return staged ? DI_OK : cuda_upload_op(ctx, dst, src, bytes);
}

static di_status cuda_download_async(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_backend *be = (cuda_backend *)ctx;
    bool staged = false;
    const cudaError_t err = di_cuda_async_download(be->async, be->main, dst, src, bytes, &staged);
    note(be, err);
    if (err != cudaSuccess) return async_error("download", err);
    return staged ? DI_OK : cuda_download_op(ctx, dst, src, bytes);
}

static int64_t cuda_fence(void *ctx) {
    cuda_backend *be = (cuda_backend *)ctx;
    /* the errors of the ops before the fence go with it */
    const int64_t ticket = di_cuda_async_fence(be->async, be->main, be->first_error);
    be->first_error = cudaSuccess;
    di_cuda_fences++;
    return ticket;
}

/* The first error of the ops enqueued before the ticket's fence (since the fence before it,
 * or a sync), or of the wait itself. */
static di_status cuda_fence_wait(void *ctx, int64_t ticket) {
    cuda_backend *be = (cuda_backend *)ctx;
    const cudaError_t err = di_cuda_async_wait(be->async, ticket);
    return err == cudaSuccess ? DI_OK : async_error("step", err);
}

static void cuda_resolve_ids(void *ctx, int32_t *ids, int64_t n, const int32_t *prev) {
    cuda_backend *be = (cuda_backend *)ctx;
    note(be, di_cuda_launch_resolve_ids(ids, n, prev, be->stream));
}

/* Filled by name, so that slots added to backend.h later start NULL here until this
 * backend implements them. */
static di_backend_ops make_ops(void) {
    di_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.matmul = cuda_matmul;
    o.matmul_t = cuda_matmul_t;
    o.head_matmul = cuda_head_matmul;
    o.embed = cuda_embed;
    o.rmsnorm = cuda_rmsnorm;
    o.rope = cuda_rope;
    o.mla_attention = cuda_mla_attention;
    o.silu_mul = cuda_silu_mul;
    o.axpy = cuda_axpy;
    o.copy2d = cuda_copy2d;
    o.free = cuda_free_ctx;
    o.host_memory = false;
    o.prefers_untransposed_heads = true; /* the tensor cores take W x only */
    o.mla_attention_rotates = true;      /* the queries' rope in the attention's loads */
    o.buf_alloc = cuda_buf_alloc;
    o.buf_free = cuda_buf_free;
    o.upload = cuda_upload_op;
    o.download = cuda_download_op;
    o.fill_zero = cuda_fill_zero;
    o.sync = cuda_sync_op;
    o.upload_async = cuda_upload_async;
    o.download_async = cuda_download_async;
    o.fence = cuda_fence;
    o.fence_wait = cuda_fence_wait;
    o.resolve_ids = cuda_resolve_ids;
    o.weight_upload = cuda_weight_upload_op;
    o.weight_free = cuda_weight_free_op;
    o.copy_rows = cuda_copy_rows;
    o.moe_combine = cuda_moe_combine;
    o.moe_combine_add = cuda_moe_combine_add;
    o.moe_combine_add_norm = cuda_moe_combine_add_norm;
    o.moe_route = cuda_moe_route;
    o.matmul_experts = cuda_matmul_experts;
    /* Fused SwiGLU products, bitwise the separate products and silu_mul. */
    o.matmul_glu = cuda_matmul_glu;
    o.matmul_experts_glu = cuda_matmul_experts_glu;
    o.matmul_add = cuda_matmul_add;
    o.mla_store = cuda_mla_store;
    o.argmax_rows = cuda_argmax_rows;
    o.sample_rows = NULL; /* g_cuda_ops_variants below */
    o.expert_table = cuda_expert_table;
    /* DI_CUDA_GRAPHS=0: no graphs (the model then enqueues every op of every step). */
    const char *graphs = getenv("DI_CUDA_GRAPHS");
    if (!graphs || strcmp(graphs, "0") != 0) {
        o.graph_begin = cuda_graph_begin;
        o.graph_end = cuda_graph_end;
        o.graph_launch = cuda_graph_launch;
        o.graph_free = cuda_graph_free;
    }
    o.matmul_fp4 = cuda_matmul_fp4;
    o.v4_hc_pre = cuda_v4_hc_pre;
    o.v4_hc_post = cuda_v4_hc_post;
    o.v4_attention = cuda_v4_attention;
    o.v4_pool = cuda_v4_pool;
    o.v4_index_scores = cuda_v4_index_scores;
    o.v4_swiglu = cuda_v4_swiglu;
    o.side_begin = cuda_side_begin;
    o.side_end = cuda_side_end;
    o.side_join = cuda_side_join;
    return o;
}

/* The same with sample_rows (the device draw: cuda_sample.cu): the default; a backend
 * created with DI_CUDA_SAMPLE=0 leaves it out, and such rows come down to the host sampler
 * (the same tokens: test_cuda_model compares the two). DI_CUDA_ATTN_ROPE=0: the runner
 * rotates the queries with the rope op, not the attention as it reads them (the same bits;
 * NOTES.md, twenty-fifth round). Index: sample + 2 * (not rotating). */
static di_backend_ops make_ops_variant(bool sample, bool rotates) {
    di_backend_ops o = make_ops();
    o.sample_rows = sample ? cuda_sample_rows : NULL;
    o.mla_attention_rotates = rotates;
    return o;
}
static const di_backend_ops g_cuda_ops_variants[4] = {
    make_ops_variant(false, true), make_ops_variant(true, true), make_ops_variant(false, false),
    make_ops_variant(true, false)};

static bool is_cuda_ops(const di_backend_ops *ops) {
    bool found = false;
    for (int i = 0; i < 4; i++)
        found = found || ops == &g_cuda_ops_variants[i];
    return found;
}

static di_backend wrap(void *ctx) {
    di_backend b;
    b.ops = &g_cuda_ops_variants[0]; /* for helpers that take a di_backend */
    b.ctx = ctx;
    return b;
}

/* ---------------------------------------------------------------------------------------- */
/* Creation                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Split-KV scratch: enough chunk states for a decode batch of DI_CUDA_ATTN_SPLIT_TOKENS
 * queries of 128 heads with R = 512 at max_ctx keys, at most 256 MiB. Larger calls take the
 * sequential schedule, which gives the same bits. */
#define DI_CUDA_ATTN_SPLIT_TOKENS 32
#define DI_CUDA_ATTN_SCRATCH_MAX  ((int64_t)256 << 20)

extern "C" di_status di_backend_cuda_init(di_backend *out, int device, int64_t max_ctx) {
    if (!out || max_ctx <= 0) return di_error(DI_ERR_INVALID_ARG, "cuda backend: bad arguments");
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return di_error(DI_ERR_UNSUPPORTED, "cuda backend: no CUDA device (%s)",
                        err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    }
    if (device < 0 || device >= count)
        return di_error(DI_ERR_INVALID_ARG, "cuda backend: device %d does not exist (%d found)",
                        device, count);
    cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        return di_error(DI_ERR_UNSUPPORTED, "cuda backend: device %d: %s", device,
                        cudaGetErrorString(err));
    if (prop.major < 9)
        return di_error(DI_ERR_UNSUPPORTED,
                        "cuda backend: %s has compute capability %d.%d; this build needs 9.0 "
                        "(Hopper) or newer",
                        prop.name, prop.major, prop.minor);

    cuda_backend *be = (cuda_backend *)di_calloc(1, sizeof *be);
    if (!be) return di_error(DI_ERR_OUT_OF_MEMORY, "cuda backend: out of memory");
    be->device = device;
    be->n_sms = prop.multiProcessorCount;
    be->max_ctx = max_ctx;
    /* Programmatic dependent launch where the device has it (compute capability 9.0+),
     * unless DI_CUDA_PDL=0. The results are the same either way. */
    const char *pdl = getenv("DI_CUDA_PDL");
    di_cuda_pdl = prop.major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
    snprintf(be->name, sizeof be->name, "%s", prop.name);
    /* Tuning knobs for benchmarks (DI_SIMD's counterpart): DI_CUDA_FP8_CONVERT=cvt|bits,
     * DI_CUDA_KSPLIT_MIN=<vectors>, DI_CUDA_FP8_PIPE=0|1. The defaults are what the
     * benchmarks chose. */
    const char *env = getenv("DI_CUDA_FP8_CONVERT");
    be->tune.fp8_bits = !(env && strcmp(env, "cvt") == 0);
    env = getenv("DI_CUDA_KSPLIT_MIN");
    be->tune.ksplit_min = env && atoll(env) > 0 ? atoll(env) : 256;
    env = getenv("DI_CUDA_FP8_PIPE");
    be->tune.fp8_pipe = !(env && strcmp(env, "0") == 0);
    env = getenv("DI_CUDA_SHORT_VEC"); /* 0: always 2 rows per group */
    be->tune.short_vec = env ? atoll(env) : 512;
    env = getenv("DI_CUDA_MAX_TB"); /* 1, 2, 4 or 8 */
    be->tune.max_tb = env && (atoi(env) == 1 || atoi(env) == 2 || atoi(env) == 4) ? atoi(env) : 8;
    /* DI_CUDA_TC=0: BF16 products on the SIMT GEMV instead of the tensor cores (both
     * batch-invariant; cuda_tc_gemv.cu); DI_CUDA_TC_TERMS=2|3: bf16 parts per activation,
     * 2 by default (16 of a float's 24 significant bits; 3: all of them). H200, 27-layer
     * V2-Lite model: 64 concurrent 4677 / 4688 -> 4832 / 4844 output tok/s (decode steps 12.3
     * -> 11.9 ms), batch 1 320.5 / 321.0 -> 329.8 / 329.5 (NOTES.md, twenty-first round). */
    env = getenv("DI_CUDA_TC");
    be->tune.tc = !(env && strcmp(env, "0") == 0);
    env = getenv("DI_CUDA_TC_TERMS");
    be->tune.tc_terms = env && atoi(env) == 3 ? 3 : 2;
    /* Weights of fewer rows (a router) keep the SIMT GEMV at every n: too few row tiles to
     * fill the device. kv_a (576 rows) is above the line since the fourteenth round: on the
     * H200 a 256-row prefill chunk's kv_a went 84 -> 25 us, decode steps were no slower. */
    env = getenv("DI_CUDA_TC_MIN_ROWS");
    be->tune.tc_min_rows = env ? atoll(env) : 512;
    /* Plain products of at least this many tokens take the wide tensor-core kernel (the
     * same sums as the GEMV: cuda_tc_wide.cu); 0: never. */
    env = getenv("DI_CUDA_TC_WIDE_MIN_N");
    be->tune.tc_wide_min_n = env ? atoll(env) : 9;
    /* Grouped expert products of at least this many tokens per active expert (a prefill)
     * too; 0: never (the GEMV's wider variants). H200, 4-layer model, a 256-row prefill
     * chunk: the routed experts 2915 -> 2158 us (NOTES.md, fourteenth round). */
    env = getenv("DI_CUDA_TC_WIDE_GROUPED");
    be->tune.tc_wide_grouped = env ? atoll(env) : 9;
    /* Blocks sharing a grouped wide product's weight tile, at most (1: one walks every token
     * chunk of its expert, as before the nineteenth round of NOTES.md). */
    env = getenv("DI_CUDA_TC_WIDE_X");
    be->tune.tc_wide_x = env && atoll(env) > 0 ? atoll(env) : 8;
    /* The wide kernel on wgmma (1, the default, kept where the device runs the build's sm_90a
     * code: di_cuda_tc_wide_setup asks) or on mma.sync (0); the same sums (cuda_tc_wide.cu). */
    env = getenv("DI_CUDA_TC_WGMMA");
    be->tune.tc_wgmma = !(env && strcmp(env, "0") == 0);
    env = getenv("DI_CUDA_TC_RT"); /* 1 or 2 (default); tc_kernel's grouped products only */
    be->tune.tc_rt = env && atoi(env) == 1 ? 1 : 2;
    /* A decode batch's grouped products with several K runs per warp (the same sums as one
     * run per warp): from DI_CUDA_TC_RUNS_MIN_N tokens per active expert (0: never), W warps
     * per tile, the fewest with W x the weight's 16-row tiles >= DI_CUDA_TC_RUNS_TARGET. H200,
     * 4-layer V2-Lite model, 64 sequences, tc_kernel: 256 2.28 ms per step, 128 2.38, 512
     * 2.27, off 2.30 (NOTES.md, fifteenth round); the streaming kernel: 512 2.01, 256 2.14,
     * 128 2.34, off 2.05 (sixteenth round). Measured with 8 K runs for every V2-Lite expert
     * weight; with the experts' default target below (4 for the down projection) each warp
     * takes one run of them at 64 sequences too. */
    env = getenv("DI_CUDA_TC_RUNS_MIN_N");
    be->tune.tc_runs_min_n = env ? atoll(env) : 2;
    env = getenv("DI_CUDA_TC_RUNS_TARGET");
    be->tune.tc_runs_target = env && atoll(env) > 0 ? atoll(env) : 512;
    env = getenv("DI_CUDA_TC_TARGET");
    be->tune.tc_target = env && atoll(env) > 0 ? atoll(env) : DI_CUDA_TC_TARGET;
    /* Expert weights' own target (0: DI_CUDA_TC_TARGET's): 512 by default, which gives
     * V2-Lite's gate / up 8 K runs and its down projection 4 (8 at 1024). H200, 27 layers:
     * 64 concurrent 5215.0 / 5209.5 -> 5301.2 / 5280.8 output tok/s (first tokens 75.3 / 73.8 ->
     * 70.2 / 71.4 ms, decode steps 11.27 / 11.31 -> 11.15 / 11.17 ms), batch-1 decode steps
     * 2.78 -> 2.72 ms, 8 concurrent 6.28 -> 6.15 ms, 256 concurrent 9095.3 -> 9472.9 output
     * tok/s (NOTES.md, twenty-third round). */
    env = getenv("DI_CUDA_TC_TARGET_EXPERTS");
    be->tune.tc_target_experts = env ? atoll(env) : DI_CUDA_TC_TARGET_EXPERTS;
    /* DI_CUDA_TC_XS=<KiB>: the GEMV splits its activations once per block where the parts
     * fit in that much shared memory (cuda_tc_gemv.cu); 32 by default (one or two tokens of
     * a plain product: measured there), 0: never. */
    env = getenv("DI_CUDA_TC_XS");
    be->tune.tc_xs = env ? atoi(env) : DI_CUDA_TC_XS;
    env = getenv("DI_CUDA_TC_FP8"); /* 1: FP8 weights on the tensor-core GEMV */
    be->tune.tc_fp8 = env && strcmp(env, "1") == 0;
    env = getenv("DI_CUDA_TC_LEAN"); /* 1: the short-chain GEMV for up to 8 tokens */
    be->tune.tc_lean = env && strcmp(env, "1") == 0;
    /* A decode batch's grouped BF16 products on the kernel that streams each warp's weights
     * through shared memory (cuda_tc_stream.cu); DI_CUDA_TC_STREAM=0: tc_kernel. H200,
     * 4-layer V2-Lite model: 64 sequences 2.28 -> 2.14 ms per step, 2.01 with a runs
     * target of 512; batch 1 unchanged (0.57 ms; NOTES.md, sixteenth round). */
    env = getenv("DI_CUDA_TC_STREAM");
    be->tune.tc_stream = !(env && strcmp(env, "0") == 0);
    /* DI_CUDA_TC_STREAM16=0: an expert of 9-16 rows in two passes of 8 through that kernel,
     * not one of 16 (NOTES.md, twenty-fourth round) */
    env = getenv("DI_CUDA_TC_STREAM16");
    be->tune.tc_stream16 = !(env && strcmp(env, "0") == 0);
    /* DI_CUDA_TC_EARLY=0: that kernel requests no weights before its PDL wait, even where the
     * routing is settled (NOTES.md, twenty-fourth round) */
    env = getenv("DI_CUDA_TC_EARLY");
    be->tune.tc_early = !(env && strcmp(env, "0") == 0);
    /* Plain BF16 products of up to 8 tokens on that kernel too, from 256 MiB of weights (the
     * lm_head); DI_CUDA_TC_STREAM_PLAIN=1: all, =0: none; DI_CUDA_TC_STREAM_PLAIN_MIB=<n>:
     * from n MiB (di_cuda_tuning.tc_stream_plain_bytes) */
    env = getenv("DI_CUDA_TC_STREAM_PLAIN_MIB");
    const long long mib = env ? atoll(env) : 256;
    be->tune.tc_stream_plain_bytes = (int64_t)(mib < 0 ? 0 : mib) << 20;
    env = getenv("DI_CUDA_TC_STREAM_PLAIN");
    be->tune.tc_stream_plain_all = env && strcmp(env, "1") == 0;
    if (env && strcmp(env, "0") == 0) be->tune.tc_stream_plain_bytes = INT64_MAX;
    /* DI_CUDA_COMBINE_NORM_MAX_N=<n>: moe_combine_add_norm as one kernel (a block per token)
     * for calls of up to n tokens; opt-in (default 0: two launches, as the benchmark of record
     * ran; 8 saved 0.5 % of a batch-1 step in one run: NOTES.md, twenty-fifth round) */
    env = getenv("DI_CUDA_COMBINE_NORM_MAX_N");
    be->tune.combine_norm_max_n = env ? atoll(env) : 0;
    /* DI_CUDA_SAMPLE_PAIRS=<rows>: the most rows of a sample_rows call drawn by two-block
     * clusters (64 by default; 0: none; calls of up to 16 rows take 8-block clusters) */
    env = getenv("DI_CUDA_SAMPLE_PAIRS");
    be->sample_pair_rows = env ? atoll(env) : 64;
    be->invariant = true;
    const int64_t chunks = (max_ctx + DI_CUDA_ATTN_CHUNK - 1) / DI_CUDA_ATTN_CHUNK;
    int64_t floats = DI_CUDA_ATTN_SPLIT_TOKENS * 128 * chunks * (DI_CUDA_ATTN_MAX_R + 2);
    if (floats * (int64_t)sizeof(float) > DI_CUDA_ATTN_SCRATCH_MAX)
        floats = DI_CUDA_ATTN_SCRATCH_MAX / (int64_t)sizeof(float);
    be->attn_partial_floats = floats;
    env = getenv("DI_CUDA_ATTN_HEADS"); /* 2, 4 or 8 heads per attention block (0: by shape) */
    be->attn_heads = env ? atoi(env) : 0;

    /* DI_CUDA_STREAMS=1: no side stream (side_begin .. side_join run in call order; the
     * results are the same bits, test_cuda_model compares them). */
    env = getenv("DI_CUDA_STREAMS");
    const bool two_streams = !(env && strcmp(env, "1") == 0);
    env = getenv("DI_CUDA_GRAPH_TIMING");
    be->time_graphs = env && strcmp(env, "1") == 0;
    bool wide_ok = false, wgmma_ok = false;
    if ((err = cudaSetDevice(device)) != cudaSuccess ||
        (err = cudaStreamCreateWithFlags(&be->main, cudaStreamNonBlocking)) != cudaSuccess ||
        (two_streams &&
         (err = cudaStreamCreateWithFlags(&be->side, cudaStreamNonBlocking)) != cudaSuccess) ||
        (err = cudaEventCreateWithFlags(&be->forked, cudaEventDisableTiming)) != cudaSuccess ||
        (err = cudaEventCreateWithFlags(&be->joined, cudaEventDisableTiming)) != cudaSuccess ||
        (be->time_graphs && ((err = cudaEventCreate(&be->replay_start)) != cudaSuccess ||
                             (err = cudaEventCreate(&be->replay_end)) != cudaSuccess)) ||
        (err = cudaMalloc((void **)&be->attn_partial, (size_t)floats * sizeof(float))) !=
            cudaSuccess ||
        (err = cudaMalloc((void **)&be->attn_counters, DI_CUDA_ATTN_COUNTERS * sizeof(int))) !=
            cudaSuccess ||
        (err = cudaMalloc((void **)&be->hc_mix, DI_CUDA_HC_MIX_FLOATS * sizeof(float))) !=
            cudaSuccess ||
        (err = cudaMalloc((void **)&be->am_part, DI_CUDA_AM_PARTS * sizeof(di_cuda_am_part))) !=
            cudaSuccess ||
        (err = cudaMalloc((void **)&be->am_counters, DI_CUDA_AM_ROWS * sizeof(int))) !=
            cudaSuccess ||
        (err = cudaMemsetAsync(be->am_counters, 0, DI_CUDA_AM_ROWS * sizeof(int), be->main)) !=
            cudaSuccess ||
        (err = cudaMalloc((void **)&be->route_arrivals, sizeof(int))) != cudaSuccess ||
        (err = cudaMemsetAsync(be->route_arrivals, 0, sizeof(int), be->main)) != cudaSuccess ||
        (err = cudaMemsetAsync(be->attn_counters, 0, DI_CUDA_ATTN_COUNTERS * sizeof(int),
                               be->main)) != cudaSuccess ||
        (err = di_cuda_attn_setup()) != cudaSuccess || (err = di_cuda_v4_setup()) != cudaSuccess ||
        (err = di_cuda_tc_wide_setup(&wide_ok, &wgmma_ok)) != cudaSuccess ||
        (err = di_cuda_tc_gemv_setup()) != cudaSuccess ||
        (err = di_cuda_tc_stream_setup()) != cudaSuccess ||
        (err = di_cuda_async_create(&be->async)) != cudaSuccess) {
        cuda_free_ctx(be);
        return di_error(DI_ERR_OUT_OF_MEMORY, "cuda backend: device %d: %s", device,
                        cudaGetErrorString(err));
    }
    be->stream = be->main;
    be->sample_clusters = di_cuda_sample_setup();
    if (!wide_ok) /* no clusters here: the GEMV for every n */
        be->tune.tc_wide_min_n = be->tune.tc_wide_grouped = 0;
    if (!wgmma_ok) /* the kernel the device loaded has no wgmma (not sm_90a code) */
        be->tune.tc_wgmma = 0;
    const char *sample = getenv("DI_CUDA_SAMPLE"), *rope = getenv("DI_CUDA_ATTN_ROPE");
    const bool draws = !(sample && strcmp(sample, "0") == 0);
    const bool rotates = !(rope && strcmp(rope, "0") == 0);
    out->ops = &g_cuda_ops_variants[(draws ? 1 : 0) + (rotates ? 0 : 2)];
    out->ctx = be;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Helpers (cuda_backend.h)                                                                   */
/* ---------------------------------------------------------------------------------------- */

extern "C" di_status di_backend_cuda_sync(const di_backend *dbe) {
    cuda_backend *be = ctx_of(dbe);
    cudaError_t err = be->side ? cudaStreamSynchronize(be->side) : cudaSuccess;
    const cudaError_t err_main = cudaStreamSynchronize(be->main);
    if (err == cudaSuccess) err = err_main;
    /* staged downloads are done now; a fence nobody waited for may hold an error */
    const cudaError_t parked = err == cudaSuccess ? di_cuda_async_synced(be->async) : err;
    cudaError_t first = be->first_error != cudaSuccess ? be->first_error : err;
    if (first == cudaSuccess) first = parked;
    be->first_error = cudaSuccess;
    if (first != cudaSuccess)
        return di_error(DI_ERR_INTERNAL, "cuda backend: %s", cudaGetErrorString(first));
    return DI_OK;
}

extern "C" void *di_backend_cuda_stream(const di_backend *dbe) {
    return (void *)ctx_of(dbe)->main;
}

extern "C" int64_t di_backend_cuda_sample_launches(void) {
    return di_cuda_sample_launches;
}

extern "C" int64_t di_backend_cuda_sample_cluster_launches(void) {
    return di_cuda_sample_cluster_launches;
}

extern "C" int64_t di_backend_cuda_side_forks(void) {
    return di_cuda_side_forks;
}

extern "C" int64_t di_backend_cuda_fences(void) {
    return di_cuda_fences;
}

extern "C" int64_t di_backend_cuda_lean_launches(void) {
    return di_cuda_lean_launches;
}

extern "C" int64_t di_backend_cuda_tc_fp8_launches(void) {
    return di_cuda_tc_fp8_launches;
}

extern "C" int64_t di_backend_cuda_tc_head_launches(void) {
    return di_cuda_tc_head_launches;
}

extern "C" int64_t di_backend_cuda_tc_runs_launches(void) {
    return di_cuda_tc_runs_launches;
}

extern "C" int64_t di_backend_cuda_tc_stream_launches(void) {
    return di_cuda_tc_stream_launches;
}

extern "C" int64_t di_backend_cuda_tc_stream16_passes(void) {
    return di_cuda_tc_stream16_passes();
}

extern "C" int64_t di_backend_cuda_tc_early_launches(void) {
    return di_cuda_tc_early_launches;
}

extern "C" int64_t di_backend_cuda_moe_combine_norm_launches(void) {
    return di_cuda_moe_combine_norm_launches;
}

extern "C" int64_t di_backend_cuda_tc_stream_plain_launches(void) {
    return di_cuda_tc_stream_plain_launches;
}

extern "C" int64_t di_backend_cuda_xs_launches(void) {
    return di_cuda_xs_launches;
}

extern "C" int64_t di_backend_cuda_wide_launches(bool grouped) {
    return di_cuda_wide_launches[grouped ? 1 : 0];
}

extern "C" int64_t di_backend_cuda_wgmma_launches(void) {
    return di_cuda_wgmma_launches;
}

extern "C" int64_t di_cuda_device_free_bytes(int device) {
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return (int64_t)free_b;
}

extern "C" void di_backend_cuda_set_batch_invariant(const di_backend *dbe, bool on) {
    if (dbe && is_cuda_ops(dbe->ops) && dbe->ctx) ctx_of(dbe)->invariant = on;
}

extern "C" void di_backend_cuda_set_attn_mode(const di_backend *dbe, di_cuda_attn_mode mode) {
    ctx_of(dbe)->attn_mode = mode;
}

extern "C" void di_backend_cuda_set_attn_heads(const di_backend *dbe, int heads_per_block) {
    ctx_of(dbe)->attn_heads = heads_per_block;
}

extern "C" di_status di_cuda_list_devices(di_device_info *out, int32_t cap, int32_t *n) {
    int count = 0;
    *n = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        return di_error(DI_ERR_UNSUPPORTED, "no CUDA device (%s)",
                        err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    }
    for (int d = 0; d < count && d < cap; d++) {
        cudaDeviceProp prop;
        if ((err = cudaGetDeviceProperties(&prop, d)) != cudaSuccess)
            return di_error(DI_ERR_INTERNAL, "cuda device %d: %s", d, cudaGetErrorString(err));
        memset(&out[d], 0, sizeof out[d]);
        snprintf(out[d].name, sizeof out[d].name, "%s", prop.name);
        out[d].memory_bytes = (int64_t)prop.totalGlobalMem;
        out[d].cc_major = prop.major;
        out[d].cc_minor = prop.minor;
    }
    *n = count;
    return DI_OK;
}

extern "C" const char *di_backend_cuda_device_name(const di_backend *dbe) {
    return dbe && dbe->ctx ? ctx_of(dbe)->name : "";
}

extern "C" void *di_cuda_malloc(const di_backend *dbe, size_t bytes) {
    void *p = NULL;
    cudaSetDevice(ctx_of(dbe)->device);
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        di_error(DI_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate %zu bytes: %s", bytes,
                 cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

extern "C" void di_cuda_free(const di_backend *dbe, void *p) {
    (void)dbe;
    if (p) cudaFree(p);
}

static di_status copy_sync(const di_backend *dbe, void *dst, const void *src, size_t bytes,
                           cudaMemcpyKind kind) {
    cuda_backend *be = ctx_of(dbe);
    if (bytes == 0) return DI_OK;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, be->main);
    if (err == cudaSuccess) err = cudaStreamSynchronize(be->main);
    if (err != cudaSuccess)
        return di_error(DI_ERR_INTERNAL, "cuda backend: copy of %zu bytes: %s", bytes,
                        cudaGetErrorString(err));
    return DI_OK;
}

extern "C" di_status di_cuda_upload(const di_backend *be, void *dst, const void *src, size_t n) {
    return copy_sync(be, dst, src, n, cudaMemcpyHostToDevice);
}

extern "C" di_status di_cuda_download(const di_backend *be, void *dst, const void *src, size_t n) {
    return copy_sync(be, dst, src, n, cudaMemcpyDeviceToHost);
}

/* FP4 e2m1 (two per byte): rows padded to 16 bytes like the others (row_stride counts
 * elements, so it becomes twice the padded byte count); the E8M0 scale bytes of the rows,
 * [rows][scale_cols], copied as they are. */
static di_status upload_fp4(const di_backend *dbe, const di_weight *w, di_weight *out) {
    if (w->rows <= 0 || w->cols <= 0)
        return di_error(DI_ERR_INVALID_ARG, "cuda backend: empty weight [%lld][%lld]",
                        (long long)w->rows, (long long)w->cols);
    if (w->row_stride % 2 || w->row_stride < w->cols || !w->scale_e8m0 || w->block_cols <= 0 ||
        w->scale_cols < (w->cols + w->block_cols - 1) / w->block_cols)
        return di_error(DI_ERR_INVALID_ARG,
                        "cuda backend: FP4 weight [%lld][%lld]: row_stride %lld must be even "
                        "and >= cols, with E8M0 scales covering block_cols %lld",
                        (long long)w->rows, (long long)w->cols, (long long)w->row_stride,
                        (long long)w->block_cols);
    const int64_t row_bytes = (w->cols + 1) / 2, stride_bytes = (row_bytes + 15) / 16 * 16;
    const size_t bytes = (size_t)(w->rows * stride_bytes);
    const size_t sbytes = (size_t)(w->rows * w->scale_cols);
    di_weight d = *w;
    d.row_stride = 2 * stride_bytes;
    d.row_offset = 0;
    void *data = di_cuda_malloc(dbe, bytes);
    if (!data) return di_error_prefix(DI_ERR_OUT_OF_MEMORY, "weight upload");
    uint8_t *scale = (uint8_t *)di_cuda_malloc(dbe, sbytes);
    if (!scale) {
        cudaFree(data);
        return di_error_prefix(DI_ERR_OUT_OF_MEMORY, "weight upload");
    }
    cuda_backend *be = ctx_of(dbe);
    cudaError_t err = cudaMemsetAsync(data, 0, bytes, be->main);
    if (err == cudaSuccess)
        err =
            cudaMemcpy2DAsync(data, (size_t)stride_bytes, w->data, (size_t)(w->row_stride / 2),
                              (size_t)row_bytes, (size_t)w->rows, cudaMemcpyHostToDevice, be->main);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(scale, w->scale_e8m0, sbytes, cudaMemcpyHostToDevice, be->main);
    if (err == cudaSuccess) err = cudaStreamSynchronize(be->main);
    if (err != cudaSuccess) {
        cudaFree(data);
        cudaFree(scale);
        return di_error(DI_ERR_INTERNAL, "cuda backend: weight upload [%lld][%lld]: %s",
                        (long long)w->rows, (long long)w->cols, cudaGetErrorString(err));
    }
    d.data = data;
    d.scale_e8m0 = scale;
    *out = d;
    return DI_OK;
}

extern "C" di_status di_cuda_weight_upload(const di_backend *dbe, const di_weight *w,
                                           di_weight *out) {
    if (w->dtype == DI_DTYPE_F4_E2M1) return upload_fp4(dbe, w, out);
    const size_t esz = di_dtype_bytes(w->dtype, 1);
    if (w->dtype != DI_DTYPE_F32 && w->dtype != DI_DTYPE_F16 && w->dtype != DI_DTYPE_BF16 &&
        w->dtype != DI_DTYPE_F8_E4M3)
        return di_error(DI_ERR_UNSUPPORTED, "cuda backend: weights of dtype %s",
                        di_dtype_name(w->dtype));
    if (w->rows <= 0 || w->cols <= 0)
        return di_error(DI_ERR_INVALID_ARG, "cuda backend: empty weight [%lld][%lld]",
                        (long long)w->rows, (long long)w->cols);
    /* Rows padded to 16 bytes (zero-filled) so that every row starts aligned. */
    const int64_t stride = (int64_t)(((size_t)w->cols * esz + 15) / 16 * 16 / esz);
    const size_t bytes = (size_t)(w->rows * stride) * esz;
    di_weight d = *w;
    d.row_stride = stride;
    d.data = NULL;
    d.scale = NULL;
    void *data = di_cuda_malloc(dbe, bytes);
    if (!data) return di_error_prefix(DI_ERR_OUT_OF_MEMORY, "weight upload");
    cuda_backend *be = ctx_of(dbe);
    cudaError_t err = cudaMemsetAsync(data, 0, bytes, be->main);
    if (err == cudaSuccess)
        err = cudaMemcpy2DAsync(data, (size_t)stride * esz, w->data, (size_t)w->row_stride * esz,
                                (size_t)w->cols * esz, (size_t)w->rows, cudaMemcpyHostToDevice,
                                be->main);
    float *scale = NULL;
    if (err == cudaSuccess && w->dtype == DI_DTYPE_F8_E4M3) {
        /* The scale block rows this view touches; row_offset rebased to the first. */
        const int64_t br = w->block_rows, sr0 = w->row_offset / br;
        const int64_t sr1 = (w->row_offset + w->rows - 1) / br;
        const size_t sbytes = (size_t)((sr1 - sr0 + 1) * w->scale_cols) * sizeof(float);
        scale = (float *)di_cuda_malloc(dbe, sbytes);
        if (!scale)
            err = cudaErrorMemoryAllocation;
        else
            err = cudaMemcpyAsync(scale, w->scale + sr0 * w->scale_cols, sbytes,
                                  cudaMemcpyHostToDevice, be->main);
        d.row_offset = w->row_offset - sr0 * br;
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(be->main);
    if (err != cudaSuccess) {
        cudaFree(data);
        cudaFree(scale);
        return di_error(DI_ERR_INTERNAL, "cuda backend: weight upload [%lld][%lld]: %s",
                        (long long)w->rows, (long long)w->cols, cudaGetErrorString(err));
    }
    d.data = data;
    d.scale = scale;
    *out = d;
    return DI_OK;
}

extern "C" void di_cuda_weight_free(const di_backend *dbe, di_weight *w) {
    (void)dbe;
    if (!w) return;
    cudaFree((void *)w->data);
    cudaFree((void *)w->scale);
    cudaFree((void *)w->scale_e8m0);
    w->data = NULL;
    w->scale = NULL;
    w->scale_e8m0 = NULL;
}

float di_cuda_time_runs(cudaStream_t s, int reps, void (*run)(void *ctx, cudaStream_t s, int i),
                        void *ctx) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        for (int i = 0; i < 3; i++) /* warm-up */
            run(ctx, s, i);
        cudaEventRecord(e0, s);
        for (int i = 0; i < reps; i++)
            run(ctx, s, i);
        cudaEventRecord(e1, s);
        if (cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            ms = 0.0f;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaGetLastError();
    return ms > 0.0f ? ms : 0.0f;
}

/* Device-to-device copies of a buffer, back and forth (di_cuda_time_runs). */
struct copy_runs {
    void *a, *b;
    size_t bytes;
};

static void copy_run(void *ctx, cudaStream_t s, int i) {
    const copy_runs *c = (const copy_runs *)ctx;
    cudaMemcpyAsync(i % 2 ? c->a : c->b, i % 2 ? c->b : c->a, c->bytes, cudaMemcpyDeviceToDevice,
                    s);
}

extern "C" double di_cuda_measure_copy_bandwidth(const di_backend *dbe, size_t bytes) {
    cuda_backend *be = ctx_of(dbe);
    copy_runs c = {NULL, NULL, bytes};
    double bw = 0.0;
    if (cudaMalloc(&c.a, bytes) == cudaSuccess && cudaMalloc(&c.b, bytes) == cudaSuccess &&
        cudaMemsetAsync(c.a, 1, bytes, be->main) == cudaSuccess) {
        const int reps = 20;
        const float ms = di_cuda_time_runs(be->main, reps, copy_run, &c);
        if (ms > 0.0f) bw = 2.0 * (double)bytes * reps / (ms * 1e-3);
    }
    cudaFree(c.a);
    cudaFree(c.b);
    cudaGetLastError();
    return bw;
}
