/*
 * v4_state.c -- DeepSeek-V4 window slots and paged entry pool (see v4_state.h).
 *
 * Each object is two allocations carved in order: the bookkeeping (slots, layers) in host
 * memory and the rows in one block of backend memory (host memory without a backend), so
 * that a failed init leaves nothing behind and the accounting is exact.
 */
#include "kv/v4_state.h"

#include <string.h>

enum { KIND_SLIDING = 0, KIND_CSA = 1, KIND_HCA = 2 };

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

static void *carve(char **p, size_t bytes) {
    void *r = *p;
    *p += align64(bytes);
    return r;
}

/* Zero-filled rows of `bytes` in be's memory (host memory when be is NULL). */
static void *rows_alloc(const di_backend *be, size_t bytes) {
    if (be) return be->ops->buf_alloc(be->ctx, bytes ? bytes : 64);
    void *p = di_aligned_alloc(bytes ? bytes : 64);
    if (p) memset(p, 0, bytes ? bytes : 64);
    return p;
}

/* A store's two allocations: zeroed bookkeeping of meta bytes in host memory and rows of
 * `rows` bytes in be's memory. False (nothing held) when either fails. */
static bool store_alloc(const di_backend *be, size_t meta, size_t rows, void **mem_out,
                        void **rows_out) {
    void *mem = di_aligned_alloc(meta);
    void *r = mem ? rows_alloc(be, rows) : NULL;
    if (!r) {
        di_aligned_free(mem);
        *mem_out = *rows_out = NULL;
        return false;
    }
    memset(mem, 0, meta);
    *mem_out = mem;
    *rows_out = r;
    return true;
}

static void rows_free(const di_backend *be, void *p) {
    if (!p) return;
    if (be)
        be->ops->buf_free(be->ctx, p);
    else
        di_aligned_free(p);
}

/* ---------------------------------------------------------------------------------------- */
/* Window slots                                                                               */
/* ---------------------------------------------------------------------------------------- */

static size_t comp_bytes(int64_t m, int64_t cw) {
    return 2 * align64((size_t)(2 * m * cw) * sizeof(float));
}

static size_t slot_layer_bytes(int kind, int64_t m, int64_t W, int64_t d, int64_t dI) {
    size_t b = align64((size_t)(W * d) * sizeof(float));
    if (kind != KIND_SLIDING) b += comp_bytes(m, kind == KIND_CSA ? 2 * d : d);
    if (kind == KIND_CSA) b += comp_bytes(m, 2 * dI);
    return b;
}

static di_v4_comp_state comp_carve(char **p, int64_t m, int64_t width, bool overlap) {
    di_v4_comp_state cs = {
        .m = m, .width = width, .cw = overlap ? 2 * width : width, .overlap = overlap};
    cs.c = carve(p, (size_t)(2 * m * cs.cw) * sizeof(float));
    cs.z = carve(p, (size_t)(2 * m * cs.cw) * sizeof(float));
    return cs;
}

di_status di_v4_slots_init(di_v4_slots *s, const di_backend *be, int64_t n_slots,
                           int64_t n_layers, const uint8_t *kinds, const int64_t *rates,
                           int64_t window, int64_t dim, int64_t index_dim) {
    memset(s, 0, sizeof *s);
    size_t per_slot = 0;
    for (int64_t il = 0; il < n_layers; il++)
        per_slot += slot_layer_bytes(kinds[il], rates[il], window, dim, index_dim);
    const size_t meta = align64((size_t)n_slots * sizeof(di_v4_slot)) +
                        (size_t)n_slots * align64((size_t)n_layers * sizeof(di_v4_slot_layer));
    const size_t rows = (size_t)n_slots * per_slot;
    if (!store_alloc(be, meta, rows, &s->mem, &s->rows))
        return di_error(DI_ERR_OUT_OF_MEMORY,
                        "V4 state: cannot allocate %zu bytes of window state (%lld slots)",
                        meta + rows, (long long)n_slots);
    s->be = be;
    s->bytes = meta + rows;
    s->rows_bytes = rows;
    s->n_slots = n_slots;
    s->n_layers = n_layers;
    s->window = window;
    char *p = s->mem, *r = s->rows;
    s->slot = carve(&p, (size_t)n_slots * sizeof(di_v4_slot));
    for (int64_t i = 0; i < n_slots; i++) {
        di_v4_slot *sl = &s->slot[i];
        sl->layers = carve(&p, (size_t)n_layers * sizeof(di_v4_slot_layer));
        for (int64_t il = 0; il < n_layers; il++) {
            di_v4_slot_layer *L = &sl->layers[il];
            L->ring = carve(&r, (size_t)(window * dim) * sizeof(float));
            if (kinds[il] != KIND_SLIDING)
                L->comp = comp_carve(&r, rates[il], dim, kinds[il] == KIND_CSA);
            if (kinds[il] == KIND_CSA) L->icomp = comp_carve(&r, rates[il], index_dim, true);
        }
    }
    return DI_OK;
}

