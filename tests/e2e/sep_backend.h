/*
 * sep_backend.h -- a "separate memory" backend for tests without a GPU: the CPU backend with
 * host_memory = false, whose buffers come from its own allocator, whose upload / download
 * are copies (counted) and whose weight_upload copies every weight (data, scales, E8M0
 * bytes). The ops are the CPU ones, so the arithmetic is the CPU path's; what differs is the
 * data movement a runner does for a device backend, which these tests check. It also has
 * the second-stream ops (backend.h side_begin / side_end / side_join) as counted no-ops, so
 * the V2/V3 runner calls them as it does on a GPU, which must not change the CPU path's
 * bits. And the ops of a step queued behind another (upload_async .. resolve_ids): the ops
 * run at once here, but a download_async's bytes reach their destination only at fence_wait
 * (or sync), so a caller that reads them before sees what was there.
 */
#ifndef DI_TEST_SEP_BACKEND_H
#define DI_TEST_SEP_BACKEND_H

#include "backend/backend.h"
#include "core/core.h"
#include "deepinfer.h"
#include "test.h"

#include <string.h>

static di_backend_ops g_ops;
static int64_t g_n_up, g_n_down, g_n_bufs, g_n_side, g_n_fences, g_n_resolved;

#define SEP_MAX_PENDING 16
typedef struct {
    void *dst, *bytes;
    size_t n;
    int64_t ticket;
} sep_pending;
static sep_pending g_pend[SEP_MAX_PENDING]; /* downloads waiting for their fence */
static int g_n_pend;

/* One stream here: the ops run in call order anyway. */
static void sep_side_begin(void *ctx) {
    (void)ctx;
    g_n_side++;
}
static void sep_side_nop(void *ctx) {
    (void)ctx;
}

static void *sep_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = di_aligned_alloc(bytes ? bytes : 64);
    if (!p) {
        di_error(DI_ERR_OUT_OF_MEMORY, "separate memory: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 64);
    g_n_bufs++;
    return p;
}

static void sep_free(void *ctx, void *p) {
    (void)ctx;
    if (p) g_n_bufs--;
    di_aligned_free(p);
}

static di_status sep_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
    g_n_up++;
    return DI_OK;
}

static di_status sep_download(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
    g_n_down++;
    return DI_OK;
}

static void *dup_bytes(const void *p, size_t n) {
    void *q = di_aligned_alloc(n ? n : 64);
    if (q && n) memcpy(q, p, n);
    return q;
}

static di_status sep_download_async(void *ctx, void *dst, const void *src, size_t bytes) {
    if (g_n_pend == SEP_MAX_PENDING) return sep_download(ctx, dst, src, bytes);
    void *copy = dup_bytes(src, bytes);
    if (!copy) return di_error(DI_ERR_OUT_OF_MEMORY, "separate memory: download");
    g_pend[g_n_pend++] = (sep_pending){dst, copy, bytes, g_n_fences + 1};
    g_n_down++;
    return DI_OK;
}

static int64_t sep_fence(void *ctx) {
    (void)ctx;
    return ++g_n_fences;
}

/* Hands over the downloads of tickets <= ticket (INT64_MAX: all). */
static void sep_hand_over(int64_t ticket) {
    int kept = 0;
    for (int i = 0; i < g_n_pend; i++) {
        if (g_pend[i].ticket <= ticket) {
            memcpy(g_pend[i].dst, g_pend[i].bytes, g_pend[i].n);
            di_aligned_free(g_pend[i].bytes);
        } else {
            g_pend[kept++] = g_pend[i];
        }
    }
    g_n_pend = kept;
}

static di_status sep_fence_wait(void *ctx, int64_t ticket) {
    (void)ctx;
    sep_hand_over(ticket);
    return ticket > 0 && ticket <= g_n_fences
               ? DI_OK
               : di_error(DI_ERR_INVALID_ARG, "separate memory: no fence %lld", (long long)ticket);
}

/* Every op has run: hands over every download still waiting. */
static di_status sep_sync(void *ctx) {
    (void)ctx;
    sep_hand_over(INT64_MAX);
    return DI_OK;
}

static void sep_resolve_ids(void *ctx, int32_t *ids, int64_t n, const int32_t *prev) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0) {
            const int32_t t = prev[-1 - (int64_t)ids[i]];
            ids[i] = t < 0 ? 0 : t;
            g_n_resolved++;
        }
}

/* A copy of the view: its rows (data points at the view's first row), the FP8 scales up to
 * its last row (looked up through row_offset) and its E8M0 bytes. */
static di_status sep_weight_upload(void *ctx, const di_weight *w, di_weight *out) {
    (void)ctx;
    *out = *w;
    const size_t rows = (size_t)w->rows;
    const size_t data = di_dtype_bytes(w->dtype, (w->rows - 1) * w->row_stride + w->cols);
    out->data = dup_bytes(w->data, data);
    if (w->scale) {
        int64_t srows = (w->row_offset + w->rows + w->block_rows - 1) / w->block_rows;
        out->scale = dup_bytes(w->scale, (size_t)(srows * w->scale_cols) * sizeof(float));
    }
    if (w->scale_e8m0) out->scale_e8m0 = dup_bytes(w->scale_e8m0, rows * (size_t)w->scale_cols);
    return out->data ? DI_OK : di_error(DI_ERR_OUT_OF_MEMORY, "separate memory: weight");
}

static void sep_weight_free(void *ctx, di_weight *w) {
    (void)ctx;
    di_aligned_free((void *)w->data);
    di_aligned_free((void *)w->scale);
    di_aligned_free((void *)w->scale_e8m0);
}

/* The CPU backend over pool with the memory slots above. */
static void sep_init(di_backend *be, di_pool *pool, int64_t max_ctx) {
    CHECK(di_backend_cpu_init(be, pool, max_ctx) == DI_OK);
    g_ops = *be->ops;
    g_ops.name = "separate-memory";
    g_ops.host_memory = false;
    g_ops.buf_alloc = sep_alloc;
    g_ops.buf_free = sep_free;
    g_ops.upload = sep_upload;
    g_ops.download = sep_download;
    g_ops.weight_upload = sep_weight_upload;
    g_ops.weight_free = sep_weight_free;
    g_ops.side_begin = sep_side_begin;
    g_ops.side_end = sep_side_nop;
    g_ops.side_join = sep_side_nop;
    g_ops.sync = sep_sync;
    g_ops.upload_async = sep_upload;
    g_ops.download_async = sep_download_async;
    g_ops.fence = sep_fence;
    g_ops.fence_wait = sep_fence_wait;
    g_ops.resolve_ids = sep_resolve_ids;
    be->ops = &g_ops;
}

/* The model in dir on the CPU with 2 threads (NULL, and a failed check, if it does not load). */
static di_model *sep_model_load(const char *dir) {
    di_model_params mp = di_model_default_params();
    mp.n_threads = 2;
    di_model *m = NULL;
    CHECK_MSG(di_model_load(dir, &mp, &m) == DI_OK, "%s: %s", dir, di_last_error());
    return m;
}

#endif /* DI_TEST_SEP_BACKEND_H */