void di_v4_slots_free(di_v4_slots *s) {
    if (!s) return;
    rows_free(s->be, s->rows);
    di_aligned_free(s->mem);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------------------------------- */
/* Paged entries                                                                              */
/* ---------------------------------------------------------------------------------------- */

di_status di_v4_pool_init(di_v4_pool *p, const di_backend *be, int64_t n_layers,
                          const uint8_t *kinds, const int64_t *rates, int64_t dim,
                          int64_t index_dim, int64_t n_blocks, int64_t block_size) {
    memset(p, 0, sizeof *p);
    if (n_blocks <= 0 || block_size <= 0)
        return di_error(DI_ERR_INVALID_ARG,
                        "V4 state: n_blocks %lld and block_size %lld must be "
                        "positive",
                        (long long)n_blocks, (long long)block_size);
    const size_t meta = align64((size_t)n_layers * sizeof(di_v4_pool_layer));
    size_t total = 0;
    for (int64_t il = 0; il < n_layers; il++) {
        if (kinds[il] == KIND_SLIDING) continue;
        if (rates[il] <= 0 || block_size % rates[il] != 0)
            return di_error(DI_ERR_INVALID_ARG,
                            "V4 state: block_size %lld is not a multiple of layer %lld's "
                            "compress rate %lld",
                            (long long)block_size, (long long)il, (long long)rates[il]);
        int64_t rows = n_blocks * (block_size / rates[il]);
        total += align64((size_t)(rows * dim) * sizeof(float));
        if (kinds[il] == KIND_CSA) total += align64((size_t)(rows * index_dim) * sizeof(float));
    }
    if (!store_alloc(be, meta, total, &p->mem, &p->rows))
        return di_error(DI_ERR_OUT_OF_MEMORY,
                        "V4 state: cannot allocate %zu bytes of compressed rows (%lld blocks)",
                        meta + total, (long long)n_blocks);
    p->be = be;
    p->bytes = meta + total;
    p->rows_bytes = total;
    p->n_layers = n_layers;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->dim = dim;
    p->index_dim = index_dim;
    char *q = p->mem, *r = p->rows;
    p->layers = carve(&q, (size_t)n_layers * sizeof(di_v4_pool_layer));
    for (int64_t il = 0; il < n_layers; il++) {
        di_v4_pool_layer *L = &p->layers[il];
        if (kinds[il] == KIND_SLIDING) continue;
        L->m = rates[il];
        L->per_block = block_size / rates[il];
        L->entries = carve(&r, (size_t)(n_blocks * L->per_block * dim) * sizeof(float));
        if (kinds[il] == KIND_CSA)
            L->ientries = carve(&r, (size_t)(n_blocks * L->per_block * index_dim) * sizeof(float));
    }
    return DI_OK;
}

void di_v4_pool_free(di_v4_pool *p) {
    if (!p) return;
    rows_free(p->be, p->rows);
    di_aligned_free(p->mem);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------------------------------- */
/* Accounting                                                                                 */
/* ---------------------------------------------------------------------------------------- */

int64_t di_v4_state_fixed_bytes(int kind, int64_t m, int64_t window, int64_t dim,
                                int64_t index_dim) {
    int64_t b = window * dim * (int64_t)sizeof(float);
    if (kind == KIND_CSA) b += 2 * 2 * m * (2 * dim + 2 * index_dim) * (int64_t)sizeof(float);
    if (kind == KIND_HCA) b += 2 * 2 * m * dim * (int64_t)sizeof(float);
    return b;
}

double di_v4_state_bytes_per_token(int kind, int64_t m, int64_t dim, int64_t index_dim) {
    if (kind == KIND_SLIDING || m <= 0) return 0.0;
    double row = (double)dim + (kind == KIND_CSA ? (double)index_dim : 0.0);
    return row * (double)sizeof(float) / (double)m;
}
